"""An approval given in a real browser releases an agent that waits for it through the SDK.

Playwright drives Debian's Chromium against a live server; the agent runs in a thread
with the SDK, blocked in its effect block until the operator approves.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from django.db import connection
from tallybook import Tallybook

from durability.models import Approval, Effect, Project, State
from tests.authority.support import grant
from tests.browser import BROWSER, browser, log_in, page
from tests.sdk.support import FAST, wait_until

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER


def test_an_operator_approves_in_the_browser_and_the_waiting_agent_goes_on(
    page: Any, live_server: Any, project: Project, alice: Any, api_key: str, tmp_path: Path
) -> None:
    refunds = grant(
        project,
        name="refunds",
        currency="EUR",
        max_amount="1000",
        requires_approval=True,
        second_approval_above="500",
    )
    outcome: dict[str, Any] = {}

    def agent() -> None:
        tb = Tallybook(live_server.url, api_key, spool=tmp_path, **FAST)
        refund = tb.effect(
            "refund:88",
            kind="payment",
            target="stripe",
            request={"order": 88},
            authority={"grant": refunds.pk},
            amount={"value": "120.00", "currency": "EUR"},
            wait_for_approval=240,
        )
        try:
            with tb.run("refund-bot", version="2.3.0", run_id="ticket-88"), refund as fx:
                outcome["decision"] = fx.decision
                fx.receipt(system="stripe", external_id="re_88")
        except BaseException as exc:  # the test thread reports it
            outcome["error"] = exc
        finally:
            tb.close()
            connection.close()

    waiting = threading.Thread(target=agent)
    waiting.start()
    wait_until(lambda: Approval.objects.filter(effect__key="refund:88").exists(), 120)
    assert waiting.is_alive(), outcome

    log_in(page, "/approvals/")
    inbox = page.locator("table.approvals")
    assert "refund-bot" in inbox.inner_text() and "ticket-88" in inbox.inner_text()
    inbox.get_by_role("link", name="payment on stripe").click()
    page.get_by_label("approve").check()
    page.get_by_label("Reason").fill("Order 88 was returned; refund approved.")
    page.get_by_role("button", name="Sign").click()
    page.wait_for_selector(".approval-approved")

    waiting.join(timeout=120)
    assert not waiting.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["decision"] == "proceed"
    effect = Effect.objects.get(key="refund:88")
    assert effect.state == State.SUCCEEDED and effect.attempt_count == 1
    signoff = Approval.objects.get(effect=effect).signoffs.get()
    assert (signoff.user.get_username(), signoff.reason) == (
        "alice",
        "Order 88 was returned; refund approved.",
    )
