"""OpenTelemetry through `opentelemetry-api` alone, and only when it is installed.

Intents and receipts carry the trace and span ids of the span current where the
effect block was entered (the tool call), so Tallybook links them to it. Around
each effect block a span is started, as a child of the current span, or as a root
when the client was given its own tracer provider; it records nothing unless a
tracer provider is configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # the SDK works without OpenTelemetry
    OTEL = False
else:
    OTEL = True

Ids = tuple[str | None, str | None]
RUN_ID = "tallybook.run.id"  # the server's trajectories/semconv.py reads this


@contextmanager
def agent_span(tracer_provider: Any, agent: str, run_id: str | None) -> Iterator[None]:
    """A current span around one invocation of an agent, filed under its run: the spans
    another instrumentation starts inside (OpenInference's) join its trace, so the
    conversation is one run. Records nothing unless a tracer provider is configured."""
    if not OTEL:
        yield
        return
    tracer = trace.get_tracer("tallybook", tracer_provider=tracer_provider)
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
    if run_id is not None:
        attributes[RUN_ID] = run_id
    with tracer.start_as_current_span(f"invoke_agent {agent}", attributes=attributes):
        yield


def current_ids() -> Ids:
    """The current span's (trace_id, span_id) in hex, or (None, None)."""
    if not OTEL:
        return None, None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None, None
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


class EffectSpan:
    """The span around one effect block, made current while the block runs."""

    def __init__(self, tracer_provider: Any, key: str, kind: str, target: str) -> None:
        self._provider = tracer_provider
        self._attributes = {
            "tallybook.key": key,
            "tallybook.kind": kind,
            "tallybook.target": target,
        }
        self._name = f"tallybook.effect {kind}"
        self._span: Any = None
        self._token: Any = None
        self.ids: Ids = (None, None)

    def start(self) -> None:
        ambient = current_ids()
        # Without a span current, a span of the global provider would be a trace of its own
        # (a one-span run beside the agent's): only a provider given to the client starts one.
        if not OTEL or (ambient[0] is None and self._provider is None):
            return
        tracer = trace.get_tracer("tallybook", tracer_provider=self._provider)
        self._span = tracer.start_span(self._name, attributes=self._attributes)
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        # Link to the caller's span (the tool call); to ours when the caller has none.
        self.ids = ambient if ambient[0] else current_ids()

    def receipt_ids(self) -> Ids:
        """The span a receipt links to: one current inside the body, else the intent's."""
        if OTEL and trace.get_current_span() is not self._span:
            ids = current_ids()
            if ids[0]:
                return ids
        return self.ids

    def note(self, **attributes: str | int) -> None:
        if self._span is not None:
            self._span.set_attributes({f"tallybook.{k}": v for k, v in attributes.items()})

    def end(self, exc: BaseException | None) -> None:
        if self._span is None:
            return
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
        otel_context.detach(self._token)
        self._span.end()
        self._span = None
