"""What a block of code costs in PostgreSQL: its statements, as Django ran them, and its
round trips, as libpq sent them.

Round trips are read from libpq's own trace of the web connection (`PQtrace`): every run of
messages the client sent before it read the server's answer is one round trip, so a
pipelined batch counts once, and a statement Django does not log (a health check's
`SELECT 1`, psycopg preparing a statement) counts too.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection
from django.test.utils import CaptureQueriesContext
from psycopg import pq


@dataclass
class Cost:
    statements: list[str] = field(default_factory=list)
    round_trips: int = 0


def _outer_table(sql: str) -> str | None:
    """The first table of a SELECT's own FROM or JOIN, not of a subquery in its select list
    or a lateral join."""
    depth = 0
    for at, char in enumerate(sql):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0 and (found := re.match(r' (?:FROM|JOIN) "(\w+)"', sql[at:])):
            return found[1]
    return None


def shape(sql: str) -> str:
    """A statement as a reader names it: `SELECT durability_effect FOR UPDATE`, `BEGIN`; writes
    sent together as one (`durability.rows.Writes`) as `WITH INSERT durability_effect, UPDATE
    ...`."""
    if sql.startswith("WITH w0 AS ("):
        parts = re.findall(r'w\d+ AS \((INSERT INTO|UPDATE) "(\w+)"', sql)
        return "WITH " + ", ".join(f"{verb} {table}" for verb, table in parts)
    if found := re.match(r'(INSERT INTO|UPDATE) "(\w+)"', sql):
        return f"{found[1]} {found[2]}"
    if sql.startswith("SELECT (SELECT "):  # a statement sent `ahead`, carried by this one
        carried = re.match(r'SELECT \(SELECT .*? FROM "(\w+)"[^)]*\), (.*)', sql)
        assert carried is not None, sql
        rest = shape("SELECT " + carried[2]).removeprefix("SELECT ")
        return f"SELECT ({carried[1]}), {rest}"
    if sql.startswith("SELECT ") and (table := _outer_table(sql)):
        locked = re.search(r" FOR UPDATE( OF \w+)?$", sql) is not None
        return f"SELECT {table}" + (" FOR UPDATE" if locked else "")
    return re.sub(r'\s*(\(.*|"\w+")$', "", sql)


@contextmanager
def cost() -> Iterator[Cost]:
    """The statements and round trips of the block on the default connection (open)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    spent = Cost()
    descriptor, path = tempfile.mkstemp(prefix="pqtrace-")
    try:
        pgconn.trace(descriptor)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        with CaptureQueriesContext(connection) as queries:
            try:
                yield spent
            finally:
                pgconn.untrace()
        spent.statements = [shape(query["sql"]) for query in queries.captured_queries]
        with open(path) as trace:
            senders = [line[:1] for line in trace if line[:1] in {"F", "B"}]
        spent.round_trips = sum(
            1
            for one, after in zip(senders, senders[1:], strict=False)
            if (one, after) == ("F", "B")
        )
    finally:
        os.close(descriptor)
        os.unlink(path)
