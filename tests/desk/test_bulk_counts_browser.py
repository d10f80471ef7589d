"""In a real browser, a bulk action's counts stay true without a reload: the heading, the
tab's title, the reason tabs and the rows follow, and a group just settled leaves the list."""

from __future__ import annotations

from typing import Any

from durability.models import Project
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import late_success_case, uncertain_case

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER


def test_a_group_acknowledged_leaves_the_list_and_the_counts_follow(
    page: Any, project: Project, alice: Any
) -> None:
    late = [late_success_case(project, f"refund:{n}") for n in range(2)]
    uncertain_case(project, "deploy:1", kind="deploy", target="k8s")
    key = late[0].group_key
    log_in(page, "/queue/?grouped=1")
    assert page.title() == "Queue (3) · Tallybook"
    assert page.is_checked("#bulk-form input[name=scope][value=selected]")

    page.check(f"#group-{key} input[name=case_group]")
    page.select_option("#bulk-form select[name=verb]", "acknowledge")
    page.fill("#bulk-form input[name=note]", "refunds checked with the customer")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_selector(".bulk-preview button")
    page.click(".bulk-preview button")
    page.wait_for_selector(".bulk-progress:has-text('Done')")

    page.wait_for_selector(f"#group-{key}", state="detached")
    assert "1 open case in 1 group" in page.inner_text("h1")
    assert page.title() == "Queue (1) · Tallybook"
    assert "late_success" not in page.inner_text("#reason-counts")
    assert "all 1 matching" in page.inner_text("#bulk-matching")
