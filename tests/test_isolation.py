"""A test run drops the test databases that this checkout's killed runs left, and no others;
its test databases are copies of its template, migrated once, which it drops at its end."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_a_run_drops_its_templates_at_its_end_and_nothing_else(create):
    # A run of this checkout's that is not this one (whose template the tests copy).
    run = f"{isolation.CHECKOUT}_{os.getpid()}0"
    template = create(f"test_iso_{run}_template")
    workers = create(f"test_iso_{run}_gw0")
    longer_pid = create(f"test_iso_{run}1_template")

    dropped = isolation.drop_runs_templates(settings.DATABASES["default"], run)

    assert dropped == [template]
    left = _databases()
    assert template not in left and {workers, longer_pid} <= left


def test_each_test_database_is_a_copy_of_the_runs_migrated_template(db):
    database = connection.settings_dict
    template = isolation.COPIED_FROM[connection.alias]
    assert template.endswith(f"_{isolation.RUN}{isolation.TEMPLATE}")
    assert database["NAME"].startswith(template.removesuffix(isolation.TEMPLATE))
    assert isolation.OURS.fullmatch(template), "a dead run's template is dropped"
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
    assert row == (isolation.MIGRATED,)
    assert ours == theirs and ("durability", "0001_initial") in ours
