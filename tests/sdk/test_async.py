"""AsyncTallybook: the same surface for asyncio agents, against a live server."""

from __future__ import annotations

import asyncio

import pytest
from tallybook import AsyncTallybook, EffectInDoubt, EffectUnsettled

from durability.models import Attempt, Case, Effect
from durability.models import Receipt as ReceiptRow


def refund(atb, order="42"):
    return atb.effect(f"refund:{order}", kind="payment", target="fakepay", request={"order": order})


def test_an_async_effect_records_its_intent_and_receipt_and_is_not_repeated(atb):
    async def agent():
        with atb.run("refund-bot", version="2.3.0", run_id="ticket-7"):
            async with refund(atb) as fx:
                if fx.completed:
                    return fx.receipt.stored
                return await fx.receipt(system="fakepay", external_id="re_1")

    first = asyncio.run(agent())
    again = asyncio.run(agent())

    assert first.external_id == again.external_id == "re_1"
    assert ReceiptRow.objects.count() == 1
    assert Attempt.objects.get().run_id == "ticket-7"


def test_async_effects_run_concurrently_in_one_loop(atb):
    async def one(n):
        async with refund(atb, order=str(n)) as fx:
            await asyncio.sleep(0.01)
            await fx.receipt(system="fakepay", external_id=f"re_{n}")

    async def agent():
        await asyncio.gather(*(one(n) for n in range(10)))

    asyncio.run(agent())

    assert asyncio.run(atb.flush())
    assert Effect.objects.filter(state="succeeded").count() == 10


def test_an_async_failure_puts_the_effect_in_doubt_until_a_person_settles_it(atb):
    async def agent():
        with pytest.raises(TimeoutError):
            async with refund(atb):
                raise TimeoutError("no answer")
        async with refund(atb):
            pytest.fail("an effect in doubt ran")

    with pytest.raises(EffectInDoubt) as raised:
        asyncio.run(agent())

    assert raised.value.case and raised.value.case.reason == "uncertain"
    with pytest.raises(EffectInDoubt, match="Still waiting"):
        asyncio.run(atb.wait_for("refund:42", timeout=0.2, poll=0.1))


def test_an_async_block_left_unsettled_raises(atb):
    async def agent():
        async with refund(atb):
            pass

    with pytest.raises(EffectUnsettled):
        asyncio.run(agent())

    assert asyncio.run(atb.flush())
    assert Case.objects.filter(reason="uncertain").count() == 1


def test_an_async_tool_is_recorded_once(atb: AsyncTallybook):
    calls = []

    @atb.tool("email:{to}", kind="email", target="fakesmtp", receipt="id")
    async def send_email(to: str) -> dict:
        calls.append(to)
        return {"id": f"msg-{len(calls)}", "to": to}

    async def agent():
        return [await send_email("ann@example.com") for _ in range(2)]

    first, again = asyncio.run(agent())

    assert calls == ["ann@example.com"]
    assert first == again == {"id": "msg-1", "to": "ann@example.com"}
