"""A locked-out login in a real browser: the guesser gets the locked page, an admin unlocks
the member from the settings page, and the member logs in; no page breaks the CSP."""

from __future__ import annotations

import re

from django.conf import settings

from durability.models import AuditEntry, Role
from tests.browser import BROWSER, browser, csp_violations, watched_page
from tests.desk.support import member

__all__ = ["browser"]  # the browser fixture, used by name

pytestmark = BROWSER
# Chromium logs each answer of 400 or more; the locked page is one (429, Too Many Requests).
LOCKED = "Failed to load resource: the server responded with a status of 429 (Too Many Requests)"


def _submit(page, username: str, password: str) -> None:
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_a_locked_out_member_is_unlocked_by_an_admin_in_the_browser(
    live_server, browser, project, alice, screenshots
):
    member(project, "ada", Role.ADMIN)
    page, refused, logged = watched_page(browser, live_server.url)
    page.goto("/login/")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _submit(page, "alice", "wrong-password")
    assert page.inner_text("h1") == "Login locked"
    page.screenshot(path=str(screenshots / "locked-out.png"), full_page=True)
    page.click("text=Back to the login page")
    _submit(page, "alice", "password")
    assert page.inner_text("h1") == "Login locked"

    desk, violations, errors = watched_page(browser, live_server.url)
    try:
        desk.goto("/login/?next=/settings/")
        _submit(desk, "ada", "password")
        desk.wait_for_url(re.compile(r"/settings/$"))
        row = desk.locator("table.members tr", has_text="alice")
        assert "login locked" in row.inner_text()
        row.get_by_role("button", name="Unlock").click()
        desk.wait_for_selector("ul.messages")
        assert "alice can log in again" in desk.inner_text("ul.messages")
        assert "login locked" not in desk.inner_text("table.members")
        assert csp_violations(desk) == []
    finally:
        desk.context.close()
    assert violations == [] and errors == []

    page.goto("/login/")
    _submit(page, "alice", "password")
    page.wait_for_url(re.compile(r"/$"))
    assert csp_violations(page) == []
    page.context.close()
    assert refused == [] and set(logged) == {LOCKED}
    actions = AuditEntry.objects.filter(project=project).values_list("action", flat=True)
    assert {"login_locked_out", "login_unlocked"} <= set(actions)
