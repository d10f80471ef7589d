"""Read-only pages from a real streaming replica; every ledger decision from the primary.

A private primary and a hot standby streaming from it (benchmarks/clusters.py, run by the
`postgres` user), and granian with DATABASE_URL on the primary and DATABASE_REPLICA_URL on
the standby. The standby's replay is paused while the agent records intents: the pages do
not see them yet (they read the standby), the API's decisions do (the primary), and a
browser that has just written reads from the primary.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connections

from benchmarks.clusters import Postgres, pg_bin
from durability import replica
from tests import isolation
from tests.sdk.support import ROOT, ServerProcess, wait_until

PASSWORD = "replica-reads-correct-horse"
SETUP = f"""
from django.contrib.auth import get_user_model
from durability.accounts.members import apikey_create
from durability.models import Membership, Project, Role
project = Project.objects.create(name="replicated")
user = get_user_model().objects.create_user("olive", password="{PASSWORD}")
Membership.objects.create(project=project, user=user, role=Role.OPERATOR)
print(apikey_create(project=project, actor="system:test", name="agent")[1])
"""


def _admin(cluster: Postgres) -> str:
    return f"postgres://postgres@127.0.0.1:{cluster.port}/tallybook"


def _caught_up(primary: Postgres, standby: Postgres) -> bool:
    with psycopg.connect(_admin(primary)) as p, psycopg.connect(_admin(standby)) as s:
        sent = p.execute("SELECT pg_current_wal_lsn()").fetchone()
        replayed = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", sent).fetchone()
        return bool(replayed and replayed[0])


def _replay(standby: Postgres, *, paused: bool) -> None:
    with psycopg.connect(_admin(standby), autocommit=True) as s:
        s.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")

    def _state() -> bool:
        with psycopg.connect(_admin(standby)) as s:
            row = s.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
            return row is not None and (row[0] == "paused") == paused

    wait_until(_state, 30, "the standby's replay to change")


def _migrate(primary: Postgres) -> None:
    """Migrate the primary's database: a copy of this code's test template, migrated once
    for its runs (tests/isolation.py), pg_dump'ed (in a fraction of a second, where migrating
    takes 10 s)."""
    database = connections["default"].settings_dict
    template = isolation.COPIED_FROM["default"]
    # --no-owner: the private cluster has no role of the test database's owner.
    dump = [pg_bin("pg_dump"), "--no-owner", "--no-privileges", "-h", database["HOST"]]
    dump += ["-p", str(database["PORT"] or 5432), "-U", database["USER"], "-d", template]
    env = {**os.environ, "PGPASSWORD": database["PASSWORD"] or ""}
    with isolation.template_lock(database, template):  # no worker copies it meanwhile
        schema = subprocess.run(dump, env=env, check=True, capture_output=True).stdout
    restore = [pg_bin("psql"), "-q", "-X", "-v", "ON_ERROR_STOP=1", "-d", primary.url]
    subprocess.run(restore, input=schema, check=True, stdout=subprocess.DEVNULL)


@pytest.fixture
def clusters(django_db_setup: None) -> Iterator[tuple[Postgres, Postgres, str]]:
    """The primary (migrated: a project, an operator and an API key) and its standby."""
    # Not pytest's tmp_path: the postgres user must be able to reach the folder.
    folder = Path(tempfile.mkdtemp(prefix="tallybook-replica-"))
    os.chmod(folder, 0o755)
    primary = Postgres(folder / "primary")
    primary.start()
    standby: Postgres | None = None
    try:
        primary.create_database()
        _migrate(primary)
        env = {**os.environ, "DATABASE_URL": primary.url}
        env.pop("DATABASE_REPLICA_URL", None)
        manage = [sys.executable, str(ROOT / "manage.py")]
        made = subprocess.run(
            [*manage, "shell", "-c", SETUP],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        raw_key = made.stdout.strip().splitlines()[-1]
        standby = Postgres(folder / "standby", replica_of=primary)
        standby.start()
        wait_until(lambda: _caught_up(primary, standby), 60, "the standby to catch up")
        yield primary, standby, raw_key
    finally:
        if standby is not None:
            standby.stop("immediate")
        primary.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


class Browser:
    """An operator's browser: its own cookies, logged in."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        form = self.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token is not None
        login = {"csrfmiddlewaretoken": token[1], "username": "olive", "password": PASSWORD}
        with self.opener.open(
            urllib.request.Request(
                f"{base}/login/", data=urllib.parse.urlencode(login).encode(), method="POST"
            ),
            timeout=30,
        ) as answer:
            assert "/login/" not in answer.url, "the operator is logged in"

    def get(self, path: str) -> str:
        with self.opener.open(f"{self.base}{path}", timeout=30) as page:
            assert page.status == 200
            return str(page.read().decode())


