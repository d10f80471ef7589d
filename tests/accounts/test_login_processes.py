"""Failed logins are counted where every web process sees them: gunicorn with two workers
locks a username after the limit, whichever worker each guess reached."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

from django.conf import settings

from tests.sdk.support import ServerProcess, database_url_of_tests


def _post_login(base: str, username: str, password: str) -> int:
    """A fresh browser session (its own connection and cookies) that submits the form."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/login/", timeout=30) as page:
        html = page.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    form = {"csrfmiddlewaretoken": token[1], "username": username, "password": password}
    request = urllib.request.Request(
        f"{base}/login/", data=urllib.parse.urlencode(form).encode(), method="POST"
    )
    try:
        with opener.open(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_two_web_processes_share_the_failure_count(transactional_db, alice):
    server = ServerProcess(database_url_of_tests())
    try:
        server.start()
        answers = [
            _post_login(server.url, "alice", "wrong") for _ in range(settings.AXES_FAILURE_LIMIT)
        ]
        assert answers == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]
        assert _post_login(server.url, "alice", "password") == 429
    finally:
        server.close()
