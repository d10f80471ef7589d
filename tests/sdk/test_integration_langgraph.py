"""The LangGraph integration: a fake chat model asks for a tool; the ToolNode's call is an
effect linked to its tool span and model span, a crash between the refund and its receipt
leaves a case and no second refund, and a grant requiring approval stops the graph with an
interrupt until an operator approves it in the desk."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tallybook import Tallybook

from durability.models import Approval, Case, Effect, Receipt, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk.agents_support import (
    DEFAULT_KEY,
    KEY,
    Provider,
    agent_process,
    langgraph_agent,
    langgraph_run,
)
from tests.sdk.support import FAST, wait_until
from tests.trajectories.support import queue, work
from trajectories.models import Run, Span

__all__ = ["queue"]


@pytest.fixture
def provider(tmp_path):
    return Provider(tmp_path / "fakepay-ledger.txt")


def _links(api, queue):
    work(queue)  # the linking jobs
    body = api.get("effects", key=KEY).json()
    return body if body.get("tool_span_id") and body.get("model_span_id") else None


def test_a_tool_call_is_an_effect_linked_to_its_tool_and_model_spans_and_never_repeated(
    tb, api, queue, project, provider
):
    g = grant(project, name="refunds")

    state = langgraph_run(langgraph_agent(provider, tb, g.pk), tb)
    assert tb.flush(timeout=60), "the receipts were not delivered"

    assert state["messages"][-1].text == "Done."
    assert provider.refunds() == ["7"]
    effect = Effect.objects.get(key=KEY)
    assert (effect.state, effect.tool_call_id, effect.run_id) == (
        State.SUCCEEDED,
        "call_refund_7",
        "ticket-7",
    )
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id) == ("fakepay", "re_7_1")
    assert receipt.data == {"result": '{"id": "re_7_1"}'}
    wait_until(lambda: _links(api, queue), what="the effect's links to its spans")
    links = _links(api, queue)
    tool = Span.objects.get(span_id=links["tool_span_id"])
    model = Span.objects.get(span_id=links["model_span_id"])
    assert (tool.kind, tool.tool_call_id) == ("tool", "call_refund_7")
    assert tool.name == "execute_tool refund"
    assert model.kind == "model" and model.run == tool.run
    assert links["run_id"] == "ticket-7"
    # The run is named for the agent, and ended with the graph.
    run = Run.objects.get(run_id="ticket-7")
    assert (run.agent, run.status, run.ended is not None) == ("support", "ok", True)

    # The same thread asked again for the same call (a resumed conversation): not repeated.
    again = langgraph_run(langgraph_agent(provider, tb, g.pk), tb)
    assert tb.flush(timeout=60), "the receipts were not delivered"
    assert again["messages"][-1].text == "Done."
    assert provider.refunds() == ["7"], "the refund was repeated"
    assert again["messages"][2].content == '{"id": "re_7_1"}'


@pytest.mark.parametrize(("declared", "key"), [("docs", KEY), ("default", DEFAULT_KEY)])
def test_a_crash_between_the_refund_and_its_receipt_leaves_a_case_and_no_repeat(
    live_server, api_key, spool_root, project, provider, declared, key
):
    g = grant(project, name="refunds")
    first = agent_process(
        "langgraph", live_server, api_key, spool_root, provider, g.pk, crash=True, declared=declared
    )
    assert first[0] == -9 and provider.refunds() == ["7"]

    # The restarted agent's model asks for the same refund under a new tool call id.
    code, out = agent_process(
        "langgraph",
        live_server,
        api_key,
        spool_root,
        provider,
        g.pk,
        call_id="call_refund_7b",
        declared=declared,
    )

    assert code == 0, out
    assert out["interrupted"] == ["refund"], "the call in doubt did not stop the graph"
    assert provider.refunds() == ["7"], "the refund was repeated"
    assert Effect.objects.count() == 1
    effect = Effect.objects.get(key=key)
    assert effect.state == State.TIMED_OUT
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()


def test_a_grant_requiring_approval_interrupts_the_graph_until_an_operator_approves_it(
    tb, project, alice, provider
):
    from tallybook.integrations.langgraph import settle

    g = grant(project, name="refunds", requires_approval=True)
    graph = langgraph_agent(provider, tb, g.pk)

    state = langgraph_run(graph, tb)
    assert tb.flush(timeout=60), "the receipts were not delivered"

    (stopped,) = state["__interrupt__"]
    assert stopped.value["case"] == "approval_required"
    assert provider.refunds() == []
    approval = Approval.objects.get(effect__key=KEY)
    signed = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked the order"}
    )
    assert signed.status_code in (200, 302)

    done = langgraph_run(graph, tb, settle(state, tb, timeout=120))
    assert tb.flush(timeout=60), "the receipts were not delivered"

    assert "__interrupt__" not in done
    assert done["messages"][-1].text == "Done."
    assert provider.refunds() == ["7"]
    assert Effect.objects.get(key=KEY).state == State.SUCCEEDED


def test_under_openinference_the_conversation_is_one_run_and_the_effect_links_to_its_spans(
    live_server, api_key, spool_root, api, queue, project, provider
):
    """LangGraph traced by OpenInference (its spans, not the integration's: spans=False):
    its trace, the integration's spans and the effect are one run, and the effect links to
    OpenInference's TOOL span, whose call id is only in its output."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    g = grant(project, name="refunds")
    otel = TracerProvider()
    # Batched, as in production: the conversation's spans arrive in one export.
    otel.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"{live_server.url}/v1/traces",
                headers={"Authorization": f"Bearer {api_key}"},
            )
        )
    )
    tb = Tallybook(live_server.url, api_key, spool=spool_root, tracer_provider=otel, **FAST)
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=otel)
    try:
        state = langgraph_run(langgraph_agent(provider, tb, g.pk, spans=False), tb)
        assert tb.flush(timeout=60), "the receipts were not delivered"
    finally:
        instrumentor.uninstrument()
        otel.shutdown()  # exports what is left
        tb.close()

    assert state["messages"][-1].text == "Done."
    wait_until(lambda: _links(api, queue), what="the effect's links to its spans")
    links = _links(api, queue)
    tool = Span.objects.get(span_id=links["tool_span_id"])
    model = Span.objects.get(span_id=links["model_span_id"])
    assert (tool.name, tool.kind, tool.tool_call_id) == ("refund", "tool", "call_refund_7")
    assert model.kind == "model"
    # One conversation, one run: OpenInference's trace, the agent's span and the effect.
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {"ticket-7"}
    assert list(Run.objects.values_list("run_id", "agent", "status")) == [
        ("ticket-7", "support", "ok")
    ]
