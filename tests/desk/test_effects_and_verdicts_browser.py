"""In Chromium: the effects list's filters in the page, kept by the state tabs, and on each
case the verdicts its reason offers, one of them given with the keyboard."""

from __future__ import annotations

import re
from typing import Any

from durability.models import Reason
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import case_of
from tests.desk.test_verdicts import OFFERED
from tests.ledger import support as ledger

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER

LABELS = {
    "happened": "It happened",
    "not_happened": "It did not happen",
    "compensated": "Compensated",
    "abandoned": "Abandoned",
    "acknowledge": "Acknowledge",
}
# What the case says once the last verdict offered was given.
STATUS = {"compensated": "Closed: compensated", "acknowledge": "Acknowledged"}
STATUS |= {"abandoned": "Closed: abandoned"}


def _keys(page: Any) -> list[str]:
    return [a.inner_text() for a in page.query_selector_all("#effect-rows td:first-child a")]


def test_an_operator_filters_the_effects_and_the_state_tabs_keep_the_filter(page, project, alice):
    bot = {"context": {"agent": "refund-bot", "workflow": "refunds"}, "run_id": "run-1"}
    ledger.intent(project, "refund:1", kind="payment", target="stripe", **bot)
    ledger.timeout(project, "refund:1")
    ledger.intent(project, "refund:2", kind="payment", target="stripe", **bot)
    ledger.intent(project, "email:1", kind="email", target="smtp", **bot)
    other = {"context": {"agent": "support-bot"}, "run_id": "run-2"}
    ledger.intent(project, "refund:3", kind="payment", target="stripe", **other)

    log_in(page, "/effects/")
    assert sorted(_keys(page)) == ["email:1", "refund:1", "refund:2", "refund:3"]
    page.fill("[data-effects-filter] input[name=kind]", "payment")
    page.fill("[data-effects-filter] input[name=agent]", "refund-bot")
    page.fill("[data-effects-filter] input[name=run]", "run-1")
    page.click("[data-effects-filter] button[type=submit]")
    page.wait_for_url(re.compile(r"kind=payment.*agent=refund-bot.*run=run-1"))
    assert sorted(_keys(page)) == ["refund:1", "refund:2"]
    # The open-cases column: refund:1's uncertain case.
    row = page.locator("#effect-rows tr", has_text="refund:1")
    assert row.locator("[data-open-cases]").inner_text() == "1"

    page.click('nav[aria-label="Filter by state"] a:text-is("timed_out")')
    page.wait_for_url(re.compile(r"state=timed_out&kind=payment&agent=refund-bot&run=run-1"))
    assert _keys(page) == ["refund:1"]
    assert page.input_value("[data-effects-filter] input[name=agent]") == "refund-bot"
    page.click('nav[aria-label="Filter by state"] a:text-is("all")')
    page.wait_for_url(re.compile(r"/effects/\?kind=payment&agent=refund-bot&run=run-1$"))
    assert sorted(_keys(page)) == ["refund:1", "refund:2"]


def test_each_case_offers_the_verdicts_of_its_reason_and_takes_one_by_keyboard(
    page, project, alice
):
    cases = {reason: case_of(project, reason, key=f"k-{reason}") for reason in Reason}
    log_in(page, f"/cases/{cases[Reason.UNCERTAIN].pk}/")
    for reason, case in cases.items():
        page.goto(f"/cases/{case.pk}/")
        offered = page.locator("[data-resolve] .verdicts label")
        labels = [re.sub(r"\s+\S$", "", text.strip()) for text in offered.all_inner_texts()]
        assert labels == [LABELS[v] for v in OFFERED[reason]], reason
        if reason == Reason.APPROVAL_REQUIRED:
            approval = case.effect.approval
            link = page.locator("[data-approval-link] a")
            assert link.inner_text() == f"approval #{approval.pk}"
            assert link.get_attribute("href") == f"/approvals/{approval.pk}/"
            continue
        verdict = OFFERED[reason][-1]
        key = page.get_attribute(f'[data-resolve] input[value="{verdict}"]', "data-key")
        page.keyboard.press(key)
        page.keyboard.type("checked with the owner")
        page.keyboard.press("Enter")
        status = page.locator("[data-status]")
        status.wait_for()
        assert status.inner_text() == f"{STATUS[verdict]} by alice: “checked with the owner”"
