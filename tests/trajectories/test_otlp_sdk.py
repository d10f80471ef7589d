"""A real OpenTelemetry SDK exports GenAI spans to a live server, as protobuf (the OTLP/HTTP
exporter) and as OTLP/JSON; an effect recorded inside the tool span links to it and to the
model span that asked for the tool, whichever arrives first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.trajectories.support import queue, to_json, work
from trajectories.models import Run, Span

__all__ = ["queue"]

CALL = "call_Kx81"
OUTPUT = [
    {
        "role": "assistant",
        "parts": [
            {"type": "text", "content": "Refunding order 42."},
            {"type": "tool_call", "id": CALL, "name": "refund", "arguments": {"order": 42}},
        ],
        "finish_reason": "tool_call",
    }
]


@dataclass
class AgentRun:
    spans: tuple[ReadableSpan, ...]
    trace_id: str
    tool_span_id: str
    model_span_id: str


@pytest.fixture
def agent_run() -> AgentRun:
    """An agent instrumented with the SDK: a model call asks for a tool, the tool runs."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "refund-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests")
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "refunds"}
    with tracer.start_as_current_span("invoke_agent refunds", attributes=agent):
        with tracer.start_as_current_span(
            "chat gpt-4o",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 321,
                "gen_ai.usage.output_tokens": 12,
                "gen_ai.output.messages": json.dumps(OUTPUT),
            },
        ) as model:
            pass
        with tracer.start_as_current_span(
            "execute_tool refund",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "refund",
                "gen_ai.tool.call.id": CALL,
                "gen_ai.tool.call.arguments": json.dumps(
                    {"order": 42, "api_key": "sk-live-0123456789abcdefghij"}
                ),
            },
        ) as tool:
            pass
    provider.shutdown()
    return AgentRun(
        spans=memory.get_finished_spans(),
        trace_id=format(tool.get_span_context().trace_id, "032x"),
        tool_span_id=format(tool.get_span_context().span_id, "016x"),
        model_span_id=format(model.get_span_context().span_id, "016x"),
    )


@dataclass
class Agent:
    """The agent's side of the wire: span export and the ledger API, on a live server."""

    url: str
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def export(self, spans: tuple[ReadableSpan, ...], *, as_json: bool) -> None:
        if as_json:
            body = json.dumps(to_json(encode_spans(spans)))
            headers = {**self.auth, "Content-Type": "application/json"}
            r = requests.post(f"{self.url}/v1/traces", data=body, headers=headers, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json() == {}
        else:
            exporter = OTLPSpanExporter(endpoint=f"{self.url}/v1/traces", headers=self.auth)
            assert exporter.export(spans) == SpanExportResult.SUCCESS

    def intent(self, run: AgentRun) -> int:
        body: dict[str, Any] = {
            "key": "refund:order-42",
            "kind": "refund",
            "target": "stripe",
            "request": {"order": 42},
            "trace_id": run.trace_id,
            "span_id": run.tool_span_id,
            "tool_call_id": CALL,
        }
        r = requests.post(f"{self.url}/api/v1/intents", json=body, headers=self.auth, timeout=10)
        assert r.status_code == 201, r.text
        return int(r.json()["effect"]["id"])

    def effect(self, effect_id: int) -> dict[str, object]:
        r = requests.get(f"{self.url}/api/v1/effects/{effect_id}", headers=self.auth, timeout=10)
        return dict(r.json())


@pytest.fixture
def agent(live_server, api_key) -> Agent:
    return Agent(live_server.url, api_key)


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_spans_exported_first_then_the_intent_link_the_effect(agent, agent_run, queue, as_json):
    agent.export(agent_run.spans, as_json=as_json)
    effect_id = agent.intent(agent_run)
    work(queue)
    body = agent.effect(effect_id)
    assert (body["run_id"], body["tool_span_id"], body["model_span_id"]) == (
        agent_run.trace_id,
        agent_run.tool_span_id,
        agent_run.model_span_id,
    )


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_the_intent_first_then_the_exported_spans_link_the_effect(agent, agent_run, queue, as_json):
    effect_id = agent.intent(agent_run)
    work(queue)
    assert agent.effect(effect_id)["tool_span_id"] is None
    agent.export(agent_run.spans, as_json=as_json)
    body = agent.effect(effect_id)
    assert (body["run_id"], body["tool_span_id"], body["model_span_id"]) == (
        agent_run.trace_id,
        agent_run.tool_span_id,
        agent_run.model_span_id,
    )


def test_the_exported_run_is_mapped_and_redacted(agent, agent_run):
    agent.export(agent_run.spans, as_json=False)
    run = Run.objects.get()
    assert (run.agent, run.span_count, run.input_tokens, run.status) == ("refunds", 3, 321, "ok")
    executed = Span.objects.get(span_id=agent_run.tool_span_id)
    assert executed.input == {"order": 42, "api_key": "[REDACTED]"}
    assert executed.resource["service.name"] == "refund-agent"
    assert Span.objects.get(span_id=agent_run.model_span_id).output == OUTPUT
