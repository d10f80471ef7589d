"""OpenTelemetry: intents and receipts carry the tool call's span, and each effect gets a span."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tallybook import Tallybook, current_run
from tallybook.otel import RUN_ID, install

from durability.models import Attempt, Effect, Receipt
from tests.sdk.support import FAST
from trajectories import semconv


@pytest.fixture
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def traced(live_server, api_key, spool_root, exported):
    client = Tallybook(
        live_server.url, api_key, spool=spool_root, tracer_provider=exported[0], **FAST
    )
    yield client
    client.close()


def hex_ids(span):
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_intent_and_receipt_link_to_the_tool_call_span(traced, exported):
    provider, exporter = exported
    tracer = provider.get_tracer("agent")
    with (
        tracer.start_as_current_span("execute_tool refund") as tool,
        traced.effect("refund:42", kind="payment", target="fakepay") as fx,
    ):
        fx.receipt(system="fakepay", external_id="re_1")

    assert traced.flush()
    trace_id, span_id = hex_ids(tool)
    attempt = Attempt.objects.get(effect__key="refund:42")
    assert (attempt.trace_id, attempt.span_id) == (trace_id, span_id)
    effect = Effect.objects.get(key="refund:42")
    assert (effect.trace_id, effect.span_id) == (trace_id, span_id)
    receipt = Receipt.objects.get()
    assert (receipt.trace_id, receipt.span_id) == (trace_id, span_id)
    effect_span = next(s for s in exporter.get_finished_spans() if s.name.startswith("tallybook"))
    assert effect_span.parent.span_id == tool.get_span_context().span_id
    assert effect_span.attributes["tallybook.key"] == "refund:42"
    assert effect_span.attributes["tallybook.decision"] == "proceed"


def test_without_a_surrounding_span_the_effect_links_to_its_own(traced, exported):
    with traced.effect("refund:42", kind="payment", target="fakepay") as fx:
        fx.receipt(system="fakepay", external_id="re_1")

    (span,) = exported[1].get_finished_spans()
    assert Attempt.objects.get().span_id == hex_ids(span)[1]


def test_a_failed_effect_marks_its_span_as_an_error(traced, exported):
    with pytest.raises(TimeoutError), traced.effect("refund:42", kind="payment", target="x"):
        raise TimeoutError("no answer")

    (span,) = exported[1].get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert span.events[0].name == "exception"


def test_without_a_tracer_provider_ids_come_from_the_current_span_only(tb, exported):
    provider, exporter = exported
    tracer = provider.get_tracer("agent")
    with (
        tracer.start_as_current_span("tool") as tool,
        tb.effect("refund:42", kind="payment", target="fakepay") as fx,
    ):
        fx.receipt(system="fakepay", external_id="re_1")

    assert Attempt.objects.get().span_id == hex_ids(tool)[1]
    assert [s.name for s in exporter.get_finished_spans()] == ["tool"]


def test_the_run_span_processor_files_every_span_under_the_current_run(tb, exported):
    provider, exporter = exported
    install(provider)
    tracer = provider.get_tracer("a framework")

    with tb.run("refund-bot", run_id="ticket-7"):
        assert tb.current_run() == current_run() == "ticket-7"
        with tracer.start_as_current_span("chat gpt-x"), tracer.start_as_current_span("tool"):
            pass
    with tracer.start_as_current_span("outside"):
        assert tb.current_run() is None

    runs = {span.name: span.attributes.get(RUN_ID) for span in exporter.get_finished_spans()}
    assert runs == {"chat gpt-x": "ticket-7", "tool": "ticket-7", "outside": None}
    assert RUN_ID == semconv.RUN_ID
