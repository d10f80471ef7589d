"""The desk at phone width (390 × 844): the case, approval, queue and overview pages have no
horizontal scroll, the header's links fold into a menu, and an on-call person approves a
deploy from the phone."""

from __future__ import annotations

from typing import Any

import pytest

from durability.models import Approval, ApprovalStatus, Case, Project
from tests.authority.support import grant, under
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import late_success_case, uncertain_case

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER

PHONE = {"width": 390, "height": 844}
# What overflows, when something does: the elements wider than the window, widest first.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  return Array.from(document.querySelectorAll("body *"))
    .map((el) => [el, el.getBoundingClientRect().right])
    .filter(([el, right]) => right > width + 0.5 && !el.parentElement.closest("table, pre, svg"))
    .sort((a, b) => b[1] - a[1])
    .slice(0, 10)
    .map(([el, right]) => `${el.tagName.toLowerCase()}.${el.className} ${Math.round(right)}px`);
}"""


@pytest.fixture
def on_call(project: Project, alice: Any, api: Any) -> dict[str, Any]:
    """A morning's cases with long keys and summaries, and a deploy waiting for approval."""
    case = uncertain_case(
        project,
        "deploy:payments-api@4f2a9c1e7b3d5f60a8e2c4b6d8f0a1c3e5b7d9f1",
        kind="deploy",
        target="k8s-prod-eu-west-1",
        run_id="release-bot-run-2026-12-07T06:14:09Z-4f2a9c1e",
        context={"workflow": "release-bot", "workflow_version": "1.8.1"},
        request={"image": "registry.example.com/payments-api:" + "4f2a9c1e" * 8},
    )
    late_success_case(project, "email:welcome-77")
    deploys = grant(project, name="prod deploys", kinds=["deploy"], requires_approval=True)
    api.intent("deploy:checkout@9b1d", kind="deploy", target="k8s-prod", **under(deploys))
    approval = Approval.objects.get(effect__key="deploy:checkout@9b1d")
    return {"case": case, "approval": approval}


def _fits(page: Any) -> None:
    wide = page.evaluate("() => document.documentElement.scrollWidth")
    assert wide <= page.evaluate("() => window.innerWidth"), (page.url, page.evaluate(OVERFLOWING))


def test_the_pages_an_on_call_person_opens_fit_a_phone(page: Any, on_call: dict[str, Any]) -> None:
    page.set_viewport_size(PHONE)
    log_in(page, "/queue/")
    case: Case = on_call["case"]
    for path in (
        "/queue/",
        "/queue/?grouped=1",
        "/",
        f"/cases/{case.pk}/",
        "/approvals/",
        f"/approvals/{on_call['approval'].pk}/",
    ):
        page.goto(path)
        _fits(page)


def test_the_navigation_folds_into_a_menu_at_phone_width(
    page: Any, on_call: dict[str, Any]
) -> None:
    page.set_viewport_size(PHONE)
    log_in(page, "/queue/")
    menu = page.get_by_role("button", name="Menu")
    assert menu.is_visible()
    assert not page.locator("header.top nav").is_visible()

    menu.click()

    assert menu.get_attribute("aria-expanded") == "true"
    page.locator("header.top nav").get_by_role("link", name="Approvals").click()
    page.wait_for_url("**/approvals/")
    _fits(page)


def test_an_on_call_person_approves_a_deploy_from_a_phone(
    page: Any, on_call: dict[str, Any]
) -> None:
    approval: Approval = on_call["approval"]
    page.set_viewport_size(PHONE)
    log_in(page, f"/approvals/{approval.pk}/")
    _fits(page)

    page.get_by_label("approve").check()
    page.get_by_label("Reason").fill("Change window open; checked the diff.")
    page.get_by_role("button", name="Sign").click()
    page.wait_for_selector(".approval-approved")

    _fits(page)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
