"""How the desk looks in Chromium: it uses a wide screen's width, follows the system's dark
mode with readable text and badges, shows times in the browser's zone, and the overview's
chart can show the problems alone."""

from __future__ import annotations

import re
from typing import Any

import pytest

from durability.models import State
from tests.browser import BROWSER, browser, log_in, page, watched_page
from tests.desk.support import late_success_case, uncertain_case
from tests.ledger.support import effect_in

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER

# WCAG 2's AA level for body text.
READABLE = 4.5
BADGES = ".state, .sev, .tag, .strength"


@pytest.fixture
def desk(project: Any, alice: Any) -> None:
    """Many successes and a few problems, and open cases of several severities."""
    for n in range(40):
        effect_in(project, State.SUCCEEDED, key=f"ok-{n}")
    for n, state in enumerate([State.FAILED, State.FAILED, State.DENIED, State.NOT_HAPPENED]):
        effect_in(project, state, key=f"bad-{n}")
    uncertain_case(
        project,
        "refund:1041",
        request={"order": 1041},
    )
    late_success_case(project, "email:welcome-77")


def _luminance(rgb: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _rgb(css: str) -> tuple[float, ...]:
    found = re.match(r"rgba?\(([^)]+)\)", css)
    assert found is not None, css
    return tuple(float(part) for part in found[1].split(","))


def contrast(fg: str, bg: str) -> float:
    light, dark = sorted((_luminance(_rgb(fg)), _luminance(_rgb(bg))), reverse=True)
    return (light + 0.05) / (dark + 0.05)


# The colour of an element's text, and of the first opaque background behind it.
COLOURS = """(selector) => Array.from(document.querySelectorAll(selector)).map((el) => {
  let bg = el;
  while (bg && ["rgba(0, 0, 0, 0)", "transparent"].includes(getComputedStyle(bg).backgroundColor)) {
    bg = bg.parentElement;
  }
  return {
    what: (el.className || el.tagName) + ": " + el.textContent.trim().slice(0, 30),
    fg: getComputedStyle(el).color,
    bg: bg ? getComputedStyle(bg).backgroundColor : "rgb(255, 255, 255)",
  };
})"""


def test_a_wide_screen_is_used_to_its_width(page, desk):
    page.set_viewport_size({"width": 1920, "height": 1080})
    log_in(page, "/queue/")
    main = page.eval_on_selector("main", "el => el.getBoundingClientRect().width")
    table = page.eval_on_selector("table.queue", "el => el.getBoundingClientRect().width")
    assert main >= 1900 and table >= 1800
    # A summary gets the room to be read, not 28rem of it.
    summary = page.eval_on_selector(
        "table.queue .summary", "el => el.getBoundingClientRect().width"
    )
    assert summary > 28 * 14


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_text_and_badges_are_readable_in_light_and_dark_mode(page, desk, scheme):
    page.emulate_media(color_scheme=scheme)
    log_in(page, "/queue/")
    body = page.eval_on_selector("body", "el => getComputedStyle(el).backgroundColor")
    # Dark mode is on when the system asks for it, and only then.
    assert (_luminance(_rgb(body)) < 0.05) == (scheme == "dark")
    for path in ("/queue/", "/effects/", "/"):
        page.goto(path)
        assert path == "/" or page.locator(BADGES).count() > 0
        seen = page.evaluate(COLOURS, f"main, main td, main a, {BADGES}")
        for shown in seen:
            ratio = contrast(shown["fg"], shown["bg"])
            assert ratio >= READABLE, f"{path} {shown['what']}: {ratio:.2f} ({shown})"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_charts_states_stand_out_from_its_background(page, desk, scheme):
    page.emulate_media(color_scheme=scheme)
    log_in(page, "/")
    chart = page.eval_on_selector("svg.chart", "el => getComputedStyle(el).backgroundColor")
    fills = page.eval_on_selector_all(
        "svg.chart rect, ul.legend .swatch",
        "els => els.map(el => [el.getAttribute('class'), getComputedStyle(el).fill,"
        " getComputedStyle(el).backgroundColor])",
    )
    assert {"s-succeeded", "s-failed", "s-denied", "s-not_happened", "s-timed_out"} <= {
        name for name, _, _ in fills
    }
    for name, fill, background in fills:
        colour = background if "swatch" in name else fill
        # WCAG 2's non-text contrast: 3:1 against what lies around it.
        assert contrast(colour, chart) >= 3, f"{name} {colour} on {chart}"


def test_the_overview_chart_shows_problems_only_and_keeps_it_in_the_address(page, desk):
    log_in(page, "/")
    assert page.locator("svg.chart rect.s-succeeded").count() > 0
    page.click("a.chart-show:text-is('Problems only')")
    page.wait_for_url(re.compile(r"/\?range=\w+&show=problems$"))
    assert page.locator("svg.chart rect.s-succeeded").count() == 0
    assert page.locator("svg.chart rect.s-failed").count() > 0
    legend = page.inner_text("ul.legend")
    assert "failed 2" in legend and "denied 1" in legend and "succeeded" not in legend
    assert page.inner_text("#chart-title").startswith("Problems by state")
    # Another range keeps the toggle; "All states" takes it off.
    page.click("nav[aria-label='Chart range'] a:text-is('24h')")
    page.wait_for_url(re.compile(r"/\?range=24h&show=problems$"))
    assert page.locator("svg.chart rect.s-succeeded").count() == 0
    page.click("a.chart-show:text-is('All states')")
    page.wait_for_url(re.compile(r"/\?range=24h$"))
    assert page.locator("svg.chart rect.s-succeeded").count() > 0


def test_times_are_shown_in_the_browsers_zone(browser, live_server, desk):
    page, violations, errors = watched_page(browser, live_server.url, timezone_id="Asia/Tokyo")
    try:
        log_in(page, "/effects/")
        assert page.inner_text("header a.zone") == "Asia/Tokyo"
        title = page.get_attribute("main time", "title")
        assert title is not None and title.endswith("JST (UTC+09:00)")
    finally:
        page.context.close()
    assert violations == [] and errors == []
