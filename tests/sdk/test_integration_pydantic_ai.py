"""pydantic-ai with the Effects capability, on pydantic-ai's FunctionModel and a live server:
the tool call a model asks for is recorded and linked to its spans, a crash between the
effect and its receipt leaves a case and no repeat, and an approval gate holds the tool as a
deferred call until an operator approves it in the desk."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import requests
from django.contrib.auth.models import User
from django.db import connection
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.instrumented import InstrumentationSettings
from tallybook import AsyncTallybook, EffectInDoubt
from tallybook.integrations._tool_calls import default_key
from tallybook.integrations.pydantic_ai import Effects, ToolEffect

from durability.models import Approval, Case, Effect, Project, Receipt, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk import pydantic_ai_agent as refunds
from tests.sdk.support import alongside, wait_until
from tests.trajectories.support import queue, work
from trajectories.models import Run, Span

__all__ = ["queue"]  # the RQ queue fixture, used by name

CONVERSATION = "ticket-7"
# The docs' first example declares no key: the run, the tool and the arguments' fingerprint.
KEY = default_key("refund", CONVERSATION, {"order": 42})


def delivered(atb):
    """Receipts go out in the background: wait until the spool is empty."""
    assert asyncio.run(atb.flush(timeout=60)), "the receipts were not delivered"


@pytest.fixture
def spans(live_server: Any, api_key: str) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """pydantic-ai's spans, sent to the live server as they end, and kept here to compare."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {api_key}"}
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, memory
    provider.shutdown()


def _agent(
    atb: AsyncTallybook, provider: TracerProvider, ledger: Path, **refund: Any
) -> Agent[None, str | DeferredToolRequests]:
    declared = cast(ToolEffect, {"kind": "payment", "target": "fakepay", **refund})
    return refunds.agent(
        ledger,
        Effects(atb, tools={"refund": declared}),
        Instrumentation(settings=InstrumentationSettings(tracer_provider=provider)),
        output_type=[str, DeferredToolRequests],
    )


