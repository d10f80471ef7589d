"""The Content Security Policy is strict (nothing inline, nothing from elsewhere, no eval),
and the browser tests see each refusal: their pages fail on any (tests/browser.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import BROWSER, browser, csp_violations, watched_page

__all__ = ["browser"]  # the browser fixture, used by name

STRICT = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'"
)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/login/", "/", "/queue/", "/settings/", "/admin/login/"])
def test_every_page_is_served_with_the_strict_policy(client, admin, path):
    client.force_login(admin)
    assert client.get(path)["Content-Security-Policy"] == STRICT


@pytest.mark.parametrize(
    "inject",
    [
        "() => { const s = document.createElement('script'); s.textContent = '1';"
        " document.head.append(s); }",
        "() => document.body.insertAdjacentHTML('beforeend', '<p style=\"color: red\">x</p>')",
    ],
    ids=["inline-script", "inline-style"],
)
@BROWSER[0]
@BROWSER[1]
@BROWSER[2]
def test_a_refused_inline_script_or_style_is_seen_by_the_browser_tests(
    browser: Any, live_server: Any, inject: str
) -> None:
    page, violations, errors = watched_page(browser, live_server.url)
    try:
        page.goto("/login/")
        assert csp_violations(page) == []
        page.evaluate(inject)
        page.wait_for_function("() => window.__cspViolations.length > 0")
        refused = csp_violations(page)
        assert len(refused) == 1 and "inline" in refused[0] and "/login/" in refused[0]
        page.evaluate("() => 0")  # the binding's call has reached the test by now
        assert violations == refused
    finally:
        page.context.close()


@BROWSER[0]
@BROWSER[1]
@BROWSER[2]
def test_the_admins_login_breaks_no_rule_of_the_policy(browser: Any, live_server: Any) -> None:
    # Not crawled (the desk's pages are, tests/test_tour.py); Chromium's console also says
    # that it asked for /favicon.ico, which the admin does not name.
    page, violations, _ = watched_page(browser, live_server.url)
    try:
        page.goto("/admin/login/")
        assert page.is_visible("input[name=password]")
        assert csp_violations(page) == []
    finally:
        page.context.close()
    assert violations == []
