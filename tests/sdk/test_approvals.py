"""The SDK and approvals: an effect block waits for a person's approval when told to, and
otherwise raises EffectInDoubt naming the approval, which `tb.wait_for` resumes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from tallybook import AsyncTallybook, EffectDenied, EffectInDoubt, Tallybook

from durability.authority import approvals
from durability.models import Approval, Effect, Grant, Project, SignoffVerdict, State
from tests.authority.support import grant
from tests.sdk.support import wait_until


@pytest.fixture
def refunds(project: Project) -> Grant:
    return grant(project, name="refunds", currency="EUR", max_amount="100", requires_approval=True)


def _options(g: Grant, **more: Any) -> dict[str, Any]:
    return {
        "kind": "payment",
        "target": "stripe",
        "request": {"order": 7},
        "authority": {"grant": g.pk},
        "amount": {"value": "40.00", "currency": "EUR"},
        **more,
    }


def _sign(project: Project, user: User, verdict: SignoffVerdict, reason: str) -> None:
    approval = Approval.objects.get(effect__key="refund:7")
    approvals.approval_sign(
        project=project, approval_id=approval.pk, user=user, verdict=verdict, reason=reason
    )


@pytest.fixture
def operator_later(project: Project, alice: User) -> Iterator[Any]:
    """Sign the approval from another thread once the agent has asked for it."""
    threads: list[threading.Thread] = []
    raised: list[BaseException] = []

    def start(verdict: SignoffVerdict, reason: str = "checked the order") -> None:
        def run() -> None:
            try:
                wait_until(lambda: Approval.objects.filter(effect__key="refund:7").exists(), 120)
                _sign(project, alice, verdict, reason)
            except BaseException as exc:
                raised.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)

    yield start
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "the operator's thread did not finish"
    if raised:
        raise raised[0]


def test_the_block_waits_for_the_approval_and_then_runs(tb: Tallybook, refunds, operator_later):
    operator_later(SignoffVerdict.APPROVE)
    ran = False
    with tb.effect("refund:7", **_options(refunds, wait_for_approval=120)) as fx:
        ran = True
        fx.receipt(system="stripe", external_id="re_7")
    assert ran and fx.decision == "proceed" and fx.attempt == 1
    assert tb.flush()
    effect = Effect.objects.get(key="refund:7")
    assert (effect.state, str(effect.amount), effect.currency) == (
        State.SUCCEEDED,
        "40.000000",
        "EUR",
    )


def test_a_denial_while_waiting_raises_effect_denied_with_the_reason(
    tb: Tallybook, refunds, operator_later
):
    operator_later(SignoffVerdict.DENY, "customer withdrew the claim")
    block = tb.effect("refund:7", **_options(refunds, wait_for_approval=120))
    with pytest.raises(EffectDenied, match="customer withdrew the claim"), block:
        pytest.fail("a denied effect ran")


def test_without_waiting_it_raises_effect_in_doubt_naming_the_approval_and_wait_for_resumes(
    tb: Tallybook, project, alice, refunds
):
    with pytest.raises(EffectInDoubt) as raised, tb.effect("refund:7", **_options(refunds)):
        pytest.fail("an effect awaiting approval ran")
    approval = Approval.objects.get()
    report = raised.value
    assert report.case is not None and report.case.reason == "approval_required"
    assert f"/approvals/{approval.pk}/" in str(report)

    _sign(project, alice, SignoffVerdict.APPROVE, "fine")
    assert tb.wait_for("refund:7", timeout=60).decision == "proceed"
    with tb.effect("refund:7", **_options(refunds)) as fx:
        fx.receipt(system="stripe", external_id="re_7")
    assert tb.flush()
    assert Effect.objects.get().state == State.SUCCEEDED


def test_waiting_longer_than_told_raises_effect_in_doubt_naming_the_approval(
    tb: Tallybook, refunds
):
    block = tb.effect("refund:7", **_options(refunds, wait_for_approval=0.3))
    with pytest.raises(EffectInDoubt, match=r"Still waiting after 0.3 s.*/approvals/\d+/"), block:
        pytest.fail("an effect awaiting approval ran")
    assert Effect.objects.get().state == State.AWAITING_APPROVAL


def test_the_amount_is_checked_against_the_grant(tb: Tallybook, refunds):
    over = _options(refunds, amount={"value": "250.00", "currency": "EUR"})
    with pytest.raises(EffectDenied, match="rule `max_amount`"), tb.effect("refund:7", **over):
        pytest.fail("an effect over the grant's limit ran")


def test_the_async_block_waits_for_the_approval_too(atb: AsyncTallybook, refunds, operator_later):
    operator_later(SignoffVerdict.APPROVE)

    async def agent() -> str:
        async with atb.effect("refund:7", **_options(refunds, wait_for_approval=120)) as fx:
            await fx.receipt(system="stripe", external_id="re_7")
        return str(fx.decision)

    assert asyncio.run(agent()) == "proceed"
    assert asyncio.run(atb.flush())
    assert Effect.objects.get().state == State.SUCCEEDED
