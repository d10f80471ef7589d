"""The README's three-minute tour, in Debian's Chromium against a live server with the demo
seeded; and every page reachable from it loads nothing from elsewhere, breaks no rule of the
Content Security Policy, logs no error and shows no date outside a <time> element.

The tour's screenshot of the overview is the README's when `bin/screenshots` runs it.
"""

from __future__ import annotations

import io
import re
from collections import Counter, deque
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from django.core.management import call_command
from tallybook import Tallybook

from durability.demo import agents, telemetry
from durability.demo.provider import ProviderServer
from durability.models import ApiKey, Effect, Grant, Project, State
from tests.browser import BROWSER, browser, page
from tests.ports import free_port

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER
# Where the crawl starts: the overview and every page the header leads to.
START = [
    "/",
    "/queue/",
    "/queue/?grouped=1",
    "/effects/",
    "/runs/",
    "/audit/",
    "/approvals/",
    "/authority/",
]
START += ["/search/?q=refund"]
# Pages of one shape (ids and query values aside) visited at most this often.
PER_SHAPE = 2
MAX_PAGES = 150


@pytest.fixture
def demo(live_server: Any, tmp_path: Path, settings: Any) -> str:
    """The seeded demo and one refund by the demo's refund bot, through the real SDK and
    OpenTelemetry; returns the operator's password."""
    settings.REDIS_URL = ""  # as `bin/demo` runs on a bare machine: background work inline
    port = free_port()
    out = io.StringIO()
    call_command("demo", provider_port=port, dir=tmp_path, stdout=out)
    found = re.search(r"^Operator login: operator / (\S+)$", out.getvalue(), re.M)
    assert found is not None
    project = Project.objects.get(name="demo")
    _, key = ApiKey.issue(project, name="tour")
    provider = ProviderServer(port)
    provider.start()
    tracing = telemetry.tracer_provider("refund-bot", "2.4.0", live_server.url, key)
    tb = Tallybook(live_server.url, key, spool=tmp_path / "spool", tracer_provider=tracing)
    bot = agents.RefundBot(
        tb,
        telemetry.Trajectory(tracing, "refund-bot", "2.4.0", live_server.url, key),
        provider.url,
        agents.Memory(tmp_path / "memory.json"),
        version="2.4.0",
        pace=1.0,
        grants={g.name: g.pk for g in Grant.objects.filter(project=project)},
        repository=tmp_path / "release-repo",
    )
    bot.step()  # its first ticket: a refund that goes well
    tracing.shutdown()
    tb.close()
    provider.shutdown()
    provider.server_close()
    return found.group(1)


def _log_in(page: Any, password: str) -> None:
    page.goto("/")
    page.fill("input[name=username]", "operator")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/$"))


