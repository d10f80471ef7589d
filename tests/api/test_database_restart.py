"""A web connection that PostgreSQL dropped (a restart, a failover, an idle timeout) fails one
request at most, answered 503 with Retry-After, and the next request reconnects: there is no
health check query before each request to find out first."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import close_old_connections, connection

from durability.models import Project
from tests.conftest import Api
from tests.ledger import support as ledger

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate(pid: int) -> None:
    """End backend `pid` from another connection, and wait until it is gone."""
    params = connection.get_connection_params()
    with psycopg.connect(
        dbname=params["dbname"],
        user=params.get("user"),
        host=params.get("host"),
        port=params.get("port"),
        autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(200):  # bounded: 10 s
            if not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                return
            time.sleep(0.05)
    raise AssertionError(f"backend {pid} did not end")


def test_a_request_on_a_dropped_connection_answers_503_or_succeeds_and_the_next_one_succeeds(
    api: Api, project: Project
) -> None:
    grant = {"grant": ledger.everything(project).pk}
    assert api.intent("k0", authority=grant).status_code == 201
    _terminate(connection.connection.info.backend_pid)

    first = api.intent("k1", authority=grant)
    close_old_connections()  # as every request served ends (the test client skips it)
    second = api.intent("k2", authority=grant)

    assert first.status_code in {201, 503}
    if first.status_code == 503:
        assert first["Retry-After"] == "2"
        assert first.json()["error"] == "The database is unavailable; retry shortly"
    assert second.status_code == 201
    assert second.json()["decision"] == "proceed"
