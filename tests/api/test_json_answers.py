"""Every answer under /api/, /v1/ and /hooks/ is JSON, the ones Django gives on its own too
(an unknown URL, a method a path does not take, an exception); the pages stay HTML."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import include, path

from durability.api.schemas import ErrorOut


def _boom(request: Any) -> Any:
    raise RuntimeError("a defect in a view")


# The app's URLs, and a view that fails under each prefix: no real view should (that is
# what the contract and fuzz tests check), so the 500 answer is driven here.
urlpatterns = [
    path("api/v1/boom", _boom),
    path("v1/boom", _boom),
    path("hooks/boom/", _boom),
    path("", include("durability.urls")),
]


def assert_json_error(r: Any, status: int) -> ErrorOut:
    assert r.status_code == status, r.content[:300]
    assert r["Content-Type"] == "application/json"
    answer = ErrorOut.model_validate(r.json())
    assert answer.model_dump(exclude_none=True) == r.json()
    assert answer.error
    return answer


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/effects/null,null",
        "/api/v1/effects/not-a-number",
        "/api/v1/grants/-1",
        "/api/v1/nothing-here",
        "/api/v2/intents",
        "/v1/logs",
        "/hooks/",
        "/hooks/a/b/",
    ],
)
def test_an_unknown_url_is_a_json_404(api, url):
    answer = assert_json_error(
        api.client.get(url, headers={"Authorization": f"Bearer {api.key}"}), 404
    )
    assert answer.fields == {"path": url}


@pytest.mark.parametrize(
    ("method", "url", "allowed"),
    [
        ("get", "/api/v1/intents", "POST"),
        ("put", "/api/v1/receipts", "POST"),
        ("delete", "/api/v1/effects/1", "GET"),
        ("post", "/api/v1/grants", "GET"),
        ("patch", "/api/v1/openapi.json", "GET"),
        ("get", "/api/v1/events", "POST"),
        ("get", "/v1/traces", "POST"),
        ("get", "/hooks/github/", "POST"),
    ],
)
def test_a_method_the_path_does_not_take_is_a_json_405_naming_the_allowed_ones(
    api, method, url, allowed
):
    r = getattr(api.client, method)(url, headers={"Authorization": f"Bearer {api.key}"})
    answer = assert_json_error(r, 405)
    assert r["Allow"] == allowed
    assert answer.fields == {"method": f"Allowed: {allowed}"}


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("url", ["/api/v1/boom", "/v1/boom", "/hooks/boom/"])
def test_an_exception_in_a_view_is_a_json_500(db, url):
    client = Client(raise_request_exception=False)
    answer = assert_json_error(client.get(url), 500)
    assert answer.error == "Internal Server Error"
    assert "a defect" not in answer.error


def test_a_host_not_allowed_is_a_json_400(db):
    r = Client(HTTP_HOST="evil.example").get("/api/v1/effects", {"key": "k"})
    assert_json_error(r, 400)


def test_the_pages_keep_their_html_errors(client, alice):
    client.force_login(alice)
    r = client.get("/no-such-page/")
    assert r.status_code == 404
    assert r["Content-Type"].startswith("text/html")