def test_the_readme_tour(page, demo, screenshots):
    # 1. Log in: the overview.
    _log_in(page, demo)
    assert page.inner_text("h1").startswith("Overview")
    assert page.is_visible("svg.chart")
    page.screenshot(path=str(screenshots / "overview.png"), full_page=True)

    # 2. The uncertain cases, from their number on the overview, in the queue.
    page.click("table.matrix tbody tr:has(td:text-is('uncertain')) td:last-child a")
    page.wait_for_url(re.compile(r"/queue/\?reason=uncertain$"))
    rows = page.query_selector_all("tr.case-row")
    assert len(rows) == 1

    # 3. Open it with the keyboard, read its story, settle it: it did not happen.
    page.keyboard.press("o")
    page.wait_for_url(re.compile(r"/cases/\d+/\?from=reason%3Duncertain$"))
    assert "reply:H-102" in page.inner_text("h1, .case-page")
    # The evidence beside the verdict: the model's messages and the tool call, inline.
    assert page.is_visible("[data-messages]")
    page.screenshot(path=str(screenshots / "case-evidence.png"), full_page=True)
    page.keyboard.press("n")
    page.keyboard.type("No such message in the chat's history.")
    page.keyboard.press("Enter")
    page.wait_for_selector("ul.messages")
    assert "it did not happen" in page.inner_text("ul.messages")
    assert "Next intent gets proceed" in page.inner_text(".decision")
    assert Effect.objects.get(key="reply:H-102").state == State.NOT_HAPPENED

    # 4. Approve the large refund that waits for a person.
    page.goto("/approvals/")
    page.click("table.approvals tbody tr:has-text('refund:H-111') a >> nth=0")
    page.wait_for_url(re.compile(r"/approvals/\d+/$"))
    # On call, from a phone: the approval fits the screen, and is signed there.
    desktop = page.viewport_size
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    page.screenshot(path=str(screenshots / "approval-phone.png"), full_page=True)
    page.check("input[name=verdict][value=approve]")
    page.fill("[name=reason]", "A long-standing customer; the amount matches the order.")
    page.click(".sign-form button[type=submit]")
    page.wait_for_selector("ul.messages")
    assert Effect.objects.get(key="refund:H-111").state == State.PENDING
    page.set_viewport_size(desktop)

    # 5. The refund bot's run: the model request, the tool call, the effect under it.
    page.goto("/runs/")
    page.get_by_role("link", name="RF-0001", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\d+/"))
    run = page.inner_text("main")
    assert "execute_tool refund" in run and "refund:A-4001" in run

    # 6. Everything that happened, in the effects list and the audit log.
    page.goto("/effects/?state=not_happened")
    assert "reply:H-102" in page.inner_text("table.list")
    page.goto("/audit/")
    assert "user:operator" in page.inner_text("main")

    # 7. Search: `/`, a customer, and the effect that names them.
    page.keyboard.press("/")
    page.keyboard.type("C-102")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/search/\?q=C-102$"))
    assert "reply:H-102" in page.inner_text("#found-effects")


def _shape(url: str) -> str:
    parts = urlsplit(url)
    names = sorted({pair.split("=")[0] for pair in parts.query.split("&") if pair})
    return re.sub(r"\d+", "N", parts.path) + "?" + "&".join(names)


def test_no_page_loads_anything_from_elsewhere_breaks_the_csp_or_logs_an_error(
    page, demo, live_server
):
    here = urlsplit(live_server.url).netloc
    elsewhere: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: elsewhere.append(r.url) if _away(r.url, here) else None)
    page.on(
        "console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    _log_in(page, demo)
    queue, seen, shapes = deque(START), set(), Counter()
    visited, dated = [], []
    while queue and len(visited) < MAX_PAGES:
        path = queue.popleft()
        if path in seen or shapes[_shape(path)] >= PER_SHAPE:
            continue
        seen.add(path)
        shapes[_shape(path)] += 1
        response = page.goto(path)
        # goto() returns once the page has loaded, its deferred scripts run.
        assert response is not None and response.status < 400, f"{path}: {response.status}"
        # What the page refused, its dates and its links, read in one call to the browser.
        shown = page.evaluate(PAGE_READ, DATE_LIKE)
        assert shown["refused"] == [], path
        dated += [f"{path}: {text}" for text in shown["dated"]]
        visited.append(path)
        for href in shown["links"]:
            url = urlsplit(urljoin(live_server.url + path, href))
            if url.netloc == here and not _leaves(url.path):
                queue.append(url.path + (f"?{url.query}" if url.query else ""))
    assert len(visited) > 20, visited
    assert elsewhere == []
    assert errors == []
    assert dated == []


# Dates as Django's filters and Python print them, and distances as timesince says them
# (with a no-break space: "3 hours" in a heading is no date): on a
# page, every one sits in a <time datetime> of {% when %} (durability/templatetags/times.py).
DATE_LIKE = (
    r"\d{4}-\d\d-\d\d|\b\d{1,2}:\d\d\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r"[a-z]*\.? \d{1,2}, \d{4}|\b[ap]\.m\.|\d+\u00a0(minute|hour|day|week|month|year)s?\b"
)
# Text in a <time> (or its title) is the tag's; data shown as it was sent (code, JSON, form
# values), the answer an agent reads word for word (samp) and the chart's axis are not dates
# of the page's own.
DATES_OUTSIDE_TIME = """(pattern) => {
  const dateLike = new RegExp(pattern);
  const skip = "time, code, pre, samp, svg, script, style, textarea, select, option";
  const found = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest(skip) && dateLike.test(node.textContent)) {
      found.push(node.textContent.trim());
    }
  }
  for (const el of document.querySelectorAll("[title]")) {
    if (!el.closest(skip) && dateLike.test(el.title)) found.push(`title: ${el.title}`);
  }
  return found;
}"""
# The Content Security Policy's refusals on the page now shown (as csp_violations() reads
# them), its dates outside a <time>, and where its links lead.
PAGE_READ = f"""(pattern) => ({{
  refused: window.__cspViolations || [],
  dated: ({DATES_OUTSIDE_TIME})(pattern),
  links: Array.from(document.querySelectorAll("a[href]"), (a) => a.href),
}})"""


def _away(url: str, here: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in ("data", "blob", "about") and parts.netloc != here


def _leaves(path: str) -> bool:
    """Links not to follow: downloads, the admin, logging out, JSON."""
    return path.startswith(("/admin/", "/logout/", "/api/", "/v1/")) or path.endswith(".csv")
