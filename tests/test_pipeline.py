"""A batch sent as one libpq pipeline (`durability.pipeline`): its answers, its errors, its
prepared statements, on a connection of the test's own to the test database."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

from durability import pipeline
from durability.pipeline import Statement

pytestmark = pytest.mark.django_db


@pytest.fixture
def conn() -> Iterator[psycopg.Connection]:
    params = connection.get_connection_params()
    own = psycopg.connect(
        **{k: params[k] for k in ("dbname", "host", "port", "user", "password") if k in params},
        prepare_threshold=None,
    )
    yield own
    own.close()


def _prepared(conn: psycopg.Connection) -> list[str]:
    with conn.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_tb\\_%'")
        return [name for (name,) in cursor.fetchall()]


def test_each_statement_gets_its_rows_and_the_transaction_commits(conn) -> None:
    conn.execute("CREATE TEMP TABLE pipeline_t (n int)")
    conn.commit()
    wrote = Statement("INSERT INTO pipeline_t VALUES (%s), (%s) RETURNING n", [1, 2])
    read = Statement("SELECT count(*), %s::text FROM pipeline_t", ["seen"])

    pipeline.send(conn, [wrote, read], commit=True)

    assert (wrote.rows, read.rows) == ([(1,), (2,)], [(2, "seen")])
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT count(*) FROM pipeline_t").fetchone() == (2,)


def test_a_failing_statement_raises_and_nothing_after_it_runs(conn) -> None:
    conn.execute("CREATE TEMP TABLE pipeline_t (n int)")
    conn.commit()
    after = Statement("INSERT INTO pipeline_t VALUES (%s) RETURNING n", [3])

    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.send(conn, [Statement("SELECT 1 / %s", [0]), after], commit=True)

    assert after.rows == []
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pipeline_t").fetchone() == (0,)


def test_a_commit_after_a_failed_statement_rolls_back_and_says_so(conn) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.send(conn, [Statement("SELECT 1 / %s", [0])])

    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        pipeline.send(conn, [], commit=True)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@override_settings(DB_PREPARE_AFTER=2)
def test_a_statement_is_prepared_once_it_repeats_and_outlives_a_rollback(conn) -> None:
    for n in range(3):
        assert _prepared(conn) == []
        statement = Statement("SELECT %s::int + 1", [n])
        pipeline.send(conn, [statement])
        assert statement.rows == [(n + 1,)]
    assert len(_prepared(conn)) == 1

    conn.rollback()
    statement = Statement("SELECT %s::int + 1", [10])
    pipeline.send(conn, [statement])

    assert (statement.rows, len(_prepared(conn))) == ([(11,)], 1)


@override_settings(DB_PREPARE_AFTER=0)
def test_a_prepared_statement_gone_from_the_server_fails_once_then_is_prepared_again(
    conn,
) -> None:
    pipeline.send(conn, [Statement("SELECT %s::int", [1])])
    conn.commit()
    conn.execute("DEALLOCATE ALL")  # as a pooler's DISCARD ALL would
    conn.commit()

    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        pipeline.send(conn, [Statement("SELECT %s::int", [2])])
    conn.rollback()
    again = Statement("SELECT %s::int", [3])
    pipeline.send(conn, [again])

    assert again.rows == [(3,)]


@override_settings(DB_PREPARE_AFTER=0)
def test_a_failed_prepare_leaves_nothing_named(conn) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.send(conn, [Statement("SELECT 1 / %s", [0]), Statement("SELECT %s::int", [1])])
    conn.rollback()
    statement = Statement("SELECT %s::int", [1])
    pipeline.send(conn, [statement])

    assert statement.rows == [(1,)]


@override_settings(DB_PREPARE_AFTER=None)
def test_nothing_is_prepared_when_preparing_is_off(conn) -> None:
    for n in range(5):
        pipeline.send(conn, [Statement("SELECT %s::int", [n])])

    assert _prepared(conn) == []


def test_a_connection_lost_mid_pipeline_is_closed(conn) -> None:
    pid = conn.info.backend_pid
    with psycopg.connect(conn.info.dsn, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])

    with pytest.raises(psycopg.OperationalError):
        pipeline.send(conn, [Statement("SELECT %s::int", [1])])
    assert conn.closed
