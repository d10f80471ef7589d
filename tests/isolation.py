"""A test process's own PostgreSQL test database and Redis database: two test runs on one
machine (two checkouts, or one checkout twice) and the xdist workers of one run share neither.

- The test database is named for the checkout and the run, `test_<name>_<checkout>_<pid>`
  with the pid of the pytest that started the run; pytest-django adds `_gw0`, `_gw1`, ... for
  xdist's workers, and drops each at the end. A run that was killed cannot: the next run of
  the same checkout drops the databases of its runs whose pid is no process any more.
- A Redis database is claimed, never assumed: `SET tallybook:test-redis-db:<n> <owner> NX EX`
  in database 0, for the URL's own database first (when it names one), then 1 to 15. It is
  emptied when claimed and when released, the claim renewed before each test and released at
  the end; it lapses by itself when a run dies.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
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
# (pytest-django's `_gwN`, a test's own `_dbos`).
OURS = re.compile(rf"test_.*_{CHECKOUT}_(\d+)(_\w+)?")

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
    room for pytest-django's `_gwN`."""
    return f"test_{name}"[: 63 - len(RUN) - 7] + f"_{RUN}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def admin(database: Mapping[str, Any]) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection to the `postgres` database of the server of `database` (a
    Django DATABASES entry), to create and drop databases."""
    return psycopg.connect(
        dbname="postgres",
        user=database["USER"],
        password=database["PASSWORD"] or None,
        host=database["HOST"],
        port=database["PORT"] or 5432,
        autocommit=True,
    )


def drop_dead_runs_databases(database: Mapping[str, Any]) -> list[str]:
    """Drop this checkout's test databases on the server of `database` whose run's pid is no
    longer a process here; the names dropped.

    Another checkout's databases, and a live run's, are left alone.
    """
    with admin(database) as server:
        names = [row[0] for row in server.execute("SELECT datname FROM pg_database")]
        dead = [n for n in names if (ours := OURS.fullmatch(n)) and not _alive(int(ours[1]))]
        for name in dead:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            server.execute(drop)
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
