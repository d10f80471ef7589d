"""POST /v1/traces: OTLP/HTTP spans, protobuf and JSON, mapped onto runs and spans."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from durability.api.decorators import DATABASE_RETRY_AFTER
from tests.conftest import Api
from tests.trajectories.support import (
    PROTOBUF,
    TRACE,
    chat,
    post_traces,
    request,
    slots_taken,
    span,
    tool,
)
from trajectories import ingest, retention
from trajectories.models import RequestedToolCall, Run, RunTrace, Span

__all__ = ["slots_taken"]

ROOT = "00f067aa0ba902b7"


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_it_maps_genai_spans_onto_a_run_inferred_from_the_trace(api, as_json):
    agent = span(
        ROOT,
        "invoke_agent refunds",
        duration_ms=500,
        status=1,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "refunds"},
    )
    r = post_traces(
        api.client,
        api.key,
        request(
            agent, chat("1111111111111111", parent=ROOT), tool("2222222222222222", parent=ROOT)
        ),
        as_json=as_json,
    )
    assert r.status_code == 200
    assert r["Content-Type"] == ("application/json" if as_json else PROTOBUF)
    run = Run.objects.get()
    assert run.run_id == TRACE and run.inferred
    assert run.agent == "refunds" and run.workflow == "invoke_agent refunds"
    assert run.status == "ok" and run.ended is not None
    assert (run.span_count, run.input_tokens, run.output_tokens) == (3, 100, 20)
    model = Span.objects.get(span_id="1111111111111111")
    assert (model.kind, model.operation, model.provider, model.request_model) == (
        "model",
        "chat",
        "openai",
        "gpt-4o",
    )
    assert (model.input_tokens, model.output_tokens, model.parent_span_id) == (100, 20, ROOT)
    assert model.output is not None and model.output[0]["parts"][0]["id"] == "call_1"
    assert model.resource == {"service.name": "refund-agent"}
    asked = RequestedToolCall.objects.values_list("tool_call_id", "trace_id", "span_id", "day")
    assert list(asked) == [("call_1", model.trace_id, model.span_id, model.day)]
    executed = Span.objects.get(span_id="2222222222222222")
    assert (executed.kind, executed.tool_name, executed.tool_call_id) == (
        "tool",
        "refund",
        "call_1",
    )
    assert Span.objects.get(span_id=ROOT).kind == "agent"
    assert RunTrace.objects.get(trace_id=TRACE).run == run


def test_it_answers_an_empty_json_object_when_every_span_is_stored(api):
    r = post_traces(api.client, api.key, request(span(ROOT)), as_json=True)
    assert r.json() == {}


def test_it_reads_the_call_id_of_an_openinference_tool_span_from_its_output_message(api):
    # openinference-instrumentation-langchain 0.1.80 names the call only in the ToolMessage.
    message = {"type": "tool", "data": {"content": "re_7", "tool_call_id": "call_7"}}
    tool = span(
        "5555555555555555",
        attributes={
            "openinference.span.kind": "TOOL",
            "tool.name": "refund",
            "output.value": json.dumps(message),
            "output.mime_type": "application/json",
        },
    )
    chain = span("6666666666666666", attributes={"output.value": json.dumps(message)})

    assert post_traces(api.client, api.key, request(tool, chain)).status_code == 200

    spans = {s.span_id[0]: s for s in Span.objects.all()}
    assert (spans["5"].kind, spans["5"].tool_call_id) == ("tool", "call_7")
    assert spans["6"].tool_call_id == ""  # not a tool span: its output names no call of its own


def test_it_accepts_the_older_genai_names_and_the_openinference_and_traceloop_aliases(api):
    older = span(
        "1111111111111111",
        attributes={
            "gen_ai.system": "anthropic",
            "gen_ai.request.model": "claude",
            "gen_ai.usage.prompt_tokens": 7,
            "gen_ai.usage.completion_tokens": 3,
        },
    )
    openinference = span(
        "2222222222222222",
        attributes={
            "openinference.span.kind": "TOOL",
            "tool.name": "search",
            "tool_call.id": "call_oi",
            "input.value": '{"q": "x"}',
            "output.value": "found",
            "session.id": "conversation-9",
        },
    )
    openinference_llm = span(
        "3333333333333333",
        attributes={
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.token_count.prompt": 11,
            "llm.token_count.completion": 5,
            "llm.token_count.total": 16,
            "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_oi",
        },
    )
    traceloop = span(
        "4444444444444444",
        attributes={
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "lookup",
            "traceloop.entity.input": '{"id": 1}',
            "traceloop.entity.output": '{"ok": true}',
            "traceloop.workflow.name": "refunds",
        },
    )
    assert (
        post_traces(
            api.client, api.key, request(older, openinference, openinference_llm, traceloop)
        ).status_code
        == 200
    )
    spans = {s.span_id[0]: s for s in Span.objects.all()}
    assert (spans["1"].kind, spans["1"].provider, spans["1"].input_tokens) == (
        "model",
        "anthropic",
        7,
    )
    assert spans["1"].output_tokens == 3
    assert (spans["2"].kind, spans["2"].tool_name, spans["2"].tool_call_id) == (
        "tool",
        "search",
        "call_oi",
    )
    assert (spans["2"].input, spans["2"].output) == ({"q": "x"}, "found")
    assert (spans["3"].kind, spans["3"].request_model, spans["3"].input_tokens) == (
        "model",
        "gpt-4o-mini",
        11,
    )
    assert spans["3"].attributes["llm.token_count.total"] == 16
    assert RequestedToolCall.objects.get(span_id=spans["3"].span_id).tool_call_id == "call_oi"
    assert (spans["4"].kind, spans["4"].tool_name, spans["4"].output) == (
        "tool",
        "lookup",
        {"ok": True},
    )
    run = Run.objects.get()
    assert (run.conversation_id, run.workflow) == ("conversation-9", "refunds")


def test_it_keeps_attributes_it_does_not_map_with_their_types(api):
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.request.temperature": 0.5,
        "server.port": 443,
        "custom.flag": True,
        "custom.map": {"a": 1},
    }
    post_traces(api.client, api.key, request(span(ROOT, attributes=attributes)))
    assert Span.objects.get().attributes == {
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.request.temperature": 0.5,
        "server.port": 443,
        "custom.flag": True,
        "custom.map": {"a": 1},
    }


def test_an_operation_name_that_is_a_list_or_a_map_names_no_kind(api):
    odd = {"gen_ai.operation.name": ["chat"]}
    r = post_traces(api.client, api.key, request(span(ROOT, attributes=odd)))
    assert r.status_code == 200
    stored = Span.objects.get()
    assert (stored.kind, stored.operation) == ("other", "['chat']")


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_it_rejects_spans_with_bad_ids_in_a_partial_success_and_keeps_the_others(api, as_json):
    message = request(
        span(ROOT),
        span("0000000000000000", "zero span id"),
        span("1111111111111111", "zero trace id", trace_id="0" * 32),
        span("2222", "short span id"),
    )
    r = post_traces(api.client, api.key, message, as_json=as_json)
    assert r.status_code == 200
    if as_json:
        partial = r.json()["partialSuccess"]
        rejected, text = int(partial["rejectedSpans"]), partial["errorMessage"]
    else:
        answer = ExportTraceServiceResponse.FromString(r.content)
        rejected, text = answer.partial_success.rejected_spans, answer.partial_success.error_message
    assert rejected == 3
    assert "spanId must not be all zeros" in text and "traceId must not be all zeros" in text
    assert "spanId must be 16 hex digits" in text
    assert list(Span.objects.values_list("span_id", flat=True)) == [ROOT]


def test_it_rejects_a_json_span_whose_id_is_not_hex(api):
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": "zzzzzzzzzzzzzzzz",
                                "name": "x",
                                "startTimeUnixNano": "1700000000000000000",
                            },
                            {
                                "traceId": TRACE.upper(),
                                "spanId": ROOT.upper(),
                                "name": "ok",
                                "startTimeUnixNano": 1700000000000000000,
                            },
                        ]
                    }
                ]
            }
        ]
    }
    r = post_traces(api.client, api.key, body, as_json=True)
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    stored = Span.objects.get()
    assert (stored.trace_id, stored.span_id) == (TRACE, ROOT)


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"\xff\xff\xff not protobuf", PROTOBUF),
        (b"{not json", "application/json"),
        (b'{"resourceSpans": 3}', "application/json"),
        (b"[]", "application/json"),
    ],
)
def test_it_answers_400_with_a_status_for_an_undecodable_payload(api, body, content_type):
    r = api.client.post(
        "/v1/traces",
        data=body,
        content_type=content_type,
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert r.status_code == 400
    if content_type == PROTOBUF:
        assert status_pb2.Status.FromString(r.content).code == 3  # INVALID_ARGUMENT
    else:
        assert r.json()["code"] == 3 and r.json()["message"]
    assert not Span.objects.exists()


def test_it_answers_415_for_another_content_type(api):
    r = api.client.post(
        "/v1/traces",
        data="x",
        content_type="text/plain",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert r.status_code == 415


def test_it_needs_the_bearer_key(client, db):
    r = client.post(
        "/v1/traces", data=request(span(ROOT)).SerializeToString(), content_type=PROTOBUF
    )
    assert r.status_code == 401
    assert not Span.objects.exists()


def test_it_inflates_gzip_bodies(api):
    body = gzip.compress(request(span(ROOT)).SerializeToString())
    r = post_traces(api.client, api.key, body, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200
    assert Span.objects.filter(span_id=ROOT).exists()


def test_a_resent_span_updates_in_place_and_counts_once(api):
    post_traces(api.client, api.key, request(span(ROOT, "first", duration_ms=0)))
    first = Span.objects.get()
    assert Run.objects.get().status == "running"
    post_traces(api.client, api.key, request(span(ROOT, "ended", status=2)))
    again = Span.objects.get()
    assert again.pk == first.pk
    assert (again.name, again.status, again.end is not None) == ("ended", "error", True)
    run = Run.objects.get()
    assert (run.span_count, run.error_count, run.status) == (1, 1, "error")


def test_a_named_run_collects_the_spans_of_its_traces_whatever_the_order(api):
    other_trace = "5" * 32
    post_traces(api.client, api.key, request(span(ROOT)))
    assert Run.objects.get().run_id == TRACE
    r = api.post(
        "events",
        {
            "events": [
                {"id": "e1", "type": "run", "run_id": "order-42", "trace_ids": [TRACE, other_trace]}
            ]
        },
    )
    assert r.status_code == 207
    post_traces(api.client, api.key, request(span("1111111111111111", trace_id=other_trace)))
    run = Run.objects.get()
    assert (run.run_id, run.inferred, run.span_count) == ("order-42", False, 2)
    assert set(Span.objects.values_list("run_id", flat=True)) == {run.pk}


def test_a_span_names_its_run_with_the_tallybook_run_id_attribute(api):
    post_traces(
        api.client,
        api.key,
        request(span(ROOT), resource={"service.name": "a", "tallybook.run.id": "run-7"}),
    )
    assert Run.objects.get().run_id == "run-7"


def _in_run(run_id: str | None, *spans) -> bytes:
    """A request whose spans name their run (`tallybook.run.id`), or none."""
    resource = {"service.name": "a", **({"tallybook.run.id": run_id} if run_id else {})}
    return request(*spans, resource=resource).SerializeToString()


def _counts(run_id: str) -> tuple[int, int, int, int]:
    run = Run.objects.get(run_id=run_id)
    return (run.span_count, run.error_count, run.input_tokens, run.output_tokens)


def test_a_span_moved_to_another_run_leaves_the_old_run_counting_only_what_it_holds(api):
    model, executed = "1111111111111111", "2222222222222222"
    sent = [
        span(ROOT, "invoke_agent", duration_ms=500),
        chat(model, parent=ROOT),
        tool(executed, parent=ROOT, status=2),
    ]
    post_traces(api.client, api.key, _in_run("run-a", *sent))
    assert _counts("run-a") == (3, 1, 100, 20)
    day = RunTrace.objects.get().day

    # The model and tool spans sent again, now naming another run.
    r = post_traces(api.client, api.key, _in_run("run-b", *sent[1:]))
    assert r.status_code == 200
    assert _counts("run-a") == (1, 0, 0, 0)
    assert _counts("run-b") == (2, 1, 100, 20)
    a, b = Run.objects.get(run_id="run-a"), Run.objects.get(run_id="run-b")
    assert set(Span.objects.filter(run=a).values_list("span_id", flat=True)) == {ROOT}
    assert set(Span.objects.filter(run=b).values_list("span_id", flat=True)) == {model, executed}
    assert (a.first_day, a.last_day) == (b.first_day, b.last_day) == (day, day)
    assert Span.objects.count() == 3

    # Sent once more to run-b, they move nothing: both runs count the same.
    post_traces(api.client, api.key, _in_run("run-b", *sent[1:]))
    assert (_counts("run-a"), _counts("run-b")) == ((1, 0, 0, 0), (2, 1, 100, 20))


def test_a_run_whose_spans_all_moved_to_their_traces_run_is_kept_counting_none(api):
    # The trace is run-b's; a span of it named run-a, then sent again naming no run.
    post_traces(api.client, api.key, _in_run("run-b", span(ROOT, duration_ms=500)))
    model = chat("1111111111111111", parent=ROOT)
    post_traces(api.client, api.key, _in_run("run-a", model))
    assert (_counts("run-a"), _counts("run-b")) == ((1, 0, 100, 20), (1, 0, 0, 0))

    post_traces(api.client, api.key, _in_run(None, model))
    assert _counts("run-b") == (2, 0, 100, 20)
    left = Run.objects.get(run_id="run-a")
    assert _counts("run-a") == (0, 0, 0, 0)
    assert (left.first_day, left.last_day) == (None, None)
    assert not Span.objects.filter(run=left).exists()


@pytest.mark.django_db(transaction=True)
def test_two_batches_moving_one_span_at_once_leave_every_run_counting_what_it_holds(api):
    model = chat("1111111111111111", parent=ROOT)
    post_traces(api.client, api.key, _in_run("run-a", span(ROOT), model))
    looked, moved = threading.Event(), threading.Event()
    answers: list[int] = []

    def pause_before_its_writes(execute, sql, params, many, context):
        if sql.startswith("INSERT INTO trajectories_run") and not looked.is_set():
            looked.set()  # the batch has looked its spans up, found the model span in run-a
            moved.wait(timeout=120)  # set once the other batch has moved it
        return execute(sql, params, many, context)

    def send_to_run_c() -> None:
        try:
            with connection.execute_wrapper(pause_before_its_writes):
                answers.append(post_traces(Client(), api.key, _in_run("run-c", model)).status_code)
        finally:
            connection.close()

    late = threading.Thread(target=send_to_run_c)
    late.start()
    try:
        assert looked.wait(timeout=60)
        assert post_traces(api.client, api.key, _in_run("run-b", model)).status_code == 200
    finally:
        moved.set()
        late.join(timeout=60)
    assert not late.is_alive() and answers == [200]
    # The later batch met the span in a run it had not locked: the span stays where the
    # other left it, as if the later copy had come first.
    assert Span.objects.get(span_id="1111111111111111").run.run_id == "run-b"
    assert (_counts("run-a"), _counts("run-b"), _counts("run-c")) == (
        (1, 0, 0, 0),
        (1, 0, 100, 20),
        (0, 0, 0, 0),
    )


def _waits_for_a_lock(pid: int) -> bool:
    """Whether the session `pid` comes to wait for a lock, polled for at most a minute."""
    with connection.cursor() as cursor:
        for _ in range(6000):
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone() == ("Lock",):
                return True
            time.sleep(0.01)
    return False


@contextmanager
def _raced_at_the_runs_upsert(committed: str, other: Callable[[], None]) -> Iterator[None]:
    """`other` run on another connection just as this one sends a batch's runs upsert (the
    batch has looked its spans and traces up, and is to write): to its end
    (`before_the_upsert`), or until it deleted a run, then committed once the batch waits
    for that row (`while_the_upsert_waits`)."""
    deleted = threading.Event()
    racing: list[threading.Thread] = []
    waited: list[bool] = []

    def in_other(batch: int) -> None:
        def commit_once_the_batch_waits(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            if sql.startswith('DELETE FROM "trajectories_run" ') and not deleted.is_set():
                deleted.set()
                if committed == "while_the_upsert_waits":
                    waited.append(_waits_for_a_lock(batch))
            return result

        try:
            with connection.execute_wrapper(commit_once_the_batch_waits):
                other()
        finally:
            connection.close()

    def before_its_writes(execute, sql, params, many, context):
        if sql.startswith("INSERT INTO trajectories_run ") and not racing:
            batch = context["connection"].connection.info.backend_pid
            racing.append(threading.Thread(target=in_other, args=[batch]))
            racing[0].start()
            if committed == "before_the_upsert":
                racing[0].join(timeout=60)
            else:
                assert deleted.wait(timeout=60)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(before_its_writes):
        yield
    racing[0].join(timeout=60)
    assert deleted.is_set() and not racing[0].is_alive()
    assert waited == ([True] if committed == "while_the_upsert_waits" else [])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("committed", ["before_the_upsert", "while_the_upsert_waits"])
def test_a_run_the_batch_takes_spans_from_expired_meanwhile_is_not_created_again(
    api, project, committed
):
    sent = [span(ROOT, duration_ms=500), chat("1111111111111111", parent=ROOT)]
    post_traces(api.client, api.key, _in_run("run-a", *sent))

    def expire() -> None:
        """Retention, as if the spans had all expired: it deletes them, their trace and
        run-a, left with no span."""
        retention.project_expire(project.pk, now=timezone.now() + timedelta(days=2), days=1)

    # The spans sent again, naming run-b: run-a loses them.
    with _raced_at_the_runs_upsert(committed, expire):
        r = post_traces(api.client, api.key, _in_run("run-b", *sent))
    assert r.status_code == 200
    assert not Run.objects.filter(run_id="run-a").exists()
    assert _counts("run-b") == (2, 0, 100, 20)
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {"run-b"}


@pytest.mark.xfail(
    strict=True,
    reason="_owners reads the trace's run unlocked: a run event merging that inferred run into "
    "run-named between it and RUNS_UPSERT (committed before the upsert, or while it waits for "
    "the row) leaves the batch upserting the inferred run again as its own: the new span lands "
    "in it, apart from its trace, now run-named's. Following the trace needs run-named locked, "
    "which the upsert cannot do in key order (when the merge created run-named, it is not in "
    "the upsert's snapshot: only its id is, through the trace's row locked), so a later "
    "statement would lock it out of key order, and the spans' upsert and the refresh would "
    "take runs the batch does not know by key: a restructuring, not made here.",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("committed", ["before_the_upsert", "while_the_upsert_waits"])
def test_a_trace_merged_into_a_named_run_meanwhile_takes_the_spans_and_leaves_no_run_behind(
    api, committed
):
    model, executed = "1111111111111111", "2222222222222222"
    post_traces(
        api.client, api.key, _in_run(None, span(ROOT, duration_ms=500), chat(model, parent=ROOT))
    )
    assert Run.objects.get().run_id == TRACE  # inferred
    answers: list[int] = []

    def name_the_run() -> None:
        """A run event naming the trace's run: it merges the run inferred for the trace into
        run-named."""
        event = {"id": "e-named", "type": "run", "run_id": "run-named", "trace_ids": [TRACE]}
        answers.append(Api(Client(), api.key).post("events", {"events": [event]}).status_code)

    # The model span sent again and a tool span, naming no run: they take the trace's.
    with _raced_at_the_runs_upsert(committed, name_the_run):
        r = post_traces(
            api.client,
            api.key,
            _in_run(None, chat(model, parent=ROOT), tool(executed, parent=ROOT)),
        )
    assert r.status_code == 200 and answers == [207]
    # As in either serial order: the trace and all its spans in run-named, and no run
    # inferred for the trace left behind.
    assert not Run.objects.filter(run_id=TRACE).exists()
    assert RunTrace.objects.get().run.run_id == "run-named"
    assert set(Span.objects.values_list("run__run_id", flat=True)) == {"run-named"}
    assert _counts("run-named") == (3, 0, 100, 20)


def test_the_other_projects_spans_are_apart(api, other_api):
    post_traces(api.client, api.key, request(span(ROOT, "mine")))
    post_traces(other_api.client, other_api.key, request(span(ROOT, "theirs")))
    assert sorted(Span.objects.values_list("name", flat=True)) == ["mine", "theirs"]
    assert Run.objects.count() == 2


def test_it_answers_429_with_retry_after_when_the_projects_slots_are_taken(api, slots_taken):
    r = post_traces(api.client, api.key, request(span(ROOT)))
    assert r.status_code == 429
    assert r["Retry-After"] == "1"
    assert status_pb2.Status.FromString(r.content).code == 8  # RESOURCE_EXHAUSTED
    assert not Span.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_cannot_keep_up(api, monkeypatch):
    monkeypatch.setattr(ingest, "LOCK_TIMEOUT", "50ms")
    post_traces(api.client, api.key, request(span(ROOT)))
    locked, release = threading.Event(), threading.Event()

    def hold_the_run() -> None:
        with transaction.atomic():
            list(Run.objects.select_for_update())
            locked.set()
            release.wait(timeout=120)  # set as soon as the request has its answer
        connection.close()

    holder = threading.Thread(target=hold_the_run)
    holder.start()
    assert locked.wait(timeout=60)
    try:
        r = post_traces(api.client, api.key, request(span("1111111111111111")), as_json=True)
    finally:
        release.set()
        holder.join(timeout=60)
    assert not holder.is_alive()
    assert r.status_code == 503
    assert r["Retry-After"] == str(DATABASE_RETRY_AFTER)
    assert r.json()["code"] == 14  # UNAVAILABLE
    assert Span.objects.count() == 1