def _status(live_server: Any, api_key: str, key: str) -> dict[str, Any]:
    r = requests.get(
        f"{live_server.url}/api/v1/effects",
        params={"key": key},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _hex(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


def test_the_tool_call_is_recorded_and_linked_to_its_tool_and_model_spans(
    atb, spans, live_server, api_key, queue, tmp_path
):
    provider, memory = spans
    ledger = tmp_path / "fakepay-ledger.txt"
    agent = _agent(atb, provider, ledger, receipt="refund_id")

    result = agent.run_sync("Refund order 42", conversation_id=CONVERSATION)

    assert result.output == "Refunded: re_42"
    delivered(atb)
    work(queue)
    finished = memory.get_finished_spans()
    tool = next(s for s in finished if s.name == "execute_tool refund")
    asked = next(s for s in finished if s.name.startswith("chat "))  # the first model request
    status = _status(live_server, api_key, KEY)
    assert status["effect"]["state"] == "succeeded"
    assert status["run_id"] == CONVERSATION
    assert (status["tool_span_id"], status["model_span_id"]) == (_hex(tool), _hex(asked))
    effect = Effect.objects.get(key=KEY)
    assert effect.tool_call_id == refunds.CALL and effect.request == {"order": 42}
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.external_id == "re_42"
    assert receipt.data == {"result": {"refund_id": "re_42", "order": 42}}
    # pydantic-ai's spans are filed under the run the effect names, named for the agent and
    # ended with its output.
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {CONVERSATION}
    run = Run.objects.get(run_id=CONVERSATION)
    assert (run.agent, run.status, run.ended is not None) == ("refunds", "ok", True)

    again = agent.run_sync("Refund order 42", conversation_id=CONVERSATION)

    assert again.output == "Refunded: re_42", "the stored result answers the repeated call"
    assert ledger.read_text() == "42\n", "the refund was repeated"


def test_a_crash_between_the_effect_and_its_receipt_leaves_a_case_and_no_repeat(
    live_server, api_key, spool_root, tmp_path
):
    ledger = tmp_path / "fakepay-ledger.txt"
    code, _ = refunds.run(live_server.url, api_key, spool_root, ledger, "--crash")
    assert code == -9
    assert ledger.read_text() == "42\n"

    # The restarted agent's model asks for the same refund under a new tool call id.
    code, out = refunds.run(live_server.url, api_key, spool_root, ledger, call="call_refund_42b")

    assert (code, out["outcome"]) == (3, "in_doubt")
    assert ledger.read_text() == "42\n", "the refund was repeated"
    effect = Effect.objects.get(key=KEY)
    assert effect.state == State.TIMED_OUT
    case = Case.objects.get(effect=effect, reason="uncertain", closed=None)
    assert out["case"].endswith(case.get_absolute_url())


def test_an_approval_gate_holds_the_tool_until_an_operator_approves_it_in_the_desk(
    atb, spans, project: Project, alice: User, tmp_path
):
    gate = grant(project, name="refunds", requires_approval=True)
    ledger = tmp_path / "fakepay-ledger.txt"
    agent = _agent(atb, spans[0], ledger, authority={"grant": gate.pk})

    held = agent.run_sync("Refund order 42", conversation_id=CONVERSATION)

    assert isinstance(held.output, DeferredToolRequests)
    (call,) = held.output.approvals
    approval = Approval.objects.get(effect__key=KEY)
    tallybook = held.output.metadata[call.tool_call_id]["tallybook"]
    assert tallybook["case"] == "approval_required"
    assert f"/approvals/{approval.pk}/" in tallybook["reason"]
    assert not ledger.exists(), "the tool ran before anyone approved it"

    # Resuming before the operator decided asks again, and is held again.
    approve = DeferredToolResults(approvals={call.tool_call_id: True})
    early = agent.run_sync(message_history=held.all_messages(), deferred_tool_results=approve)
    assert isinstance(early.output, DeferredToolRequests) and not ledger.exists()

    desk = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked the order"}
    )
    assert desk.status_code in (200, 302)
    done = agent.run_sync(message_history=early.all_messages(), deferred_tool_results=approve)

    assert done.output == "Refunded: re_42"
    assert ledger.read_text() == "42\n"
    delivered(atb)
    assert Effect.objects.get(key=KEY).state == State.SUCCEEDED


def test_a_refused_effect_is_a_failed_tool_call_the_model_sees(atb, spans, project, tmp_path):
    ledger = tmp_path / "fakepay-ledger.txt"
    closed = grant(project, name="refunds", max_amount="10", currency="EUR")
    over = {"value": "250.00", "currency": "EUR"}
    agent = _agent(atb, spans[0], ledger, authority={"grant": closed.pk}, amount=over)

    result = agent.run_sync("Refund order 42", conversation_id=CONVERSATION)

    assert result.output.startswith("Could not refund: ")
    assert "denied" in result.output and "max_amount" in result.output
    assert not ledger.exists()


def test_an_effect_in_doubt_stops_the_run_with_the_interruption_report(atb, spans, api, tmp_path):
    # The intent the agent itself would have sent: its tool effect names no grant.
    api.intent(KEY, kind="payment", target="fakepay", request={"order": 42}, authority=None)
    api.timeout(KEY)
    agent = _agent(atb, spans[0], tmp_path / "fakepay-ledger.txt")

    with pytest.raises(EffectInDoubt, match=r"Case #\d+ \(uncertain\)"):
        asyncio.run(agent.run("Refund order 42", conversation_id=CONVERSATION))


def test_tools_not_declared_run_unrecorded(atb, spans, tmp_path):
    ledger = tmp_path / "fakepay-ledger.txt"
    agent = refunds.agent(
        ledger,
        Effects(atb, tools={"other": {"kind": "email", "target": "smtp"}}),
        output_type=str,
    )

    assert agent.run_sync("Refund order 42").output == "Refunded: re_42"
    assert not Effect.objects.exists()
    assert ledger.read_text() == "42\n"


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


def test_under_dbos_a_recovered_workflow_answers_a_crashed_tool_call_with_a_case(
    live_server, api_key, spool_root, tmp_path, dbos_database
):
    ledger = tmp_path / "fakepay-ledger.txt"
    agent = ("--dbos", dbos_database)
    code, _ = refunds.run(live_server.url, api_key, spool_root, ledger, *agent, "--crash")
    assert code == -9
    assert ledger.read_text() == "42\n"

    code, out = refunds.run(live_server.url, api_key, spool_root, ledger, *agent)

    assert isinstance(out, dict) and (code, out["outcome"]) == (3, "in_doubt"), out
    assert ledger.read_text() == "42\n", "the recovered workflow repeated the refund"
    effect = Effect.objects.get(key=KEY)
    assert effect.state == State.TIMED_OUT
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()


def test_waiting_for_the_approval_runs_the_tool_once_the_desk_approves(
    atb, spans, project, alice, tmp_path
):
    gate = grant(project, name="refunds", requires_approval=True)
    ledger = tmp_path / "fakepay-ledger.txt"
    agent = _agent(atb, spans[0], ledger, authority={"grant": gate.pk}, wait_for_approval=120)

    def operator() -> None:
        wait_until(lambda: Approval.objects.filter(effect__key=KEY).exists(), 60, "the approval")
        approval = Approval.objects.get(effect__key=KEY)
        logged_in(alice).post(
            f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "fine"}
        )

    with alongside(operator):
        result = agent.run_sync("Refund order 42", conversation_id=CONVERSATION)

    assert result.output == "Refunded: re_42"
    assert ledger.read_text() == "42\n"


def test_without_declarations_every_tool_call_is_an_effect(atb, spans, tmp_path):
    agent = refunds.agent(tmp_path / "fakepay-ledger.txt", Effects(atb), output_type=str)

    assert agent.run_sync("Refund order 42", conversation_id=CONVERSATION).output == (
        "Refunded: re_42"
    )
    delivered(atb)
    effect = Effect.objects.get(key=KEY)
    assert (effect.kind, effect.target, effect.replay) == ("tool_call", "refund", "never")
    assert Receipt.objects.get(effect=effect).external_id == refunds.CALL
