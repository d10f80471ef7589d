"""A test run drops the test databases that this checkout's killed runs left, and no others."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
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
    running = create(f"test_iso_{isolation.CHECKOUT}_{os.getpid()}_gw0")
    elsewhere = create(f"test_iso_{other_checkout}_{dead}_gw0")

    dropped = isolation.drop_dead_runs_databases(settings.DATABASES["default"])

    assert killed in dropped and {running, elsewhere}.isdisjoint(dropped)
    with isolation.admin(settings.DATABASES["default"]) as server:
        left = {row[0] for row in server.execute("SELECT datname FROM pg_database")}
    assert killed not in left and {running, elsewhere} <= left
