"""A key revoked is refused by every web process on its next request: gunicorn with two
workers, each of which has the key cached, answers 401 on both once it is revoked."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

from durability.accounts.members import apikey_revoke
from durability.models import ApiKey, Project
from tests.sdk.support import ServerProcess, database_url_of_tests, wait_until

PATH = "/api/v1/effects?key=nope"  # 404 to a key that authenticates, 401 to one refused


def _get(server: ServerProcess, raw: str) -> int:
    request = urllib.request.Request(server.url + PATH, headers={"Authorization": f"Bearer {raw}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


class HeldRequest:
    """A request whose headers are sent but for their end: the worker that took it waits
    for them, so that a request made meanwhile is answered by the other worker."""

    def __init__(self, server: ServerProcess, raw: str) -> None:
        self.raw = raw
        self.connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self.connection.sendall(f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())

    def finish(self) -> int:
        """Send the rest of the headers; the answer's status."""
        with self.connection:
            rest = f"Authorization: Bearer {self.raw}\r\nConnection: close\r\n\r\n"
            self.connection.sendall(rest.encode())
            answer = b""
            while chunk := self.connection.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1])


def _answered(log: Path) -> list[tuple[str, str]]:
    """(worker pid, status) of each request to PATH, in the order answered."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(line.split()[0], line.split()[-1]) for line in lines if "/api/v1/effects" in line]


def _both_workers(server: ServerProcess, raw: str) -> list[int]:
    """One request answered by each worker: the held one's, then the one made meanwhile."""
    held = HeldRequest(server, raw)
    meanwhile = _get(server, raw)
    return [meanwhile, held.finish()]


def test_a_key_revoked_is_refused_by_both_workers_that_had_it_cached(transactional_db, tmp_path):
    project = Project.objects.create(name="alpha")
    key, raw = ApiKey.issue(project)
    log = tmp_path / "access.log"
    server = ServerProcess(database_url_of_tests(), access_log=log)
    try:
        server.start()
        assert _both_workers(server, raw) == [404, 404]
        assert _both_workers(server, raw) == [404, 404]  # now from each worker's cache
        apikey_revoke(project=project, actor="user:admin", key_id=key.pk)
        assert _both_workers(server, raw) == [401, 401]

        wait_until(lambda: len(_answered(log)) == 6, 60, "the access log")
        answered = _answered(log)
        assert [status for _, status in answered] == ["404"] * 4 + ["401"] * 2
        # Each pair was answered by the two workers.
        workers = [{pid for pid, _ in answered[n : n + 2]} for n in (0, 2, 4)]
        assert len(workers[0]) == 2 and workers[0] == workers[1] == workers[2], answered
    finally:
        server.close()
