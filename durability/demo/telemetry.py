"""The demo agents' trajectories: OpenTelemetry spans in the GenAI semantic conventions,
exported over OTLP/HTTP to Tallybook's `/v1/traces` with the agent's API key.

Each ticket an agent works on is one trace: an `invoke_agent` span (the run), a `chat`
span (the model request that decided what to do, with the tool call it asked for in its
output messages) and an `execute_tool` span (the tool call, inside which the effect is
recorded, so Tallybook links the effect to both).
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

MODEL = "demo-planner-1"
log = logging.getLogger("durability.demo")


def tracer_provider(agent: str, version: str, url: str, api_key: str) -> TracerProvider:
    """A provider that batches spans to Tallybook in the background (never blocking the agent)."""
    resource = Resource.create({"service.name": agent, "service.version": version})
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(
        endpoint=f"{url.rstrip('/')}/v1/traces",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=2000))
    return provider


class Trajectory:
    """The spans of one agent's work, named as the GenAI conventions name them, and the run
    events that say how each run went (POST /api/v1/events)."""

    def __init__(
        self, provider: TracerProvider, agent: str, version: str, url: str, api_key: str
    ) -> None:
        self.tracer = provider.get_tracer("durability.demo")
        self.agent, self.version = agent, version
        self.url, self.api_key = url.rstrip("/"), api_key
        self.run_id = ""

    def report(self, run_id: str, status: str, started: datetime, ended: bool) -> None:
        """Name the run and say how it went: `running` while it waits for a person."""
        event = {
            "id": f"{run_id}:{time.time_ns()}",
            "type": "run",
            "run_id": run_id,
            "agent": self.agent,
            "workflow": self.agent,
            "workflow_version": self.version,
            "status": status,
            "started": started.isoformat(),
            "ended": datetime.now(UTC).isoformat() if ended else None,
        }
        request = urllib.request.Request(
            f"{self.url}/api/v1/events",
            json.dumps({"events": [event]}).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                pass
        except (urllib.error.URLError, OSError) as exc:
            # Telemetry never stops the agent; the run's spans still tell most of it.
            log.warning("could not report run %s: %s", run_id, exc)

    @contextmanager
    def run(self, run_id: str, task: str) -> Iterator[trace.Span]:
        """The agent's span around one ticket; Tallybook files its spans under `run_id`."""
        self.run_id = run_id
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.agent,
            "gen_ai.conversation.id": run_id,
            "tallybook.run.id": run_id,
            "tallybook.workflow": self.agent,
            "tallybook.workflow.version": self.version,
            "input.value": task,
        }
        with self.tracer.start_as_current_span(
            f"invoke_agent {self.agent}", attributes=attributes
        ) as span:
            yield span

    def plan(self, task: str, tool: str, arguments: dict[str, Any]) -> str:
        """A model request that answers `task` with a call of `tool`; returns the call's id.

        There is no model: the span says what one would have said, with plausible usage.
        """
        call_id = "call_" + secrets.token_hex(8)
        asked = [{"role": "user", "parts": [{"type": "text", "content": task}]}]
        answered = [
            {
                "role": "assistant",
                "parts": [
                    {"type": "tool_call", "id": call_id, "name": tool, "arguments": arguments}
                ],
                "finish_reason": "tool_call",
            }
        ]
        attributes: dict[str, str | int] = {
            # On every span, not only the root: a batch may reach Tallybook before its root.
            "tallybook.run.id": self.run_id,
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "demo",
            "gen_ai.request.model": MODEL,
            "gen_ai.response.model": MODEL,
            "gen_ai.usage.input_tokens": random.randint(300, 1200),
            "gen_ai.usage.output_tokens": random.randint(20, 90),
            "gen_ai.input.messages": json.dumps(asked),
            "gen_ai.output.messages": json.dumps(answered),
        }
        with self.tracer.start_as_current_span(f"chat {MODEL}", attributes=attributes):
            time.sleep(random.uniform(0.05, 0.2))
        return call_id

    @contextmanager
    def tool(self, tool: str, call_id: str, arguments: dict[str, Any]) -> Iterator[trace.Span]:
        """The tool call the model asked for; record the effect inside it."""
        attributes = {
            "tallybook.run.id": self.run_id,
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": json.dumps(arguments),
        }
        with self.tracer.start_as_current_span(
            f"execute_tool {tool}", attributes=attributes
        ) as span:
            yield span
