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


# Every page reports what its Content Security Policy refused (an inline script or style, an
# eval, a resource from elsewhere): to the test at once, through a binding that outlives
# navigations, and on the window, where csp_violations() reads the current page's.
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  const what = `${event.effectiveDirective} refused ${event.blockedURI || "inline"}`
    + ` (${event.sourceFile || location.href}:${event.lineNumber}) on ${location.pathname}`;
  window.__cspViolations.push(what);
  window.tallybookCspViolation(what);
});
"""


def csp_violations(page: Any) -> list[str]:
    """What the Content Security Policy refused on the page now shown."""
    found: list[str] = page.evaluate("() => window.__cspViolations || []")
    return found


def watched_page(browser: Any, base_url: str, **options: Any) -> tuple[Any, list[str], list[str]]:
    """A page in a new context of its own (Playwright's context `options` added, such as a
    `timezone_id`), and the lists that collect its CSP violations and console errors; close
    its context after use."""
    context = browser.new_context(
        viewport={"width": 1440, "height": 900}, base_url=base_url, **options
    )
    # How long an action waits for its element or page: a bound, not an expected speed.
    context.set_default_timeout(30_000)
    violations: list[str] = []
    context.expose_function("tallybookCspViolation", lambda what: violations.append(what))
    context.add_init_script(CSP_LISTENER)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page, violations, errors


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    page, violations, errors = watched_page(browser, live_server.url)
    yield page
    if page.url.startswith(live_server.url):
        violations.extend(v for v in csp_violations(page) if v not in violations)
    page.context.close()
    # No page broke the Content Security Policy, and no script failed (Chromium also logs
    # each refusal as a console error).
    assert violations == []
    assert errors == []


def log_in(page: Any, next_url: str = "/queue/") -> None:
    page.goto(next_url)
    assert "/login/" in page.url
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(next_url) + "$"))
