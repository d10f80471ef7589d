"""A test run drops the test databases that this checkout's killed runs left, and no others;
its test databases are copies of its code's template, migrated once for all runs of the same
code; the templates of other code are dropped once no run used them for an hour."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
from django.db import connection
from psycopg import sql

from tests import isolation


@pytest.fixture
def create() -> Iterator[Callable[[str], str]]:
    """CREATE DATABASE; whatever became of them, the databases are dropped after the test."""
    made: list[str] = []

    def create(name: str) -> str:
        made.append(name)
        with isolation.admin(settings.DATABASES["default"]) as server:
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    yield create
    with isolation.admin(settings.DATABASES["default"]) as server:
        for name in made:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            server.execute(drop)


def test_only_this_checkouts_databases_of_runs_that_died_are_dropped(create):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(ended.stdout)
    other_checkout = format(int(isolation.CHECKOUT, 16) ^ 1, "08x")
    killed = create(f"test_iso_{isolation.CHECKOUT}_{dead}_gw0")
    killed_template = create(f"test_iso_{isolation.CHECKOUT}_{dead}_template")
    running = create(f"test_iso_{isolation.CHECKOUT}_{os.getpid()}_gw0")
    elsewhere = create(f"test_iso_{other_checkout}_{dead}_gw0")

    dropped = isolation.drop_dead_runs_databases(settings.DATABASES["default"])

    assert {killed, killed_template} <= set(dropped)
    assert {running, elsewhere}.isdisjoint(dropped)
    left = _databases()
    assert {killed, killed_template}.isdisjoint(left) and {running, elsewhere} <= left


def _databases() -> set[str]:
    with isolation.admin(settings.DATABASES["default"]) as server:
        return {row[0] for row in server.execute("SELECT datname FROM pg_database")}


def _comment(name: str, text: str) -> None:
    with isolation.admin(settings.DATABASES["default"]) as server:
        comment = sql.SQL("COMMENT ON DATABASE {} IS {}")
        server.execute(comment.format(sql.Identifier(name), sql.Literal(text)))


def test_a_run_drops_the_templates_of_other_code_unused_for_an_hour_and_nothing_else(create):
    now = int(time.time())
    other = format(int(isolation.SCHEMA, 16) ^ 1, "012x")
    ours = create(f"test_iso_{isolation.SCHEMA}_template")  # this code's, never dropped
    _comment(ours, isolation.MIGRATED)
    stale = create(f"test_iso_{other}_template")
    _comment(stale, f"{isolation.MIGRATED} {now - isolation.UNUSED_FOR_S - 1}")
    recent = create(f"test_iso_r_{other}_template")
    _comment(recent, f"{isolation.MIGRATED} {now - 60}")
    died = create(f"test_iso_d_{other}_template")  # its builder died: never marked
    building = create(f"test_iso_b_{other}_template")  # a run builds it now
    database = create(f"test_iso_{other}_gw0")

    with isolation.template_lock(settings.DATABASES["default"], building):
        dropped = isolation.drop_unused_templates(settings.DATABASES["default"])

    # (Real templates of other code that no run used for an hour may go too: not this test's.)
    assert sorted(name for name in dropped if name.startswith("test_iso_")) == sorted([stale, died])
    left = _databases()
    assert {stale, died}.isdisjoint(left) and {ours, recent, building, database} <= left


def test_each_test_database_is_a_copy_of_the_runs_migrated_template(db):
    database = connection.settings_dict
    template = isolation.COPIED_FROM[connection.alias]
    assert template.endswith(f"_{isolation.SCHEMA}{isolation.TEMPLATE}")
    assert isolation.KEPT.fullmatch(template)
    assert isolation.RUN in database["NAME"], "the copy is the run's own"
    with connection.cursor() as cursor:
        cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
        ours = cursor.fetchall()
    with isolation.template_lock(database, template) as server:  # no worker copies it now
        row = server.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [template],
        ).fetchone()
        with isolation.admin(database, template) as copied:
            applied = copied.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
            theirs = applied.fetchall()
    assert row is not None and re.fullmatch(rf"{isolation.MIGRATED} \d+", row[0])
    assert ours == theirs and ("durability", "0001_initial") in ours
