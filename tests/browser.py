"""Debian's Chromium through Playwright, for the tests that drive the pages in a browser."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")

# Every browser test module: `pytestmark = BROWSER`, and the fixtures imported by name.
BROWSER = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
    ),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        # Playwright's sync API runs an event loop in this thread while the browser is
        # open; the tests' own ORM calls (and the database teardown) remain synchronous.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=live_server.url)
    # How long an action waits for its element or page: a bound, not an expected speed.
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page
    context.close()
    # No script was refused by the Content Security Policy, nor failed.
    assert [e for e in errors if "oobErrorNoTarget" not in e] == []


def log_in(page: Any, next_url: str = "/queue/") -> None:
    page.goto(next_url)
    assert "/login/" in page.url
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(next_url) + "$"))
