"""Failed logins are counted where every web process sees them: gunicorn with two workers
locks a username at an address after the limit, the guesses answered by both workers."""

from __future__ import annotations

import http.cookiejar
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from django.conf import settings

from tests.sdk.support import ServerProcess, database_url_of_tests, wait_until


def _login_form(base: str) -> tuple[urllib.request.OpenerDirector, http.cookiejar.CookieJar, str]:
    """A fresh browser session (its own cookies) that has the login form: its CSRF token."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/login/", timeout=30) as page:
        html = page.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    return opener, jar, token[1]


def _post_login(base: str, username: str, password: str) -> int:
    """A fresh browser session that submits the form."""
    opener, _, token = _login_form(base)
    form = {"csrfmiddlewaretoken": token, "username": username, "password": password}
    request = urllib.request.Request(
        f"{base}/login/", data=urllib.parse.urlencode(form).encode(), method="POST"
    )
    try:
        with opener.open(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


class HeldLogin:
    """A login submitted but for the last byte of its form: the worker that took it waits
    for that byte, so that any request made meanwhile is answered by another worker."""

    def __init__(self, server: ServerProcess, username: str, password: str) -> None:
        _, jar, token = _login_form(server.url)
        cookies = "; ".join(f"{c.name}={c.value}" for c in jar)
        form = {"csrfmiddlewaretoken": token, "username": username, "password": password}
        self.body = urllib.parse.urlencode(form).encode()
        head = (
            f"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nCookie: {cookies}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
        )
        self.connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self.connection.sendall(head.encode() + self.body[:-1])

    def finish(self) -> int:
        """Send the last byte; the answer's status."""
        with self.connection:
            self.connection.sendall(self.body[-1:])
            answer = b""
            while chunk := self.connection.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1])


def _login_posts(log: Path) -> list[str]:
    """The pid of the worker that answered each login submitted, in the order answered."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[0] for line in lines if " POST /login/ " in f"{line} "]


def test_two_web_processes_share_the_failure_count(transactional_db, alice, tmp_path):
    limit = settings.AXES_FAILURE_LIMIT
    log = tmp_path / "access.log"
    server = ServerProcess(database_url_of_tests(), access_log=log)
    try:
        server.start()
        held = HeldLogin(server, "alice", "wrong")
        meanwhile = _post_login(server.url, "alice", "wrong")
        answers = [meanwhile, held.finish()]
        answers += [_post_login(server.url, "alice", "wrong") for _ in range(limit - 2)]
        assert answers == [200] * (limit - 1) + [429]
        assert _post_login(server.url, "alice", "password") == 429

        wait_until(lambda: len(_login_posts(log)) == limit + 1, 60, "the access log")
        workers = _login_posts(log)
        # The first two guesses were answered by different workers, and counted together.
        assert workers[0] != workers[1], workers
        assert len(set(workers)) == 2, workers
    finally:
        server.close()
