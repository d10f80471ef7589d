"""The OpenAI Agents SDK integration: the framework's scripted test model asks for a tool;
the call is an effect linked to its tool span and model span, a crash between the refund and
its receipt leaves a case and no second refund, and a grant requiring approval stops the
call until an operator approves it in the desk."""

from __future__ import annotations

import asyncio

import pytest
from agents import Runner, set_tracing_disabled

from durability.models import Approval, Case, Effect, Receipt, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk.agents_support import (
    DEFAULT_KEY,
    KEY,
    RUN_ID,
    Provider,
    agent_process,
    openai_agent,
    openai_run,
)
from tests.sdk.support import wait_until
from tests.trajectories.support import queue, work
from trajectories.models import Run, Span

__all__ = ["queue"]


@pytest.fixture(autouse=True)
def _no_tracing_export():
    """The framework's own tracing would export to its vendor: offline, it records nothing."""
    set_tracing_disabled(True)


@pytest.fixture
def provider(tmp_path):
    return Provider(tmp_path / "fakepay-ledger.txt")


def _links(api, queue):
    work(queue)  # the linking jobs
    body = api.get("effects", key=KEY).json()
    return body if body.get("tool_span_id") and body.get("model_span_id") else None


def test_a_tool_call_is_an_effect_linked_to_its_tool_and_model_spans_and_never_repeated(
    tb, api, queue, project, provider, intents_posted
):
    g = grant(project, name="refunds")
    agent = openai_agent(provider, tb, g.pk)

    result = asyncio.run(openai_run(agent, tb))

    assert result.final_output == "Done."
    assert provider.refunds() == ["7"]
    effect = Effect.objects.get(key=KEY)
    assert (effect.state, effect.tool_call_id, effect.run_id) == (
        State.SUCCEEDED,
        "call_refund_7",
        "ticket-7",
    )
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id) == ("fakepay", "re_7_1")
    assert receipt.data == {"result": {"id": "re_7_1"}}
    # One intent for the call: `needs_approval` recorded it, the invocation used its answer.
    assert intents_posted["intents"] == 1
    wait_until(lambda: _links(api, queue), what="the effect's links to its spans")
    links = _links(api, queue)
    tool = Span.objects.get(span_id=links["tool_span_id"])
    model = Span.objects.get(span_id=links["model_span_id"])
    assert (tool.kind, tool.tool_call_id) == ("tool", "call_refund_7")
    assert tool.name == "execute_tool refund"
    assert model.kind == "model" and model.run == tool.run
    assert links["run_id"] == "ticket-7"
    # The run is named for the agent, and ended with its final output.
    wait_until(lambda: Run.objects.filter(run_id=RUN_ID, status="ok").exists(), what="its end")
    run = Run.objects.get(run_id=RUN_ID)
    assert (run.agent, run.inferred, run.ended is not None) == ("support", False, True)

    # The same run asked again for the same call (a resumed conversation): not repeated.
    again = asyncio.run(openai_run(openai_agent(provider, tb, g.pk), tb))
    assert again.final_output == "Done."
    assert provider.refunds() == ["7"], "the refund was repeated"
    tool_output = next(i for i in again.new_items if i.type == "tool_call_output_item")
    assert tool_output.output == {"id": "re_7_1"}
    assert intents_posted["intents"] == 2


@pytest.mark.parametrize(("declared", "key"), [("docs", KEY), ("default", DEFAULT_KEY)])
def test_a_crash_between_the_refund_and_its_receipt_leaves_a_case_and_no_repeat(
    live_server, api_key, spool_root, project, provider, declared, key
):
    g = grant(project, name="refunds")
    first = agent_process(
        "openai", live_server, api_key, spool_root, provider, g.pk, crash=True, declared=declared
    )
    assert first[0] == -9 and provider.refunds() == ["7"]

    # The restarted agent's model asks for the same refund under a new tool call id.
    code, out = agent_process(
        "openai",
        live_server,
        api_key,
        spool_root,
        provider,
        g.pk,
        call_id="call_refund_7b",
        declared=declared,
    )

    assert code == 0, out
    assert out["interrupted"] == ["refund"], "the call in doubt was not stopped"
    assert provider.refunds() == ["7"], "the refund was repeated"
    assert Effect.objects.count() == 1
    effect = Effect.objects.get(key=key)
    assert effect.state == State.TIMED_OUT
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()


def test_a_grant_requiring_approval_stops_the_call_until_an_operator_approves_it(
    tb, project, alice, provider
):
    from tallybook.integrations.openai_agents import settle

    g = grant(project, name="refunds", requires_approval=True)
    agent = openai_agent(provider, tb, g.pk)

    result = asyncio.run(openai_run(agent, tb))

    assert [item.tool_name for item in result.interruptions] == ["refund"]
    assert provider.refunds() == []
    approval = Approval.objects.get(effect__key=KEY)
    signed = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked the order"}
    )
    assert signed.status_code in (200, 302)

    async def resume():
        with tb.run("support-bot", version="1.0", run_id=RUN_ID):
            state = await settle(agent, result, timeout=120)
            return await Runner.run(agent, state)

    done = asyncio.run(resume())
    assert done.final_output == "Done."
    assert provider.refunds() == ["7"]
    assert tb.flush(timeout=60), "the receipts were not delivered"
    assert Effect.objects.get(key=KEY).state == State.SUCCEEDED


def test_a_tool_declaring_no_receipt_is_on_record_with_no_provider_id(tb, project, alice, provider):
    g = grant(project, name="refunds")

    asyncio.run(openai_run(openai_agent(provider, tb, g.pk, declared="default"), tb))

    effect = Effect.objects.get(key=DEFAULT_KEY)
    receipt = Receipt.objects.get(effect=effect)
    assert str(receipt) == "no provider id (tool call call_refund_7)"
    page = logged_in(alice).get(effect.get_absolute_url()).content.decode()
    assert "no provider id (tool call call_refund_7)" in page
