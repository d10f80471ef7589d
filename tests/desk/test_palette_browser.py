"""The command palette in a real browser: Ctrl+K from any page, type, choose, go."""

from __future__ import annotations

from typing import Any

from durability.models import Project
from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import uncertain_case
from tests.search.support import run

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER


def test_ctrl_k_jumps_to_a_case_by_id_a_page_by_name_and_a_run(
    page: Any, project: Project, alice: Any
) -> None:
    case = uncertain_case(project, "refund:H-112", run_id="ticket-88")
    run(project, "ticket-88", "c" * 32)
    log_in(page, "/queue/")
    palette = page.locator("dialog[data-palette]")

    page.keyboard.press("Control+k")
    assert palette.is_visible()
    page.keyboard.type(str(case.pk))
    palette.locator("a.chosen", has_text=f"Case #{case.pk}").wait_for()
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/cases/{case.pk}/")

    page.keyboard.press("Control+k")
    page.keyboard.type("approv")
    palette.locator("a.chosen", has_text="Approvals").wait_for()
    page.keyboard.press("Enter")
    page.wait_for_url("**/approvals/")

    page.keyboard.press("Control+k")
    page.keyboard.type("ticket-88")
    palette.locator("a", has_text="Run ticket-88").wait_for()
    for _ in range(palette.locator("a").count()):
        if "Run ticket-88" in palette.locator("a.chosen").inner_text():
            break
        page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_url("**/runs/**")
    assert "ticket-88" in page.inner_text("h1")


def test_escape_closes_the_palette_and_the_page_keys_work_again(
    page: Any, project: Project, alice: Any
) -> None:
    uncertain_case(project, "refund:1")
    log_in(page, "/queue/")
    page.keyboard.press("Control+k")
    assert page.locator("dialog[data-palette]").is_visible()

    page.keyboard.press("Escape")

    assert not page.locator("dialog[data-palette]").is_visible()
    page.keyboard.press("?")
    assert page.locator("dialog[data-keys]").is_visible()
