"""The desk in a real browser: Playwright drives Debian's Chromium against a live server.

An operator logs in, filters the queue, opens a case and resolves it with the keyboard;
a case resolved elsewhere leaves the queue without a reload. The screenshots taken here
are the README's when `bin/screenshots` runs them.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from durability.desk import case_actions
from durability.models import Case, Effect, Reason, State
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import late_success_case, uncertain_case
from tests.ledger import support as ledger

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER
# The queue's pulse: hx-trigger="every 5s" (templates/durability/desk/queue.html).
PULSE_MS = 5_000


@pytest.fixture
def desk(project: Any, alice: Any) -> dict[str, Case]:
    """A queue with something of everything, as an operator finds it in the morning."""
    refunds = {
        f"refund:{n}": uncertain_case(
            project,
            f"refund:{n}",
            run_id=f"refund-run-{n}",
            context={"workflow": "refund-bot", "workflow_version": "2.3.0", "model": "gpt-5"},
            request={"order": n, "amount": 1250 + n},
        )
        for n in (1041, 1042, 1043)
    }
    deploy = uncertain_case(
        project,
        "deploy:api@4f2a",
        kind="deploy",
        target="k8s-prod",
        context={"workflow": "release-bot", "workflow_version": "1.8.1"},
    )
    late = late_success_case(project, "email:welcome-77")
    ledger.intent(project, "charge:9001", kind="payment", target="stripe")
    ledger.receipt(project, "charge:9001", "ch_A")
    ledger.receipt(project, "charge:9001", "ch_B")
    ledger.receipt(project, "refund:unknown", "re_lost")
    # Cases of different ages, as a real morning has them.
    for n, case in enumerate(Case.objects.order_by("-pk")):
        Case.objects.filter(pk=case.pk).update(
            opened=timezone.now() - timedelta(minutes=15 + 97 * n)
        )
    return {
        **refunds,
        "deploy": deploy,
        "late": late,
        "duplicate": Case.objects.get(reason=Reason.DUPLICATE_EFFECT),
    }


def _rows(page: Any) -> list[str]:
    return [el.get_attribute("id") for el in page.query_selector_all("tr.case-row")]


def test_an_operator_filters_the_queue_and_resolves_a_case_with_the_keyboard(
    page, desk, screenshots
):
    log_in(page)
    assert len(_rows(page)) == 7
    page.screenshot(path=str(screenshots / "queue.png"))

    page.fill(".queue-filter input[name=workflow]", "refund-bot")
    page.click(".queue-filter button[type=submit]")
    page.wait_for_url(re.compile(r"workflow=refund-bot"))
    first, second = desk["refund:1041"], desk["refund:1042"]
    assert _rows(page) == [
        f"case-{c.pk}" for c in desk.values() if c.effect.key.startswith("refund")
    ]

    # j moves down, k back up, o opens.
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    assert page.get_attribute("tr.case-row.current", "id") == f"case-{second.pk}"
    page.keyboard.press("o")
    page.wait_for_url(re.compile(rf"/cases/{second.pk}/\?from=workflow%3Drefund-bot"))
    page.screenshot(path=str(screenshots / "case.png"), full_page=True)

    # n picks "it did not happen" and puts the cursor in the reason; Enter resolves.
    page.keyboard.press("n")
    assert page.is_checked("input[name=verdict][value=not_happened]")
    page.keyboard.type("Not in the Stripe dashboard; the API call never left the worker.")
    page.keyboard.press("Enter")
    page.wait_for_selector("ul.messages")
    assert f"Case #{second.pk} closed: it did not happen." in page.inner_text("ul.messages")
    assert "Next intent gets proceed" in page.inner_text(".decision")
    assert Effect.objects.get(cases=second).state == State.NOT_HAPPENED

    # u goes back to the filtered queue, where the case is gone; a assigns the current row to me.
    page.keyboard.press("u")
    page.wait_for_url(re.compile(r"/queue/\?.*workflow=refund-bot"))
    assert f"case-{second.pk}" not in _rows(page)
    assert page.get_attribute("tr.case-row.current", "id") == f"case-{first.pk}"
    page.keyboard.press("a")
    page.wait_for_selector(f"#case-{first.pk} .assignee:has-text('alice')")
    assert Case.objects.get(pk=first.pk).assignee.username == "alice"


def test_it_happened_needs_evidence_and_records_it(page, desk):
    deploy = desk["deploy"]
    log_in(page, f"/cases/{deploy.pk}/")
    page.keyboard.press("h")
    assert page.is_visible("[data-evidence]")
    page.keyboard.type("k8s")
    page.fill("input[name=external_id]", "release-4f2a")
    page.fill("input[name=note]", "The release is live in the cluster.")
    page.click("form[data-resolve] button[type=submit]")
    page.wait_for_selector("ul.messages")
    story = page.inner_text(".story")
    assert "k8s:release-4f2a" in story and "operator_attested" in story
    assert Effect.objects.get(cases=deploy).state == State.SUCCEEDED


def test_a_case_resolved_elsewhere_leaves_the_queue_without_a_reload(page, desk, project):
    page.clock.install()  # time flows as usual, and the test may jump it forward
    log_in(page)
    late = desk["late"]
    page.evaluate("window.notReloaded = true")
    case_actions.case_acknowledge(
        project=project,
        case_id=late.pk,
        version=late.version,
        actor="user:ada",
        note="the customer was told",
    )
    # The queue's pulse asks every 5 s: the page's clock jumps those 5 s, which fires it once
    # the change is made, instead of the test waiting for it. A minute is the bound, not the
    # expected wait (the clock still runs, so a later pulse would bring it too).
    page.clock.fast_forward(PULSE_MS)
    page.wait_for_selector(f"tr#case-{late.pk}.closed", timeout=60_000)
    assert "Acknowledged by ada" in page.inner_text(f"tr#case-{late.pk}")
    assert page.evaluate("window.notReloaded") is True


def test_a_filtered_queue_ignores_changes_to_cases_it_does_not_show(page, desk, project, admin):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.clock.install()
    log_in(page, "/queue/?reason=late_success")
    late, deploy = desk["late"], desk["deploy"]
    assert _rows(page) == [f"case-{late.pk}"]
    # A case of another reason changes, then the one shown: once the pulse has brought the
    # second change, it has brought the first.
    case_actions.case_assign(
        project=project, case_id=deploy.pk, version=deploy.version, actor="user:ada", assignee=admin
    )
    case_actions.case_acknowledge(
        project=project, case_id=late.pk, version=late.version, actor="user:ada", note="told"
    )
    page.clock.fast_forward(PULSE_MS)
    page.wait_for_selector(f"tr#case-{late.pk}.closed", timeout=60_000)
    assert _rows(page) == [f"case-{late.pk}"]
    assert errors == []


def test_a_case_leads_back_to_the_filtered_queue_it_was_opened_from(page, desk):
    queue = "/queue/?reason=uncertain&target=stripe&sort=severity"
    log_in(page, queue)
    first = _rows(page)[0]
    page.keyboard.press("o")
    page.wait_for_url(re.compile(rf"/cases/{first[len('case-') :]}/\?from="))
    page.click("text=← Queue")
    page.wait_for_url(re.compile(re.escape(queue) + "$"))
    page.click(f"#{first} a.open")
    page.wait_for_selector("[data-case]")
    page.keyboard.press("u")
    page.wait_for_url(re.compile(re.escape(queue) + "$"))
    assert _rows(page)[0] == first


def test_a_bulk_action_previews_then_acts_on_everything_matching(page, desk):
    log_in(page, "/queue/?reason=uncertain")
    # The ticked rows unless "all N matching" is chosen, deliberately.
    page.check("#bulk-form input[name=scope][value=matching]")
    page.select_option("#bulk-form select[name=verb]", "assign")
    page.fill("#bulk-form input[name=assign_to]", "me")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_selector(".bulk-preview")
    assert "4 cases" in page.inner_text(".bulk-preview")
    assert Case.objects.filter(assignee__isnull=False).count() == 0
    page.click(".bulk-preview button")
    page.wait_for_selector(".bulk-progress:has-text('Done')")
    assert Case.objects.filter(reason=Reason.UNCERTAIN, assignee__username="alice").count() == 4


def test_an_operator_groups_similar_cases_expands_a_group_and_settles_it(page, desk):
    refunds = [desk[f"refund:{n}"] for n in (1041, 1042, 1043)]
    key = refunds[0].group_key
    log_in(page)
    page.check(".queue-filter input[name=grouped]")
    page.click(".queue-filter button[type=submit]")
    page.wait_for_url(re.compile(r"grouped=1"))
    # Seven cases in five groups: the three refunds that timed out alike are one row.
    assert "7 open cases in 5 groups" in page.inner_text("h1")
    assert len(page.query_selector_all("tbody.group")) == 5
    assert page.inner_text(f"#group-{key} [data-group-count]") == "3"

    page.click(f"#group-{key} a[data-expand]")
    page.wait_for_selector(f"#cases-{key} tr.case-row")
    shown = [el.get_attribute("id") for el in page.query_selector_all(f"#cases-{key} tr")]
    assert shown == [f"case-{c.pk}" for c in sorted(refunds, key=lambda c: c.pk)]
    assert page.get_attribute(f"#group-{key} a[data-expand]", "aria-expanded") == "true"
    page.click(f"#group-{key} a[data-expand]")
    page.wait_for_selector(f"#cases-{key} tr", state="detached")

    page.check(f"#group-{key} input[name=case_group]")
    assert page.inner_text("[data-selected-count]") == "3"
    page.select_option("#bulk-form select[name=verb]", "not_happened")
    page.fill("#bulk-form input[name=note]", "Stripe shows none of the three refunds")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_selector(".bulk-preview")
    assert "3 cases" in page.inner_text(".bulk-preview")
    assert Case.objects.filter(group_key=key, closed=None).count() == 3
    page.click(".bulk-preview button")
    page.wait_for_selector(".bulk-progress:has-text('Done')")
    for case in refunds:
        case.refresh_from_db()
        assert case.resolution.action == "attest_not_happened"
        assert Effect.objects.get(pk=case.effect_id).state == State.NOT_HAPPENED
    page.click(".bulk-progress a")
    page.wait_for_selector("tbody.group")
    assert "4 open cases in 4 groups" in page.inner_text("h1")
    assert page.query_selector(f"#group-{key}") is None
