"""Failed logins are counted where every web process sees them: the web server with two
workers locks a username at an address after the limit, the guesses answered by both workers."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from tests.sdk.support import (
    ServerProcess,
    access_lines,
    database_url_of_tests,
    post_login,
    wait_until,
    worker_connections,
)


def _login_posts(log: Path) -> list[str]:
    """The pid of the worker that answered each login submitted, in the order answered."""
    return [line[0] for line in access_lines(log) if line[1:3] == ["POST", "/login/"]]


def test_two_web_processes_share_the_failure_count(transactional_db, alice, tmp_path):
    limit = settings.AXES_FAILURE_LIMIT
    log = tmp_path / "access.log"
    server = ServerProcess(database_url_of_tests(), access_log=log)
    try:
        server.start()
        workers = worker_connections(server)
        # The guesses alternate between the two workers.
        answers = [post_login(workers[n % 2], "alice", "wrong") for n in range(limit)]
        assert answers == [200] * (limit - 1) + [429]
        assert post_login(workers[limit % 2], "alice", "password") == 429

        wait_until(lambda: len(_login_posts(log)) == limit + 1, 60, "the access log")
        pids = _login_posts(log)
        assert pids[0] != pids[1], pids
        assert len(set(pids)) == 2, pids
        for worker in workers:
            worker.close()
    finally:
        server.close()
