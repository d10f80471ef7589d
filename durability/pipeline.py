"""Statements sent to PostgreSQL as one libpq pipeline: every message written at once, one
Sync, then every answer read.

psycopg's pipeline mode sends each statement as it is queued: a poll and a write of its
own per statement, and a wake-up of the server's backend for each, which cost the ledger's
requests more client CPU than anything else they do (`benchmarks/pipeline_cost.py`: six
statements, 217–340 µs of client CPU through psycopg's pipeline, 23–44 µs through libpq's,
as measured on 2026-12-06). Here the
statements are queued in libpq's buffer (`psycopg.pq`, the driver's own libpq wrapper) and
written together.

Values are adapted by the connection's own adapters (psycopg's `Transformer`), so a row
reads as a psycopg cursor on that connection would read it. A statement is prepared on its
connection once it ran `DB_PREPARE_AFTER` times (settings), in the same pipeline as its
next run, so preparing costs no round trip. psycopg prepares nothing of its own (its
`prepare_threshold` is None): it would DEALLOCATE ALL after a rollback, and with it the
statements prepared here. Should a prepared statement vanish all the same (a DISCARD ALL
from a pooler, an operator's DEALLOCATE), the statement fails once and the connection's
statements are prepared afresh.
"""

from __future__ import annotations

import select
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

IDLE = pq.TransactionStatus.IDLE
# Statements one connection keeps prepared at most: the ledger's are a few dozen shapes; past
# this many (an unforeseen variety), the rest go unprepared.
PREPARED_MAX = 200
# Statement texts whose placeholders are kept converted, at most (then converted afresh).
CONVERTED_MAX = 1000
# SQLSTATE of a prepared statement the server does not have.
UNKNOWN_STATEMENT = "26000"

_SQL: dict[str, bytes] = {}


@dataclass
class Statement:
    """One statement of a pipeline, with `%s` placeholders; `rows` its answer once sent.
    `prepare`: prepared once it ran `DB_PREPARE_AFTER` times; False for a statement whose
    text varies with its input (a list of placeholders per row), or whose plan should be
    made for its values each time."""

    sql: str
    params: Sequence[Any] = ()
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    prepare: bool = True


@dataclass
class _Prepared:
    """What one connection has prepared here ({(query, types): name}), and how often each
    statement not yet prepared ran."""

    names: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    runs: Counter[tuple[bytes, tuple[int, ...]]] = field(default_factory=Counter)
    drawn: int = 0  # names drawn so far (each new: a name whose preparing failed is not reused)


_prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Prepared] = (
    weakref.WeakKeyDictionary()
)


def _query(sql: str) -> bytes:
    """`sql` with PostgreSQL's numbered placeholders for its `%s`s (converted once)."""
    query = _SQL.get(sql)
    if query is None:
        if len(_SQL) >= CONVERTED_MAX:
            _SQL.clear()
        parts = sql.split("%s")
        assert not any("%" in part for part in parts), f"only %s placeholders: {sql}"
        numbered = [f"{part}${n}" for n, part in enumerate(parts[:-1], 1)]
        query = _SQL[sql] = ("".join(numbered) + parts[-1]).encode()
    return query


def begin_command(conn: psycopg.Connection[Any]) -> bytes:
    """The BEGIN psycopg sends for a transaction of `conn`, with its characteristics."""
    parts = ["BEGIN"]
    if conn.isolation_level is not None:
        parts.append(f"ISOLATION LEVEL {conn.isolation_level.name.replace('_', ' ')}")
    if conn.read_only is not None:
        parts.append("READ ONLY" if conn.read_only else "READ WRITE")
    if conn.deferrable is not None:
        parts.append("DEFERRABLE" if conn.deferrable else "NOT DEFERRABLE")
    return " ".join(parts).encode()


