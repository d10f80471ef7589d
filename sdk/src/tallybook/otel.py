"""OpenTelemetry: file every span under the Tallybook run current where it starts.

    from tallybook.otel import RunSpanProcessor
    provider.add_span_processor(RunSpanProcessor())

Spans started inside `tb.run(...)` (a framework's model and tool spans included) carry
the run's id as `tallybook.run.id`, the attribute the server files trajectories by.
Needs the OpenTelemetry SDK's `TracerProvider`, which calls it; it imports nothing.
"""

from __future__ import annotations

from typing import Any

from tallybook import scope

RUN_ID = "tallybook.run.id"  # the server's trajectories/semconv.py reads this


class RunSpanProcessor:
    """A span processor that stamps the current Tallybook run id on each span it starts."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        run_id = scope.current_run()
        if run_id is not None:
            span.set_attribute(RUN_ID, run_id)

    def _on_ending(self, span: Any) -> None:
        """Called by newer SDKs while a span ends; nothing to do here."""

    def on_end(self, span: Any) -> None:
        """Nothing to do when a span has ended."""

    def shutdown(self) -> None:
        """Holds nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install(tracer_provider: Any = None) -> RunSpanProcessor:
    """Add a RunSpanProcessor to `tracer_provider`, else to the global one; one line."""
    if tracer_provider is None:
        from opentelemetry import trace

        tracer_provider = trace.get_tracer_provider()
    if not hasattr(tracer_provider, "add_span_processor"):
        raise TypeError(
            f"{type(tracer_provider).__name__} takes no span processors: install "
            "opentelemetry-sdk and set a TracerProvider first"
        )
    processor = RunSpanProcessor()
    tracer_provider.add_span_processor(processor)
    return processor
