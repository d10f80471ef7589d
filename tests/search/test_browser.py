"""The search in Chromium: the header's box on every page, `/` to focus it, results grouped
by kind, and a result that opens its page."""

from __future__ import annotations

import re
from typing import Any

from tests.browser import BROWSER, browser, log_in, page
from tests.desk.support import uncertain_case
from tests.ledger import support as ledger
from tests.search.support import run

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER


def test_slash_focuses_the_header_search_and_a_result_opens_its_case(
    page: Any, project: Any, alice: Any
) -> None:
    case = uncertain_case(project, "refund:1042", request={"order": 1042, "customer": "ana"})
    ledger.intent(project, "email:welcome-77", kind="email", target="smtp")
    run(project, "ticket-1042", agent="refund-bot")
    log_in(page, "/effects/")

    page.keyboard.press("/")
    box = page.locator("header input[data-search]")
    assert box.evaluate("el => el === document.activeElement")
    box.type("1042")
    box.press("Enter")
    page.wait_for_url(re.compile(r"/search/\?q=1042$"))

    assert page.locator("#found-effects tbody tr").all_inner_texts()[0].startswith("refund:1042")
    assert page.locator("#found-runs tbody tr a").all_inner_texts() == ["ticket-1042"]
    assert page.locator("header input[data-search]").input_value() == "1042"
    page.click(f"#found-cases a[href='{case.get_absolute_url()}']")
    page.wait_for_url(re.compile(rf"/cases/{case.pk}/$"))
    assert "refund:1042" in page.content()


def test_slash_in_a_field_types_a_slash(page: Any, project: Any, alice: Any) -> None:
    log_in(page, "/search/")
    field = page.locator("main input[name=q]")
    field.click()
    field.type("deploy/api")
    assert field.input_value() == "deploy/api"
    assert field.evaluate("el => el === document.activeElement")
