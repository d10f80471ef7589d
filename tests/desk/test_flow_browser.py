"""Working through the desk with the keyboard, in Debian's Chromium against a live server:
settle-and-next and skip walk the filtered queue the case was opened from, `r` lands on the
verdict and stays there, `?` shows the help over the page, `g` and a letter go to a page,
the approvals have their keys, the header marks the current page, and saved views.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from durability.desk.queue import QueueQuery, open_cases
from durability.models import Approval, ApprovalStatus, Case, Effect, SavedView, State
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import uncertain_case
from tests.ledger import support as ledger

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER

REFUNDS = "/queue/?workflow=refund-bot"


@pytest.fixture
def refunds(project: Any, alice: Any) -> list[Case]:
    """Four refund-bot cases and one deploy case, oldest first: the refunds' queue order."""
    found = [
        uncertain_case(project, f"refund:{n}", context={"workflow": "refund-bot"})
        for n in (1, 2, 3)
    ]
    uncertain_case(project, "deploy:1", kind="deploy", target="k8s-prod")
    found.append(uncertain_case(project, "refund:4", context={"workflow": "refund-bot"}))
    for n, case in enumerate(Case.objects.order_by("pk")):
        Case.objects.filter(pk=case.pk).update(opened=timezone.now() - timedelta(hours=10 - n))
    query = QueueQuery.from_params({"workflow": "refund-bot"})
    ordered = list(open_cases(project, query, alice).order_by("opened", "id"))
    assert ordered == found
    return ordered


def _case_url(case: Case) -> re.Pattern[str]:
    return re.compile(rf"/cases/{case.pk}/\?from=workflow%3Drefund-bot$")


