"""A test process's own PostgreSQL test database and Redis database: two test runs on one
machine (two checkouts, or one checkout twice) and the xdist workers of one run share neither.

- The test database is named for the checkout and the run, `test_<name>_<checkout>_<pid>`
  with the pid of the pytest that started the run; pytest-django adds `_gw0`, `_gw1`, ... for
  xdist's workers, and drops each at the end. A run that was killed cannot: the next run of
  the same checkout drops the databases of its runs whose pid is no process any more.
- The migrations run once for a schema, into its template, `test_<name>_<schema>_template`,
  where `<schema>` is a digest of what a migrated database is made from (the migrations, the
  code they import, the pinned dependencies, Python's version): the first process of any run
  to need a test database of that schema builds it (Django's own test database, migrated),
  under a lock that the others wait for, and each copies it (`CREATE DATABASE ... TEMPLATE`,
  a fraction of a second, where migrating takes 10-20 s of a core). Runs of the same code (a
  check run again, CI's runs of one commit) find it built. A run's controller drops, at its
  end, the templates of other schemas that no run has copied for an hour; a template whose
  build did not finish is built again.
- A Redis database is claimed, never assumed: `SET tallybook:test-redis-db:<n> <owner> NX EX`
  in database 0, for the URL's own database first (when it names one), then 1 to 15. It is
  emptied when claimed and when released, the claim renewed before each test and released at
  the end; it lapses by itself when a run dies.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
# This checkout on this machine: the pids in its databases' names are this machine's.
CHECKOUT = hashlib.sha256(f"{socket.gethostname()}:{ROOT}".encode()).hexdigest()[:8]
# One value for a whole run: set by the pytest that starts it, inherited by its xdist workers.
RUN = os.environ.setdefault("TALLYBOOK_TEST_RUN", f"{CHECKOUT}_{os.getpid()}")
# A test database of this checkout's, with the pid of its run, and what was added after it
# (pytest-django's `_gwN`, a test's own `_dbos`; before templates were kept, `_template`).
OURS = re.compile(rf"test_.*_{CHECKOUT}_(\d+)(_\w+)?")
TEMPLATE = "_template"
# The template that this process's test database of each alias was copied from.
COPIED_FROM: dict[str, str] = {}
# The comment on a template that its migrations ran to the end, followed by when a run last
# copied it (seconds since the epoch): one without it (its builder died or failed) is built
# again.
MIGRATED = "tallybook: migrated"
# A template of another schema that no run copied for this long is dropped: longer than any
# run (the run that copied it may still read it: tests/test_replica.py dumps it).
UNUSED_FOR_S = 60 * 60


def _schema() -> str:
    """A digest of what a migrated test database is made from: every Python file of the
    project's apps (their migrations, and what the migrations import: the roles' groups,
    the settings), the pinned dependencies (Django's own apps' migrations) and Python's
    version. Any change to them builds a template of its own."""
    digest = hashlib.sha256(repr(sys.version_info[:2]).encode())
    for path in sorted(
        [*ROOT.glob("durability/**/*.py"), *ROOT.glob("trajectories/**/*.py")],
    ) + [ROOT / "constraints.txt", ROOT / "pyproject.toml"]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


SCHEMA = _schema()
KEPT = re.compile(rf"test_.*_([0-9a-f]{{12}}){TEMPLATE}")

CLAIM = "tallybook:test-redis-db:{}"
DATABASES = range(1, 16)  # Redis's default 16 databases; 0 holds the claims
# Longer than any one test may run (its timeout); a dead run's databases are free after this.
CLAIM_TTL_S = 30 * 60
_RENEW = """if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('expire', KEYS[1], ARGV[2]) end return 0"""
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1]) end return 0"""


def own_test_database(name: str) -> str:
    """This run's test database for the database `name`, within PostgreSQL's 63 bytes with
    room for pytest-django's `_gwN` and for `_template`."""
    return f"test_{name}"[: 63 - len(RUN) - 1 - len(TEMPLATE)] + f"_{RUN}"


