"""A machine's request (the API, OTLP, the webhooks) passes only the middleware it needs: the
security headers and the JSON errors, not the pages' sessions, CSRF, user, messages, framing
and content-security headers; every page still passes all of it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import Api

pytestmark = pytest.mark.django_db


def test_an_api_answer_carries_the_security_headers(api: Api) -> None:
    r = api.intent("k1")

    assert r.status_code == 201
    assert r["X-Content-Type-Options"] == "nosniff"
    assert r["Referrer-Policy"] == "same-origin"
    assert r["Cross-Origin-Opener-Policy"] == "same-origin"
    assert r["Content-Length"] == str(len(r.content))


def test_an_api_answer_has_none_of_the_pages_middleware(api: Api) -> None:
    r = api.intent("k1")

    assert "Content-Security-Policy" not in r
    assert "X-Frame-Options" not in r
    assert "Vary" not in r  # nothing read the session or the cookies
    assert not r.cookies
    assert not hasattr(r.wsgi_request, "session")
    assert not hasattr(r.wsgi_request, "user")


def test_an_api_error_from_django_is_still_json(api: Api) -> None:
    r = api.client.get("/api/v1/nowhere")

    assert r.status_code == 404
    assert r["Content-Type"] == "application/json"


def test_a_page_still_passes_every_middleware(client: Client, admin: User) -> None:
    client.force_login(admin)
    r = client.get("/queue/")

    assert r.status_code == 200
    assert r.wsgi_request.user == admin
    assert "Content-Security-Policy" in r
    assert r["X-Frame-Options"] == "DENY"
    assert r["X-Content-Type-Options"] == "nosniff"


def test_a_page_post_without_its_csrf_token_is_refused(admin: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)

    assert client.post("/settings/", {}).status_code == 403
