"""The Temporal integration against a real Temporal server (the CLI's dev server, offline): a
declared activity is an effect whose key survives Temporal's retries, a late result Temporal
drops is recorded as evidence, a killed worker's effect is not repeated by the retry, an
approval holds the activity until an operator signs it, and an effect done before is answered
with its stored result. The fake provider's ledger is the ground truth."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tallybook.integrations.temporal import effect
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.exceptions import ApplicationError

from durability.models import Approval, Attempt, Case, Effect, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk.agents_support import Provider
from tests.sdk.support import wait_until
from tests.sdk.temporal_support import (
    KEY,
    Job,
    Temporal,
    refund_activity,
    task_queue,
    worker_process,
)
from tests.trajectories.support import queue, work
from trajectories.models import Span

pytestmark = pytest.mark.timeout(180)
__all__ = ["queue"]


@pytest.fixture(scope="module")
def temporal() -> Iterator[Temporal]:
    server = Temporal()
    yield server
    server.close()


@pytest.fixture
def provider(tmp_path):
    return Provider(tmp_path / "fakepay-ledger.txt")


class ProviderDown(Exception):
    """The provider refused the connection: nothing happened."""


def _cases(reason: str) -> Any:
    return Case.objects.filter(effect__key=KEY, reason=reason)


def test_a_retried_activity_is_one_effect_linked_to_the_activity_span(
    temporal, atb, provider, api, api_key, live_server, queue
):
    calls = []

    @effect(kind="payment", target="fakepay", receipt="id", definitive_on=(ProviderDown,))
    @activity.defn(name="refund")
    def refund(order: int) -> dict[str, str]:
        calls.append(activity.info().attempt)
        if len(calls) == 1:
            raise ProviderDown("connection refused")
        return {"id": provider.refund(order)}

    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    tracer = TracingInterceptor(tracing.get_tracer("test"))
    queue_name = task_queue()
    with temporal.worker(atb, [refund], task_queue=queue_name, interceptors=[tracer]):
        result = temporal.run(temporal.start(Job(order=7), task_queue=queue_name).result())

    assert result == {"id": "re_7_1"}
    assert calls == [1, 2] and provider.refunds() == ["7"]
    assert temporal.run(atb.flush(30)), "the receipt was not delivered"
    effect_ = Effect.objects.get()  # the undeclared lookup is no effect
    assert (effect_.key, effect_.state, effect_.attempt_count) == (KEY, State.SUCCEEDED, 2)
    assert (effect_.run_id, effect_.tool_call_id, effect_.timeout_s) == ("order-7", "order-7:2", 60)
    assert effect_.workflow == "RefundWorkflow"

    # Temporal's spans, exported to Tallybook: the attempt that did it is the effect's tool span.
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {api_key}"}
    )
    assert exporter.export(spans.get_finished_spans()) == SpanExportResult.SUCCESS
    run_activity = [s for s in spans.get_finished_spans() if s.name == "RunActivity:refund"][-1]
    span_id = format(run_activity.context.span_id, "016x")
    assert effect_.span_id == span_id

    def links():
        work(queue)  # the linking jobs
        body = api.get("effects", key=KEY).json()
        return body if body.get("tool_span_id") else None

    wait_until(links, what="the effect's link to the activity's span")
    assert (links()["tool_span_id"], links()["run_id"]) == (span_id, "order-7")
    assert Span.objects.get(span_id=span_id).run.run_id == "order-7"


def test_a_result_after_the_timeout_is_a_late_success_and_the_retry_returns_it(
    temporal, atb, provider
):
    release = threading.Event()

    @effect(kind="payment", target="fakepay", receipt="id")
    @activity.defn(name="refund")
    def refund(order: int) -> dict[str, str]:
        done = provider.refund(order)
        if len(provider.refunds()) == 1:
            release.wait(60)  # outlives its start-to-close timeout
        return {"id": done}

    queue = task_queue()
    with temporal.worker(atb, [refund], task_queue=queue):
        # Released before the worker stops, which waits for the activity: a failure here
        # does not hold the test for the activity's 60 s.
        try:
            handle = temporal.start(Job(order=7, timeout_s=2), task_queue=queue)
            # Temporal gave up on the first attempt; the retry is told to wait.
            wait_until(lambda: temporal.last_failure(handle) == "EffectInDoubt", 60, "a wait")
            assert _cases("uncertain").filter(closed=None).exists()
            release.set()
            result = temporal.run(handle.result())
        finally:
            release.set()

    assert result == {"id": "re_7_1"}, "the retry did not return the late result"
    assert provider.refunds() == ["7"]
    effect_ = Effect.objects.get(key=KEY)
    assert (effect_.state, effect_.late) == (State.SUCCEEDED, True)
    assert _cases("late_success").exists()


def test_a_retry_that_did_it_again_leaves_a_duplicate_effect(temporal, atb, provider):
    release = threading.Event()

    @effect(kind="payment", target="fakepay", receipt="id", replay="idempotent")
    @activity.defn(name="refund")
    def slow_first(order: int) -> dict[str, str]:
        done = provider.refund(order)
        if len(provider.refunds()) == 1:
            release.wait(60)
        return {"id": done}

    queue = task_queue()
    with temporal.worker(atb, [slow_first], task_queue=queue):
        try:
            handle = temporal.start(Job(order=7, timeout_s=2), task_queue=queue)
            result = temporal.run(handle.result())
            release.set()
            wait_until(lambda: _cases("duplicate_effect").exists(), 60, "the duplicate")
        finally:
            release.set()

    assert result == {"id": "re_7_2"}
    assert provider.refunds() == ["7", "7"], "the provider's ledger is the ground truth"
    assert Effect.objects.get(key=KEY).attempt_count == 2


def test_a_worker_killed_between_the_effect_and_the_receipt_leaves_a_case_and_no_repeat(
    temporal, atb, provider, live_server, api_key, spool_root
):
    queue = task_queue()
    # Temporal gives up on the killed worker's attempt after its start-to-close timeout: the
    # 2 s that the other tests' attempts, which also ask the live server, are given.
    handle = temporal.start(Job(order=7, timeout_s=2), task_queue=queue)
    dying = worker_process(temporal, live_server.url, api_key, spool_root, queue, provider.ledger)
    try:
        assert dying.wait(60) == -9, "the worker was not killed by its refund"
    finally:
        if dying.poll() is None:  # it never got the refund: leave nothing running
            dying.kill()
            dying.wait(10)
    assert provider.refunds() == ["7"]

    with temporal.worker(atb, [refund_activity(provider)], task_queue=queue):
        wait_until(lambda: temporal.last_failure(handle) == "EffectInDoubt", 60, "a wait")
        assert provider.refunds() == ["7"], "the refund was repeated"
        temporal.run(handle.terminate("settled in the desk"))

    effect_ = Effect.objects.get(key=KEY)
    assert effect_.state == State.TIMED_OUT
    assert _cases("uncertain").filter(closed=None).exists()


def test_a_retry_on_an_upgraded_worker_is_flagged_as_version_drift(temporal, atb, provider):
    @effect(kind="payment", target="fakepay", receipt="id", replay="idempotent")
    @activity.defn(name="refund")
    def broken(order: int) -> dict[str, str]:
        raise RuntimeError("the old build fails after the provider call, maybe after it")

    queue = task_queue()
    with temporal.worker(atb, [broken], task_queue=queue, build_id="refunds-1.0"):
        handle = temporal.start(Job(order=7), task_queue=queue)
        wait_until(lambda: _cases("uncertain").exists(), 60, "the failed attempt")
    with temporal.worker(
        atb,
        [refund_activity(provider, replay="idempotent")],
        task_queue=queue,
        build_id="refunds-1.1",
    ):
        result = temporal.run(handle.result())

    assert result == {"id": "re_7_1"}
    drift = _cases("version_drift").get()
    assert "workflow_version" in drift.summary
    attempts = Attempt.objects.filter(effect__key=KEY).order_by("number")
    versions = [a.context["workflow_version"] for a in attempts]
    assert versions[0] == "refunds-1.0" and versions[-1] == "refunds-1.1"
    assert {a.context["workflow"] for a in attempts} == {"RefundWorkflow"}
    assert all(a.context["temporal_run_id"] == handle.result_run_id for a in attempts)


def test_an_activity_needing_approval_waits_and_runs_once_approved(
    temporal, atb, provider, project, alice
):
    g = grant(project, name="refunds", requires_approval=True)
    refund = refund_activity(provider, authority={"grant": g.pk})
    queue = task_queue()
    with temporal.worker(atb, [refund], task_queue=queue):
        handle = temporal.start(Job(order=7), task_queue=queue)
        wait_until(lambda: temporal.last_failure(handle) == "EffectInDoubt", 60, "a wait")
        assert provider.refunds() == []
        approval = Approval.objects.get(effect__key=KEY)
        signed = logged_in(alice).post(
            f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked"}
        )
        assert signed.status_code in (200, 302)
        result = temporal.run(handle.result())

    assert result == {"id": "re_7_1"}
    assert provider.refunds() == ["7"]
    assert temporal.run(atb.flush(30))
    assert Effect.objects.get(key=KEY).state == State.SUCCEEDED


def test_an_effect_done_before_returns_its_stored_result_without_running(temporal, atb, provider):
    queue = task_queue()
    with temporal.worker(atb, [refund_activity(provider)], task_queue=queue):
        first = temporal.run(temporal.start(Job(order=7), task_queue=queue).result())
        # The same workflow id again (a job resubmitted): the same key, not refunded again.
        again = temporal.run(temporal.start(Job(order=7), task_queue=queue).result())

    assert first == again == {"id": "re_7_1"}
    assert provider.refunds() == ["7"]
    assert Attempt.objects.filter(effect__key=KEY).count() == 1


def test_a_declaration_mistake_fails_when_it_is_made():
    def refund(order: int) -> dict[str, str]:
        return {}

    with pytest.raises(TypeError, match="names amount"):
        effect(kind="payment", target="fakepay", key="refund:{amount}")(refund)
    with pytest.raises(TypeError, match="replay"):
        effect(kind="payment", target="fakepay", replay="twice")(refund)
    with pytest.raises(TypeError, match="receipt"):
        effect(kind="payment", target="fakepay", receipt=42)(refund)
    with pytest.raises(TypeError, match="target"):
        effect(kind="payment", target="")(refund)


def test_a_key_that_does_not_fit_the_arguments_fails_the_activity_for_good(temporal, atb, provider):
    refund = refund_activity(provider, key="refund:{order.number}")  # order is an int
    queue = task_queue()
    with (
        temporal.worker(atb, [refund], task_queue=queue),
        pytest.raises(WorkflowFailureError) as failed,
    ):
        temporal.run(temporal.start(Job(order=7), task_queue=queue).result())

    cause = failed.value.cause.cause
    assert isinstance(cause, ApplicationError) and cause.type == "EffectDeclarationError"
    assert cause.non_retryable
    assert provider.refunds() == [] and not Effect.objects.exists()
