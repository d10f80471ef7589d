"""The agent framework integrations (LangGraph, the OpenAI Agents SDK, pydantic-ai), one
scenario table run per integration on its framework's own test model and a live server: the
tool call a model asks for is an effect linked to its tool span and model span and never
repeated, a crash between the refund and its receipt leaves a case and no second refund, a
grant requiring approval stops the call until an operator approves it in the desk; and what
one framework alone has (OpenInference's spans, a recovered DBOS workflow, ...). A scenario
that does not apply to an integration is skipped by the table, saying why.

The adapters, which ask each framework's agent and say what came of it in the same terms,
are in tests/sdk/agents_support.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tallybook import Tallybook
from tallybook.integrations._tool_calls import default_key

from durability.models import Approval, Case, Effect, Receipt, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk import pydantic_ai_agent
from tests.sdk.agents_support import (
    DEFAULT_KEY,
    INTEGRATIONS,
    KEY,
    RUN_ID,
    Integration,
    Provider,
    integration,
    langgraph_agent,
    langgraph_run,
    openai_agent,
    openai_run,
    refunded,
)
from tests.sdk.support import FAST, alongside, wait_until
from tests.trajectories.support import queue, work
from trajectories.models import Run, Span

__all__ = ["queue"]  # the RQ queue fixture, used by name


def only(*names: str, why: str) -> Any:
    """The table's column of integrations for a scenario: run for `names`, skipped (saying
    `why`) for the others."""
    return pytest.mark.parametrize(
        "name",
        [
            pytest.param(n, marks=() if n in names else pytest.mark.skip(reason=f"{n}: {why}"))
            for n in INTEGRATIONS
        ],
    )


every = pytest.mark.parametrize("name", INTEGRATIONS)


@pytest.fixture
def agents(
    request: pytest.FixtureRequest, name: str, tmp_path: Path, live_server: Any, api_key: str
) -> Iterator[Integration]:
    """The integration `name`'s adapter, on the live server with this test's API key."""
    client = request.getfixturevalue("atb" if name == "pydantic_ai" else "tb")
    adapter = integration(name, tmp_path / "fakepay-ledger.txt", live_server, api_key, client)
    yield adapter
    adapter.close()


def _links(api: Any, queue: Any, key: str) -> dict[str, Any] | None:
    work(queue)  # the linking jobs
    body = api.get("effects", key=key).json()
    return body if body.get("tool_span_id") and body.get("model_span_id") else None


@every
def test_a_tool_call_is_an_effect_linked_to_its_tool_and_model_spans_and_never_repeated(
    agents, name, api, queue, project, intents_posted
):
    g = grant(project, name="refunds")
    key = agents.keys["docs"]

    first = agents.ask(g.pk)

    assert (first.output, first.stopped) == (agents.output, [])
    assert refunded(agents.ledger) == [str(agents.order)]
    effect = Effect.objects.get(key=key)
    assert (effect.state, effect.tool_call_id, effect.run_id) == (
        State.SUCCEEDED,
        agents.call,
        RUN_ID,
    )
    assert effect.request == {"order": agents.order}
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id) == ("fakepay", agents.external_id)
    assert receipt.data == agents.receipt_data
    # One intent for the call (the OpenAI Agents SDK's `needs_approval` records it, the
    # invocation uses its answer).
    assert intents_posted["intents"] == 1
    wait_until(lambda: _links(api, queue, key), what="the effect's links to its spans")
    links = _links(api, queue, key)
    assert links is not None and links["effect"]["state"] == "succeeded"
    tool = Span.objects.get(span_id=links["tool_span_id"])
    model = Span.objects.get(span_id=links["model_span_id"])
    assert (tool.kind, tool.tool_call_id) == ("tool", agents.call)
    assert tool.name == "execute_tool refund"
    assert model.kind == "model" and model.run == tool.run
    assert links["run_id"] == RUN_ID
    if (spans := agents.expected_spans()) is not None:
        # The framework's own spans, as this test holds them: the very ones linked.
        assert (links["tool_span_id"], links["model_span_id"]) == spans
    # The spans are filed under the run the effect names, named for the agent and ended
    # with its final output.
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {RUN_ID}
    wait_until(lambda: Run.objects.filter(run_id=RUN_ID, status="ok").exists(), what="its end")
    run = Run.objects.get(run_id=RUN_ID)
    assert (run.agent, run.inferred, run.ended is not None) == (agents.agent, False, True)

    # The same run asked again for the same call (a resumed conversation): not repeated, the
    # stored result answers it.
    again = agents.ask(g.pk)

    assert again.output == agents.output
    assert refunded(agents.ledger) == [str(agents.order)], "the refund was repeated"
    assert again.answer == agents.answer
    assert intents_posted["intents"] == 2


@pytest.mark.parametrize(
    ("name", "declared"),
    [
        pytest.param(name, declared, marks=skip)
        for name in INTEGRATIONS
        for declared, skip in [
            ("docs", ()),
            (
                "default",
                pytest.mark.skip(reason="pydantic-ai: the docs' declaration is the default key")
                if name == "pydantic_ai"
                else (),
            ),
        ]
    ],
)
def test_a_crash_between_the_refund_and_its_receipt_leaves_a_case_and_no_repeat(
    name, declared, tmp_path, live_server, api_key, spool_root, project
):
    agents = integration(name, tmp_path / "fakepay-ledger.txt", live_server, api_key, None)
    g = grant(project, name="refunds")
    code, _ = agents.process(live_server, api_key, spool_root, g.pk, crash=True, declared=declared)
    assert code == -9
    assert refunded(agents.ledger) == [str(agents.order)]

    # The restarted agent's model asks for the same refund under a new tool call id.
    code, out = agents.process(
        live_server, api_key, spool_root, g.pk, call_id=f"{agents.call}b", declared=declared
    )

    cases = agents.in_doubt(code, out)
    assert refunded(agents.ledger) == [str(agents.order)], "the refund was repeated"
    assert Effect.objects.count() == 1
    effect = Effect.objects.get(key=agents.keys[declared])
    assert effect.state == State.TIMED_OUT
    case = Case.objects.get(effect=effect, reason="uncertain", closed=None)
    # The case the agent was told of, where its framework says it.
    for url in cases:
        assert url is None or url.endswith(case.get_absolute_url()), url


@every
def test_a_grant_requiring_approval_stops_the_call_until_an_operator_approves_it(
    agents, name, project, alice
):
    g = grant(project, name="refunds", requires_approval=True)

    held = agents.ask(g.pk)

    assert held.stopped == ["refund"]
    assert held.cases == (["approval_required"] if agents.reports_case else [None])
    assert refunded(agents.ledger) == [], "the tool ran before anyone approved it"
    approval = Approval.objects.get(effect__key=agents.keys["docs"])
    for reason in held.reasons:
        assert f"/approvals/{approval.pk}/" in reason

    if name == "pydantic_ai":
        # Resuming before the operator decided asks again, and is held again (the other
        # frameworks' resume waits for the decision).
        held = agents.resume(held)
        assert held.stopped == ["refund"] and refunded(agents.ledger) == []

    signed = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked the order"}
    )
    assert signed.status_code in (200, 302)

    done = agents.resume(held)

    assert (done.output, done.stopped) == (agents.output, [])
    assert refunded(agents.ledger) == [str(agents.order)]
    assert Effect.objects.get(key=agents.keys["docs"]).state == State.SUCCEEDED


@only("langgraph", why="OpenInference's spans are tested under LangGraph")
def test_under_openinference_the_conversation_is_one_run_and_the_effect_links_to_its_spans(
    name, live_server, api_key, spool_root, api, queue, project, tmp_path
):
    """LangGraph traced by OpenInference (its spans, not the integration's: spans=False):
    its trace, the integration's spans and the effect are one run, and the effect links to
    OpenInference's TOOL span, whose call id is only in its output."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    provider = Provider(tmp_path / "fakepay-ledger.txt")
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
    wait_until(lambda: _links(api, queue, KEY), what="the effect's links to its spans")
    links = _links(api, queue, KEY)
    assert links is not None
    tool = Span.objects.get(span_id=links["tool_span_id"])
    model = Span.objects.get(span_id=links["model_span_id"])
    assert (tool.name, tool.kind, tool.tool_call_id) == ("refund", "tool", "call_refund_7")
    assert model.kind == "model"
    # One conversation, one run: OpenInference's trace, the agent's span and the effect.
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {"ticket-7"}
    assert list(Run.objects.values_list("run_id", "agent", "status")) == [
        ("ticket-7", "support", "ok")
    ]


@only("openai_agents", why="a tool declaring no receipt is tested under the OpenAI Agents SDK")
def test_a_tool_declaring_no_receipt_is_on_record_with_no_provider_id(
    name, tb, project, alice, tmp_path
):
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    provider = Provider(tmp_path / "fakepay-ledger.txt")
    g = grant(project, name="refunds")

    asyncio.run(openai_run(openai_agent(provider, tb, g.pk, declared="default"), tb))

    effect = Effect.objects.get(key=DEFAULT_KEY)
    receipt = Receipt.objects.get(effect=effect)
    assert str(receipt) == "no provider id (tool call call_refund_7)"
    page = logged_in(alice).get(effect.get_absolute_url()).content.decode()
    assert "no provider id (tool call call_refund_7)" in page


# What pydantic-ai's Effects capability alone has: a denial the model sees, the interruption
# report raised, tools left undeclared, waiting for the approval, every call an effect by
# default, and a DBOS workflow recovered after a crash.
PYDANTIC_AI = "pydantic-ai's Effects capability alone has it"


@only("pydantic_ai", why=PYDANTIC_AI)
def test_a_refused_effect_is_a_failed_tool_call_the_model_sees(agents, name, project):
    closed = grant(project, name="refunds", max_amount="10", currency="EUR")
    over = {"value": "250.00", "currency": "EUR"}
    agent = agents.pydantic_agent(authority={"grant": closed.pk}, amount=over)

    result = agent.run_sync("Refund order 42", conversation_id=RUN_ID)

    assert result.output.startswith("Could not refund: ")
    assert "denied" in result.output and "max_amount" in result.output
    assert refunded(agents.ledger) == []


@only("pydantic_ai", why=PYDANTIC_AI)
def test_an_effect_in_doubt_stops_the_run_with_the_interruption_report(agents, name, api):
    from tallybook import EffectInDoubt

    key = agents.keys["docs"]
    # The intent the agent itself would have sent: its tool effect names no grant.
    api.intent(key, kind="payment", target="fakepay", request={"order": 42}, authority=None)
    api.timeout(key)
    agent = agents.pydantic_agent()

    with pytest.raises(EffectInDoubt, match=r"Case #\d+ \(uncertain\)"):
        asyncio.run(agent.run("Refund order 42", conversation_id=RUN_ID))


@only("pydantic_ai", why=PYDANTIC_AI)
def test_tools_not_declared_run_unrecorded(agents, name):
    from tallybook.integrations.pydantic_ai import Effects

    agent = pydantic_ai_agent.agent(
        agents.ledger,
        Effects(agents.client, tools={"other": {"kind": "email", "target": "smtp"}}),
        output_type=str,
    )

    assert agent.run_sync("Refund order 42").output == "Refunded: re_42"
    assert not Effect.objects.exists()
    assert refunded(agents.ledger) == ["42"]


@only("pydantic_ai", why=PYDANTIC_AI)
def test_waiting_for_the_approval_runs_the_tool_once_the_desk_approves(
    agents, name, project, alice
):
    gate = grant(project, name="refunds", requires_approval=True)
    key = agents.keys["docs"]
    agent = agents.pydantic_agent(authority={"grant": gate.pk}, wait_for_approval=120)

    def operator() -> None:
        wait_until(lambda: Approval.objects.filter(effect__key=key).exists(), 60, "the approval")
        approval = Approval.objects.get(effect__key=key)
        logged_in(alice).post(
            f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "fine"}
        )

    with alongside(operator):
        result = agent.run_sync("Refund order 42", conversation_id=RUN_ID)

    assert result.output == "Refunded: re_42"
    assert refunded(agents.ledger) == ["42"]