def _intent(server: ServerProcess, raw_key: str, key: str) -> tuple[int, dict[str, Any]]:
    body = {"key": key, "kind": "payment", "target": "stripe", "request": {"order": 1}}
    request = urllib.request.Request(
        f"{server.url}/api/v1/intents",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


SEARCH = "/search/?q="


def _link(decision: dict[str, Any]) -> str:
    """The effect's link on a page (a search for its key echoes the key in the box)."""
    return f'href="{urllib.parse.urlsplit(decision["effect"]["url"]).path}"'


def _server(primary: Postgres, standby: Postgres, pin_seconds: int) -> ServerProcess:
    server = ServerProcess(primary.url)
    server.env["DATABASE_REPLICA_URL"] = standby.url
    server.env["TALLYBOOK_REPLICA_PIN_SECONDS"] = str(pin_seconds)
    server.start()
    return server


def test_pages_read_the_replica_while_the_ledger_decides_on_the_primary(clusters):
    """Two servers on one pair of clusters (they take a while to make): one that pins no
    browser to the primary, then one that pins for an hour."""
    primary, standby, raw_key = clusters
    server = _server(primary, standby, pin_seconds=0)
    try:
        operator = Browser(server.url)
        assert "refund:replica-1" not in operator.get("/effects/")
        _replay(standby, paused=True)
        try:
            first = _intent(server, raw_key, "refund:replica-1")[1]
            assert first["decision"] == "proceed"
            link = _link(first)
            # The agent asks again: the primary holds the pending effect, so it must wait.
            status, again = _intent(server, raw_key, "refund:replica-1")
            assert (status, again["decision"]) == (200, "wait")
            # The pages read the standby, whose replay is paused: not there yet.
            assert "refund:replica-1" not in operator.get("/effects/")
            assert link not in operator.get(SEARCH + "refund:replica-1")
        finally:
            _replay(standby, paused=False)
        wait_until(
            lambda: "refund:replica-1" in operator.get("/effects/"), 30, "the page to show it"
        )
        wait_until(
            lambda: link in operator.get(SEARCH + "refund:replica-1"), 30, "the search to find it"
        )
    finally:
        server.close()

    # A browser that has just written reads from the primary.
    server = _server(primary, standby, pin_seconds=3600)
    try:
        _replay(standby, paused=True)
        try:
            second = _intent(server, raw_key, "refund:replica-2")[1]
            assert second["decision"] == "proceed"
            # Logging in is a write: this browser reads from the primary from now on.
            operator = Browser(server.url)
            assert replica.PIN_COOKIE in {cookie.name for cookie in operator.jar}
            assert "refund:replica-2" in operator.get("/effects/")
            assert _link(second) in operator.get(SEARCH + "refund:replica-2")
        finally:
            _replay(standby, paused=False)
    finally:
        server.close()


def test_the_router_keeps_access_and_transactions_on_the_primary():
    from django.contrib.auth import get_user_model

    from durability.models import ApiKey, Effect, Membership

    router = replica.PrimaryOrReplica()
    assert router.db_for_read(Effect) is None, "outside a page request: the primary"
    with replica.reads_from_replica():
        assert router.db_for_read(Effect) == replica.REPLICA
        for model in (get_user_model(), Membership, ApiKey):
            assert router.db_for_read(model) is None, model
    assert router.db_for_write(Effect) == "default"
    assert router.allow_migrate(replica.REPLICA, "durability") is False


@pytest.mark.django_db(transaction=True)
def test_reads_inside_a_transaction_stay_on_the_primary():
    from django.db import transaction

    from durability.models import Effect

    router = replica.PrimaryOrReplica()
    with replica.reads_from_replica(), transaction.atomic():
        assert router.db_for_read(Effect) is None


def test_without_a_replica_url_there_is_no_replica_and_the_middleware_steps_aside(settings):
    from django.core.exceptions import MiddlewareNotUsed

    assert replica.REPLICA not in settings.DATABASES
    with pytest.raises(MiddlewareNotUsed):
        replica.ReplicaReads(lambda request: None)