def _after_load(page: Any) -> None:
    """Once the page has loaded and two frames have been drawn: what the browser does to the
    focus after loading a page (a fragment's target) is done by then."""
    page.wait_for_load_state("load")
    page.evaluate(
        "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )


def test_settle_and_next_then_skip_walk_the_filtered_queue(page, refunds):
    first, second, third, fourth = refunds
    log_in(page, REFUNDS)
    page.keyboard.press("o")
    page.wait_for_url(_case_url(first))

    # n, the reason, Shift+Enter: settled, and on to the next case of this queue.
    page.keyboard.press("n")
    page.keyboard.type("Not in the provider's dashboard.")
    page.keyboard.press("Shift+Enter")
    page.wait_for_url(_case_url(second))
    assert f"Case #{first.pk} closed: it did not happen." in page.inner_text("ul.messages")
    assert Effect.objects.get(cases=first).state == State.NOT_HAPPENED

    # s skips a case (the deploy case, outside the filter, is never offered).
    page.keyboard.press("s")
    page.wait_for_url(_case_url(third))
    page.keyboard.press("s")
    page.wait_for_url(_case_url(fourth))
    assert Case.objects.get(pk=second.pk).closed is None
    # Past the last: back to the filtered queue, which says so.
    page.keyboard.press("s")
    page.wait_for_url(re.compile(re.escape(REFUNDS) + "$"))
    assert "That was the last open case of this queue." in page.inner_text("ul.messages")
    assert [r.get_attribute("id") for r in page.query_selector_all("tr.case-row")] == [
        f"case-{c.pk}" for c in (second, third, fourth)
    ]


def test_the_resolve_and_next_button_and_the_skip_link_work_by_mouse(page, refunds):
    first, second, third, _ = refunds
    log_in(page, REFUNDS)
    page.click(f"#case-{second.pk} a.open")
    page.wait_for_url(_case_url(second))
    page.click("text=Skip to the next case")
    page.wait_for_url(_case_url(third))
    page.check("input[name=verdict][value=not_happened]")
    page.fill("input[name=note]", "Not there.")
    page.click("text=Resolve, then next")
    page.wait_for_url(_case_url(refunds[3]))
    assert Case.objects.get(pk=third.pk).closed is not None


def test_r_in_the_queue_opens_the_case_with_the_focus_on_its_verdict(page, refunds):
    first = refunds[0]
    log_in(page, REFUNDS)
    page.keyboard.press("r")
    page.wait_for_url(re.compile(rf"/cases/{first.pk}/\?from=.*#verdict$"))
    _after_load(page)
    focused = page.evaluate("() => [document.activeElement.name, document.activeElement.value]")
    assert focused == ["verdict", "happened"]
    # The case's keys still answer there: n picks its verdict and goes to the reason.
    page.keyboard.press("n")
    assert page.is_checked("input[name=verdict][value=not_happened]")
    assert page.evaluate("() => document.activeElement.name") == "note"


def _in_view(page: Any, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return bool(
        box
        and box["y"] >= 0
        and box["x"] >= 0
        and box["y"] + box["height"] <= size["height"]
        and box["x"] + box["width"] <= size["width"]
    )


def test_question_mark_shows_the_help_over_the_page_and_escape_closes_it(page, refunds):
    log_in(page, f"/cases/{refunds[0].pk}/")
    page.mouse.wheel(0, 5000)  # wherever the page is scrolled to
    page.keyboard.press("?")
    help = page.get_by_role("dialog", name="Keyboard")
    help.wait_for(state="visible")
    assert _in_view(page, "dialog[data-keys]")
    assert "go to Approvals" in help.inner_text() and "skip" in help.inner_text()
    # The page's keys wait while it is open.
    page.keyboard.press("n")
    assert not page.is_checked("input[name=verdict][value=not_happened]")
    page.keyboard.press("Escape")
    help.wait_for(state="hidden")
    # Its button opens it too, and ? closes it again.
    page.click("[data-keys-open]")
    help.wait_for(state="visible")
    page.keyboard.press("?")
    help.wait_for(state="hidden")


def test_g_and_a_letter_go_to_a_page_and_the_header_marks_it(page, refunds, admin):
    log_in(page, REFUNDS)
    for keys, url, current in [
        ("ga", "/approvals/", "Approvals"),
        ("gr", "/runs/", "Runs"),
        ("ge", "/effects/", "Effects"),
        ("gl", "/audit/", "Audit"),
        ("gp", "/authority/", "Authority"),
        ("gm", "/queue/?assignee=me", "My cases"),
        ("gq", "/queue/", "Queue"),
        ("go", "/", None),
    ]:
        for key in keys:
            page.keyboard.press(key)
        page.wait_for_url(re.compile(re.escape(url) + "$"))
        marked = page.locator("header.top nav a[aria-current=page]")
        if current:
            assert marked.inner_text() == current
        else:
            assert marked.count() == 0
            assert page.get_attribute("header.top a.brand", "aria-current") == "page"
    # g s goes nowhere for an operator: no Settings link is offered.
    page.keyboard.press("g")
    page.keyboard.press("s")
    assert page.url.endswith("/")
    # A case is marked as under the queue it came from.
    page.goto(f"/cases/{refunds[0].pk}/?from=assignee%3Dme")
    assert page.get_attribute("nav a[data-go=m]", "aria-current") == "true"
    assert page.get_attribute("nav a[data-go=q]", "aria-current") is None


def test_the_approvals_keys_move_open_and_approve(page, project, alice):
    grant = ledger.needs_approval(project)
    for n in (1, 2):
        ledger.intent(project, f"deploy:{n}", authority={"grant": grant.pk})
    waiting = list(Approval.objects.order_by("created", "id"))
    log_in(page, "/approvals/")
    rows = [r.get_attribute("id") for r in page.query_selector_all("tr.approval-row")]
    assert sorted(rows) == sorted(f"approval-{a.pk}" for a in waiting)
    assert page.get_attribute("tr.approval-row.current", "id") == rows[0]
    page.keyboard.press("j")
    assert page.get_attribute("tr.approval-row.current", "id") == rows[1]
    page.keyboard.press("k")
    page.keyboard.press("j")
    page.keyboard.press("o")
    chosen = int(rows[1].removeprefix("approval-"))
    page.wait_for_url(re.compile(rf"/approvals/{chosen}/$"))

    page.keyboard.press("a")
    assert page.is_checked("input[name=verdict][value=approve]")
    page.keyboard.type("The release was planned for today.")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("ul.messages")
    assert Approval.objects.get(pk=chosen).status == ApprovalStatus.APPROVED

    page.keyboard.press("u")
    page.wait_for_url(re.compile(r"/approvals/$"))
    other = int(page.get_attribute("tr.approval-row.current", "id").removeprefix("approval-"))
    assert other != chosen
    page.keyboard.press("o")
    page.wait_for_url(re.compile(rf"/approvals/{other}/$"))
    page.keyboard.press("d")
    assert page.is_checked("input[name=verdict][value=deny]")
    page.keyboard.type("Not during the freeze.")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("ul.messages")
    assert Approval.objects.get(pk=other).status == ApprovalStatus.DENIED


def test_an_operator_saves_a_view_picks_it_and_deletes_it(page, refunds):
    log_in(page, REFUNDS + "&sort=severity")
    page.fill(".save-view input[name=name]", "Refund bot")
    page.check(".save-view input[name=shared]")
    page.click(".save-view button[type=submit]")
    page.wait_for_selector("ul.messages")
    assert "View “Refund bot” saved." in page.inner_text("ul.messages")
    view = SavedView.objects.get()
    assert view.shared and view.query == "workflow=refund-bot&sort=severity"
    assert page.get_attribute(".views a[aria-current=page]", "href") == view.get_absolute_url()

    page.goto("/queue/")
    assert page.locator(".views a[aria-current]").count() == 0
    page.click(".views a:text-is('Refund bot')")
    page.wait_for_url(re.compile(r"/queue/\?workflow=refund-bot&sort=severity$"))
    assert len(page.query_selector_all("tr.case-row")) == 4

    page.click(".views button[aria-label='Delete the view Refund bot']")
    page.wait_for_selector("ul.messages")
    assert "View “Refund bot” deleted." in page.inner_text("ul.messages")
    assert page.url.endswith("/queue/?workflow=refund-bot&sort=severity")
    assert not SavedView.objects.exists()
