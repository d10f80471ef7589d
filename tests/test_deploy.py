"""The production settings: with DEBUG off Tallybook is HTTPS-only behind a TLS-terminating
proxy and `manage.py check --deploy` finds nothing; each part can be turned off by the
environment for a plain-HTTP start on 127.0.0.1."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PLAIN_HTTP

ROOT = Path(__file__).resolve().parent.parent
SECURE = [
    *PLAIN_HTTP,
    "DEBUG",
    "SECRET_KEY",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "EMAIL_HOST",
    "SITE_URL",
    "TRUSTED_PROXIES",
    "TRUSTED_PROXY_HOPS",
    "LOGIN_CLIENT_ADDRESS_HEADER",
]
# Requests to the login page through Django's test client (one per set of headers, each with
# a fresh client), in the process those settings configure; prints what the browser would be
# told of each, in order.
ASK = """
import json
from django.test import Client
answers = []
for headers in json.loads({asked!r}):
    r = Client().get("/login/", headers=headers)
    answers.append({{
        "status": r.status_code,
        "location": r.get("Location", ""),
        "hsts": r.get("Strict-Transport-Security", ""),
        "csrf_secure": bool(r.cookies["csrftoken"]["secure"]) if "csrftoken" in r.cookies else None,
    }})
print(json.dumps(answers))
"""


def _production(**env: str) -> dict[str, str]:
    """This environment as a production start has it: none of the tests' plain-HTTP
    overrides, DEBUG unset, a real secret key, a mail server, the site's address and its
    proxy (the test client connects from 127.0.0.1); then `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in SECURE}
    production = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "EMAIL_HOST": "smtp.example.com",
        "SITE_URL": "https://tallybook.example.com",
        "TRUSTED_PROXIES": "127.0.0.1",
    }
    return {**clean, **production, **env}


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ask_each(env: dict[str, str], *asked: dict[str, str]) -> list[dict[str, object]]:
    """What each request (its headers) is answered, all asked in one process of `env`'s
    settings: a process costs a Django start, a request a few milliseconds."""
    done = _manage(env, "shell", "-c", ASK.format(asked=json.dumps(asked)))
    assert done.returncode == 0, done.stderr
    answers: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answers) == len(asked)
    return answers


def _ask(env: dict[str, str], **headers: str) -> dict[str, object]:
    return _ask_each(env, headers)[0]


def test_check_deploy_finds_nothing_in_the_production_settings():
    done = _manage(_production(), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_asks_for_a_mail_server():
    # Without EMAIL_HOST, emails about cases are only printed on the console (the demo's).
    env = _production()
    del env["EMAIL_HOST"]
    done = _manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    assert "mail.E001" in done.stdout + done.stderr


def test_check_deploy_refuses_the_development_secret_key():
    env = _production()
    del env["SECRET_KEY"]
    done = _manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    assert "security.W009" in done.stdout + done.stderr


def test_check_deploy_warns_of_a_proxy_header_believed_from_anyone():
    env = _production(LOGIN_CLIENT_ADDRESS_HEADER="X-Forwarded-For")
    del env["TRUSTED_PROXIES"]
    done = _manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "tallybook.W001" in said and "TRUSTED_PROXIES" in said
    assert "SECURE_PROXY_SSL_HEADER and LOGIN_CLIENT_ADDRESS_HEADER" in said
    assert _manage(_production(TRUSTED_PROXY_HOPS="1", TRUSTED_PROXIES=""), "check", "--deploy",
                   "--fail-level", "WARNING").returncode == 0  # fmt: skip


def test_check_deploy_asks_for_the_site_url():
    env = _production()
    del env["SITE_URL"]
    done = _manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    assert "tallybook.W002" in done.stdout + done.stderr


def test_a_client_that_reaches_django_directly_cannot_say_it_used_https():
    env = _production(TRUSTED_PROXIES="10.0.0.0/24")
    answer = _ask(env, **{"X-Forwarded-Proto": "https"})
    assert answer["status"] == 301 and answer["location"] == "https://testserver/login/"


def test_plain_http_is_redirected_to_https():
    answer = _ask(_production())
    assert answer["status"] == 301
    assert answer["location"] == "https://testserver/login/"


def test_https_through_the_proxy_gets_hsts_and_secure_cookies():
    answer = _ask(_production(), **{"X-Forwarded-Proto": "https"})
    assert answer["status"] == 200
    assert answer["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert answer["csrf_secure"] is True


def test_another_proxy_header_can_be_named():
    env = _production(SECURE_PROXY_SSL_HEADER="X-Scheme")
    other, named = _ask_each(env, {"X-Forwarded-Proto": "https"}, {"X-Scheme": "https"})
    assert other["status"] == 301
    assert named["status"] == 200


@pytest.mark.parametrize(
    "env",
    [
        {"SECURE_SSL_REDIRECT": "0", "CSRF_COOKIE_SECURE": "0", "SECURE_HSTS_SECONDS": "0"},
        {"DEBUG": "1"},
    ],
    ids=["each-turned-off", "debug"],
)
def test_a_plain_http_start_turns_each_off(env):
    answer, plain = _ask_each(_production(**env), {"X-Forwarded-Proto": "https"}, {})
    assert answer["status"] == 200
    assert answer["hsts"] == ""
    assert answer["csrf_secure"] is False
    assert plain["status"] == 200


def test_an_empty_database_url_means_the_demos_sqlite_file() -> None:
    shown = _manage(
        {**os.environ, "DATABASE_URL": " "},
        "shell",
        "-c",
        "from django.db import connection; print(connection.vendor)",
    )

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1] == "sqlite"