def template_database(name: str) -> str:
    """The template for the database `name` of this code's schema: migrated once, copied by
    each process of each run of this code."""
    suffix = f"_{SCHEMA}{TEMPLATE}"
    return f"test_{name}"[: 63 - len(suffix)] + suffix


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def admin(
    database: Mapping[str, Any], dbname: str = "postgres"
) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection to the `postgres` database (or `dbname`) of the server of
    `database` (a Django DATABASES entry), to create and drop databases."""
    return psycopg.connect(
        dbname=dbname,
        user=database["USER"],
        password=database["PASSWORD"] or None,
        host=database["HOST"],
        port=database["PORT"] or 5432,
        autocommit=True,
    )


def _drop(server: psycopg.Connection[tuple[Any, ...]], name: str) -> None:
    server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _lock_key(template: str) -> int:
    return int.from_bytes(hashlib.sha256(template.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def template_lock(
    database: Mapping[str, Any], template: str
) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """Hold the lock on the template `template` on the server of `database` (a Django
    DATABASES entry); the admin connection that holds it. One process at a time builds the
    template, copies it or reads it (CREATE DATABASE ... TEMPLATE fails while another
    session is connected to the template). A session-level advisory lock: PostgreSQL
    releases it with the connection, if its process dies."""
    key = _lock_key(template)
    with admin(database) as server:
        server.execute("SELECT pg_advisory_lock(%s)", [key])
        try:
            yield server
        finally:
            server.execute("SELECT pg_advisory_unlock(%s)", [key])


def _migrated(server: psycopg.Connection[tuple[Any, ...]], template: str) -> bool:
    row = server.execute(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
        [template],
    ).fetchone()
    return row is not None and (row[0] or "").startswith(MIGRATED)


def template_built(database: Mapping[str, Any]) -> bool:
    """Whether the template of this code's schema for `database` (a Django DATABASES entry)
    is built: an earlier run of the same code built it."""
    with admin(database) as server:
        return _migrated(server, template_database(database["NAME"]))


def _mark_used(server: psycopg.Connection[tuple[Any, ...]], template: str) -> None:
    """Say on the template that its migrations ran to the end, and that it is copied now."""
    comment = sql.SQL("COMMENT ON DATABASE {} IS {}")
    mark = f"{MIGRATED} {int(time.time())}"
    server.execute(comment.format(sql.Identifier(template), sql.Literal(mark)))


def _build_template(
    connection: Any,
    create_test_db: Callable[..., str],
    server: psycopg.Connection[tuple[Any, ...]],
    template: str,
    verbosity: int,
) -> None:
    """Build the template `template` of `connection`'s database with Django's own
    `create_test_db` (migrate, createcachetable), holding its lock, unless it is built; leave
    `connection` closed and its settings as they were."""
    from django.conf import settings

    if _migrated(server, template):
        return
    settings_dict = connection.settings_dict
    name, test = settings_dict["NAME"], settings_dict["TEST"]
    test_name = test.get("NAME")
    test["NAME"] = template
    try:
        create_test_db(verbosity=verbosity, autoclobber=True, keepdb=False)
    finally:
        test["NAME"] = test_name
        connection.close()  # no connection is left to the template
        connection.close_pool()
        settings.DATABASES[connection.alias]["NAME"] = settings_dict["NAME"] = name
    _mark_used(server, template)


def create_from_template(
    connection: Any, create_test_db: Callable[..., str], verbosity: int = 1, **_: Any
) -> str:
    """`connection`'s test database, a copy of this code's template, which this builds first
    if no process of any run has; the database's name. In place of
    `connection.creation.create_test_db`, which Django's setup_databases calls: like it, it
    drops a test database of the same name first, and leaves `connection` and the settings
    on the test database."""
    from django.conf import settings

    test_name = connection.creation._get_test_db_name()
    template = COPIED_FROM[connection.alias] = template_database(connection.settings_dict["NAME"])
    with template_lock(connection.settings_dict, template) as server:
        _build_template(connection, create_test_db, server, template, verbosity)
        _drop(server, test_name)
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        server.execute(create.format(sql.Identifier(test_name), sql.Identifier(template)))
        _mark_used(server, template)
        # A commit need not wait for its WAL to reach the disk (~4 ms each here, with fsync
        # on): a test database outlives no crash of the server. Every session on it takes
        # this, the processes the tests start too; what a commit makes visible, and when,
        # is unchanged. (A copy does not inherit its template's settings: set on each.)
        no_wait = sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
        server.execute(no_wait.format(sql.Identifier(test_name)))
    settings.DATABASES[connection.alias]["NAME"] = connection.settings_dict["NAME"] = test_name
    connection.ensure_connection()
    return test_name


def build_templates() -> None:
    """Build this code's templates, unless a process of a run has: what its controller
    starts in a process of its own (`python -c`) as the run starts, while its xdist workers
    start and collect the tests, which then find them built (or wait for them)."""
    import django

    django.setup()
    from django.db import connections

    for connection in connections.all():
        if connection.vendor == "postgresql" and not connection.settings_dict["TEST"]["MIRROR"]:
            template = template_database(connection.settings_dict["NAME"])
            with template_lock(connection.settings_dict, template) as server:
                create_test_db = connection.creation.create_test_db
                _build_template(connection, create_test_db, server, template, 0)


@contextlib.contextmanager
def from_templates() -> Iterator[None]:
    """Within it, Django's setup_databases creates each PostgreSQL test database as a copy
    of this code's template (`create_from_template`); SQLite's as Django does."""
    from django.db import connections

    with contextlib.ExitStack() as patched:
        for connection in connections.all(initialized_only=False):
            if connection.vendor == "postgresql":
                creation = connection.creation
                own = functools.partial(create_from_template, connection, creation.create_test_db)
                patched.enter_context(mock.patch.object(creation, "create_test_db", own))
        yield


def drop_unused_templates(database: Mapping[str, Any], keep: str = SCHEMA) -> list[str]:
    """Drop the templates on the server of `database` of schemas other than `keep` (this
    code's) that no run copied for UNUSED_FOR_S, or whose build never finished and that no
    process builds now; their names."""
    now = time.time()
    with admin(database) as server:
        rows = server.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database"
        ).fetchall()
    dropped = []
    for name, comment in rows:
        if not (kept := KEPT.fullmatch(name)) or kept[1] == keep:
            continue
        marked = (comment or "").removeprefix(MIGRATED).strip()
        used = float(marked) if (comment or "").startswith(MIGRATED) and marked.isdigit() else 0
        if now - used < UNUSED_FOR_S:
            continue
        key = _lock_key(name)
        with admin(database) as server:
            # Not while a process builds it or copies it (a build that died holds no lock).
            if server.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone() == (True,):
                _drop(server, name)
                dropped.append(name)
    return dropped


def drop_dead_runs_databases(database: Mapping[str, Any]) -> list[str]:
    """Drop this checkout's test databases on the server of `database` whose run's pid is no
    longer a process here; the names dropped.

    Another checkout's databases, and a live run's, are left alone.
    """
    with admin(database) as server:
        names = [row[0] for row in server.execute("SELECT datname FROM pg_database")]
        dead = [n for n in names if (ours := OURS.fullmatch(n)) and not _alive(int(ours[1]))]
        for name in dead:
            _drop(server, name)
    return dead


class RedisClaim:
    """One database of the Redis server at `url`, this process's alone until released."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        named = int(parts.path.strip("/") or 0)
        self.claims = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
        self.owner = f"{socket.gethostname()} pid {os.getpid()} in {ROOT}"
        for db in dict.fromkeys([named, *DATABASES]):
            key = CLAIM.format(db)
            if db in DATABASES and self.claims.set(key, self.owner, nx=True, ex=CLAIM_TTL_S):
                break
        else:
            raise RuntimeError(f"Every Redis database 1-15 at {url} is claimed by a test run")
        self.key = key
        self.url = urlunsplit(parts._replace(path=f"/{db}"))
        self._empty()  # of whatever a run that died left there

    def _empty(self) -> None:
        with redis.Redis.from_url(self.url) as mine:
            mine.flushdb()

    def renew(self) -> None:
        if not self.claims.eval(_RENEW, 1, self.key, self.owner, CLAIM_TTL_S):
            raise RuntimeError(f"The claim on {self.url} lapsed: another run may be using it")

    def release(self) -> None:
        self._empty()
        self.claims.eval(_RELEASE, 1, self.key, self.owner)
        self.claims.close()
