"""A key revoked is refused by every web process on its next request: the web server with two
workers, each of which has the key cached, answers 401 on both once it is revoked."""

from __future__ import annotations

import http.client
from pathlib import Path

from durability.accounts.members import apikey_revoke
from durability.models import ApiKey, Project
from tests.sdk.support import (
    ServerProcess,
    access_lines,
    database_url_of_tests,
    wait_until,
    worker_connections,
)

PATH = "/api/v1/effects?key=nope"  # 404 to a key that authenticates, 401 to one refused


def _get(connection: http.client.HTTPConnection, raw: str) -> int:
    connection.request("GET", PATH, headers={"Authorization": f"Bearer {raw}"})
    answer = connection.getresponse()
    answer.read()
    return answer.status


def _answered(log: Path) -> list[tuple[str, str]]:
    """(worker pid, status) of each request to PATH, in the order answered."""
    return [(line[0], line[-1]) for line in access_lines(log) if line[2] == "/api/v1/effects"]


def test_a_key_revoked_is_refused_by_both_workers_that_had_it_cached(transactional_db, tmp_path):
    project = Project.objects.create(name="alpha")
    key, raw = ApiKey.issue(project)
    log = tmp_path / "access.log"
    server = ServerProcess(database_url_of_tests(), access_log=log)
    try:
        server.start()
        workers = worker_connections(server)
        assert [_get(worker, raw) for worker in workers] == [404, 404]
        assert [_get(worker, raw) for worker in workers] == [404, 404]  # from each one's cache
        apikey_revoke(project=project, actor="user:admin", key_id=key.pk)
        assert [_get(worker, raw) for worker in workers] == [401, 401]

        wait_until(lambda: len(_answered(log)) == 6, 60, "the access log")
        answered = _answered(log)
        # Each of the two workers answered one request of each pair: 404, 404, then 401. Two
        # processes append to the log, so their lines interleave in any order; each one's own
        # lines are in the order it answered.
        by_worker: dict[str, list[str]] = {}
        for pid, status in answered:
            by_worker.setdefault(pid, []).append(status)
        assert list(by_worker.values()) == [["404", "404", "401"]] * 2, answered
        for worker in workers:
            worker.close()
    finally:
        server.close()