@only("pydantic_ai", why=PYDANTIC_AI)
def test_without_declarations_every_tool_call_is_an_effect(agents, name):
    from tallybook.integrations.pydantic_ai import Effects

    agent = pydantic_ai_agent.agent(agents.ledger, Effects(agents.client), output_type=str)

    assert agent.run_sync("Refund order 42", conversation_id=RUN_ID).output == "Refunded: re_42"
    agents.flush()
    effect = Effect.objects.get(key=agents.keys["docs"])
    assert (effect.kind, effect.target, effect.replay) == ("tool_call", "refund", "never")
    assert Receipt.objects.get(effect=effect).external_id == pydantic_ai_agent.CALL


@pytest.fixture
def dbos_database(transactional_db: None) -> Iterator[str]:
    """A DBOS system database of its own on the test database's server; dropped after."""
    s = connection.settings_dict
    name = f"{s['NAME']}_dbos"
    yield f"postgresql://{s['USER']}@{s['HOST']}:{s['PORT'] or 5432}/{name}"
    with psycopg.connect(
        dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"] or 5432, autocommit=True
    ) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@only("pydantic_ai", why="pydantic-ai's DBOS durability alone is tested with DBOS")
def test_under_dbos_a_recovered_workflow_answers_a_crashed_tool_call_with_a_case(
    name, live_server, api_key, spool_root, tmp_path, dbos_database
):
    ledger = tmp_path / "fakepay-ledger.txt"
    key = default_key("refund", RUN_ID, {"order": 42})
    agent = ("--dbos", dbos_database)
    code, _ = pydantic_ai_agent.run(live_server.url, api_key, spool_root, ledger, *agent, "--crash")
    assert code == -9
    assert refunded(ledger) == ["42"]

    code, out = pydantic_ai_agent.run(live_server.url, api_key, spool_root, ledger, *agent)

    assert isinstance(out, dict) and (code, out["outcome"]) == (3, "in_doubt"), out
    assert refunded(ledger) == ["42"], "the recovered workflow repeated the refund"
    effect = Effect.objects.get(key=key)
    assert effect.state == State.TIMED_OUT
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()
