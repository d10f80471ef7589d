"""`tb.tool(...)`: tool functions made durable by a decorator, the key from their arguments."""

from __future__ import annotations

import pytest
from tallybook import EffectInDoubt, Receipt, Tallybook

from durability.models import Effect
from durability.models import Receipt as ReceiptRow
from tests import ledger


@pytest.fixture
def sent() -> list[str]:
    """What the fake mail provider sent."""
    return []


@pytest.fixture
def mailer(tb: Tallybook, sent: list[str]):
    """A tool that sends an email through the fake provider."""

    @tb.tool("email:{to}:{subject}", kind="email", target="fakesmtp", replay="never")
    def send_email(to: str, subject: str, body: str = "") -> Receipt:
        sent.append(to)
        return Receipt(system="fakesmtp", external_id=f"msg-{len(sent)}", data={"to": to})

    return send_email


def test_a_tool_call_is_recorded_with_its_arguments_as_the_request(mailer):
    receipt = mailer("ann@example.com", "Your refund")

    assert (receipt.external_id, receipt.strength) == ("msg-1", "agent_reported")
    effect = Effect.objects.get(key="email:ann@example.com:Your refund")
    assert effect.state == "succeeded"
    assert effect.request == {"to": "ann@example.com", "subject": "Your refund", "body": ""}


def test_a_tool_call_already_done_returns_the_stored_receipt_without_running(mailer, sent):
    first = mailer("ann@example.com", "Your refund")
    again = mailer(to="ann@example.com", subject="Your refund")

    assert sent == ["ann@example.com"]
    assert again.external_id == first.external_id and again.id == first.id
    assert ReceiptRow.objects.count() == 1


def test_the_key_can_be_a_function_of_the_arguments(tb: Tallybook):
    @tb.tool(lambda order, cents: f"refund:{order}", kind="payment", target="fakepay")
    def refund(order: int, cents: int) -> Receipt:
        return Receipt(system="fakepay", external_id=f"re_{order}")

    refund(7, 1250)

    assert Effect.objects.get(key="refund:7").request == {"order": 7, "cents": 1250}


def test_a_tool_that_raises_reports_an_uncertain_failure_and_the_retry_is_in_doubt(tb: Tallybook):
    @tb.tool("charge:{order}", kind="payment", target="fakepay")
    def charge(order: int) -> Receipt:
        raise ConnectionError("fakepay hung up")

    with pytest.raises(ConnectionError):
        charge(1)
    with pytest.raises(EffectInDoubt):
        charge(1)

    assert ledger.cases().get(closed=None).reason == "uncertain"


def test_a_tool_that_returns_no_receipt_is_a_bug_reported_loudly(tb: Tallybook):
    @tb.tool("charge:{order}", kind="payment", target="fakepay")
    def charge(order: int) -> Receipt:
        return "done"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a tallybook.Receipt"):
        charge(1)

    assert Effect.objects.get(key="charge:1").state == "timed_out"