def send(
    conn: psycopg.Connection[Any],
    statements: Sequence[Statement],
    *,
    begin: bool = False,
    commit: bool = False,
) -> None:
    """Send `statements` as one pipeline, after a BEGIN (`begin`, or where psycopg would send
    one: its transaction not yet begun) and before a COMMIT (`commit`); each statement's rows
    are then in its `rows`. The first error any of them met is raised (psycopg's, as its
    cursors raise it) once every answer is read; the statements after it did not run."""
    pgconn = conn.pgconn
    if not conn.autocommit and pgconn.transaction_status == IDLE:
        begin = True
    prepared = _prepared.setdefault(conn, _Prepared())
    after = settings.DB_PREPARE_AFTER
    transformer = Transformer(conn)
    # Every value adapted before anything is sent: a value no adapter takes fails here,
    # with nothing of the pipeline on its way.
    adapted = []
    for statement in statements:
        params = transformer.dump_sequence(
            statement.params, [PyFormat.AUTO] * len(statement.params)
        )
        types = tuple(transformer.types or ())
        formats = list(transformer.formats or ())
        adapted.append((statement, _query(statement.sql), params, types, formats))
    # What each command's answer is: a statement's rows, a name prepared, or a command's.
    answers: list[Statement | tuple[tuple[bytes, tuple[int, ...]], bytes] | bytes] = []
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            if begin:
                pgconn.send_query_params(begin_command(conn), None)
                answers.append(b"BEGIN")
            for statement, query, params, types, formats in adapted:
                shape = (query, types)
                name = prepared.names.get(shape)
                if (
                    name is None
                    and statement.prepare
                    and after is not None
                    and len(prepared.names) < PREPARED_MAX
                ):
                    prepared.runs[shape] += 1
                    if prepared.runs[shape] > after:
                        # Named at once, so that the same statement later in this pipeline
                        # runs prepared too; forgotten again if preparing it fails.
                        name = prepared.names[shape] = f"_tb_{prepared.drawn}".encode()
                        prepared.drawn += 1
                        del prepared.runs[shape]
                        pgconn.send_prepare(name, query, param_types=types)
                        answers.append((shape, name))
                if name is not None:
                    pgconn.send_query_prepared(name, params, param_formats=formats)
                else:
                    pgconn.send_query_params(
                        query, params, param_types=types, param_formats=formats
                    )
                answers.append(statement)
            if commit:
                pgconn.send_query_params(b"COMMIT", None)
                answers.append(b"COMMIT")
            pgconn.pipeline_sync()
            results = _exchange(pgconn, len(answers))
        except BaseException:
            # Cut off mid-pipeline (the connection lost): nothing can use the connection
            # after it. Closed, it is rolled back on the server, and Django opens another.
            pgconn.finish()
            raise
        pgconn.exit_pipeline_mode()
    first_error: psycopg.Error | None = None
    for answer, found in zip(answers, results, strict=True):
        (result,) = found
        status = result.status
        if isinstance(answer, tuple) and status != pq.ExecStatus.COMMAND_OK:
            del prepared.names[answer[0]]  # not prepared: the pipeline failed before or in it
        if status == pq.ExecStatus.FATAL_ERROR and first_error is None:
            first_error = errors.error_from_result(result, encoding=conn.info.encoding)
        elif status == pq.ExecStatus.TUPLES_OK and isinstance(answer, Statement):
            transformer.set_pgresult(result)
            answer.rows = transformer.load_rows(0, result.ntuples, tuple)
        elif answer == b"COMMIT" and result.command_status != b"COMMIT" and first_error is None:
            # A transaction that had failed ends in a ROLLBACK, answered to its COMMIT.
            first_error = errors.InFailedSqlTransaction(
                "the transaction had failed: its COMMIT rolled it back"
            )
    if first_error is not None:
        if first_error.sqlstate == UNKNOWN_STATEMENT:
            _prepared.pop(conn, None)  # gone from the server: prepared afresh from now on
        raise first_error


def _exchange(pgconn: pq.abc.PGconn, commands: int) -> list[list[pq.abc.PGresult]]:
    """Write what libpq holds and read the answers of `commands` commands and the Sync: the
    results of each command (one each: no statement here answers with several)."""
    fd = pgconn.socket
    poll = select.poll()
    poll.register(fd, select.POLLIN | select.POLLOUT)
    while pgconn.flush():  # the server answers while it reads: read what it sent meanwhile
        if any(event & select.POLLIN for _, event in poll.poll()):
            pgconn.consume_input()
    poll.modify(fd, select.POLLIN)
    out: list[list[pq.abc.PGresult]] = []
    current: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            poll.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of a command's results
            out.append(current)
            current = []
        elif result.status == pq.ExecStatus.PIPELINE_SYNC:
            assert len(out) == commands and not current, (len(out), commands)
            return out
        else:
            current.append(result)
