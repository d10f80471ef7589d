"""Effects link to their tool call, the model span that asked for it and the run, whatever
order intents, receipts and spans arrive in."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import django_rq
import pytest
from django.utils import timezone

from durability.jobs import enqueue
from durability.models import Effect
from tests.trajectories.support import TRACE, chat, post_traces, queue, request, span, tool, work
from trajectories import ingest, jobs, links, otlp
from trajectories.models import EffectLink, Span

__all__ = ["queue"]

AGENT, MODEL, TOOL, HTTP = "a" * 16, "1" * 16, "2" * 16, "3" * 16


@pytest.fixture
def send(api, queue, django_capture_on_commit_callbacks):
    """Post to the API as an agent would, then let the worker run what was enqueued."""

    class Sender:
        def intent(self, key="refund:1", **fields):
            with django_capture_on_commit_callbacks(execute=True):
                r = api.intent(key, **fields)
            work(queue)
            return r.json()["effect"]["id"]

        def receipt(self, key="refund:1", **fields):
            with django_capture_on_commit_callbacks(execute=True):
                api.receipt(key, **fields)
            work(queue)

        def spans(self, *spans, run_id=None):
            with django_capture_on_commit_callbacks(execute=True):
                assert post_traces(api.client, api.key, in_run(run_id, *spans)).status_code == 200
            work(queue)

        def trajectory(self, effect_id):
            body = api.get(f"effects/{effect_id}").json()
            return body["run_id"], body["tool_span_id"], body["model_span_id"]

    return Sender()


def in_run(run_id, *spans):
    """A request whose spans name their run (`tallybook.run.id`), or none."""
    return request(*spans, resource={"tallybook.run.id": run_id} if run_id else None)


def stored_alone(project, run_id, *spans):
    """Spans stored as the API stores them, and then the process died before links_refresh."""
    body = in_run(run_id, *spans).SerializeToString()
    ingest.spans_ingest(project=project, spans=otlp.decode_protobuf(body).spans)


def genai(*, calls=("call_1",)):
    """An agent span, the model span asking for a tool, and the tool span running it."""
    return (
        span(
            AGENT,
            "invoke_agent",
            duration_ms=500,
            attributes={"gen_ai.operation.name": "invoke_agent"},
        ),
        chat(MODEL, calls=calls, parent=AGENT, at_ms=10),
        tool(TOOL, parent=AGENT, at_ms=100),
    )


def test_spans_first_then_the_intent_recorded_in_the_tool_span(send):
    send.spans(*genai())
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_the_intent_first_then_the_spans(send):
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    assert send.trajectory(effect) == (None, None, None)
    send.spans(*genai())
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_the_model_span_arriving_last_completes_the_link(send):
    agent, model, executed = genai()
    send.spans(agent, executed)
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    link = EffectLink.objects.get(pk=effect)
    assert link.tool_span is not None and link.model_span is None
    assert link.tool_span.span_id == TOOL
    send.spans(model)
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_an_intent_naming_only_the_tool_call_id_links_by_it(send):
    effect = send.intent(tool_call_id="call_1")
    send.spans(*genai())
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_an_effect_recorded_in_a_span_below_the_tool_call_links_to_the_tool_call(send):
    below = span(HTTP, "POST /refunds", parent=TOOL, at_ms=110)
    send.spans(*genai(), below)
    effect = send.intent(trace_id=TRACE, span_id=HTTP)
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_without_a_tool_call_part_the_nearest_model_span_before_the_tool_call_is_taken(send):
    earlier = chat("4" * 16, calls=(), parent=AGENT, at_ms=0)
    nearest = chat("5" * 16, calls=(), parent=AGENT, at_ms=40)
    after = chat("6" * 16, calls=(), parent=AGENT, at_ms=200)
    send.spans(span(AGENT), earlier, nearest, tool(TOOL, "call_x", parent=AGENT, at_ms=100), after)
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    assert send.trajectory(effect) == (TRACE, TOOL, "5" * 16)


def test_the_model_span_that_asked_wins_over_a_nearer_one(send):
    asking = chat(MODEL, calls=("call_1",), parent=AGENT, at_ms=0)
    nearer = chat("5" * 16, calls=("call_2",), parent=AGENT, at_ms=60)
    send.spans(span(AGENT), asking, nearer, tool(TOOL, "call_1", parent=AGENT, at_ms=100))
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    assert send.trajectory(effect)[2] == MODEL


def test_links_stay_when_the_spans_are_sent_again(send):
    send.spans(*genai())
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    before = EffectLink.objects.values(*links.LINK_FIELDS).get(pk=effect)
    send.spans(*genai())
    send.spans(*reversed(genai()))
    assert EffectLink.objects.values(*links.LINK_FIELDS).get(pk=effect) == before
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_an_effect_linked_to_a_span_follows_it_to_the_run_it_moved_to(
    send, api, other_api, project, queue, django_capture_on_commit_callbacks
):
    agent, model, executed = genai()
    send.spans(agent, model, executed, run_id="run-a")
    in_tool = send.intent(trace_id=TRACE, span_id=TOOL)
    by_call = send.intent("refund:2", tool_call_id="call_1")
    # Another project's effect, linked to its own spans of the same ids in its own run-a.
    post_traces(other_api.client, other_api.key, in_run("run-a", *genai()))
    with django_capture_on_commit_callbacks(execute=True):
        stranger = other_api.intent("refund:1", trace_id=TRACE, span_id=TOOL).json()["effect"]["id"]
    work(queue)
    theirs = EffectLink.objects.get(pk=stranger).run
    assert theirs is not None and theirs.project_id != project.pk

    # The tool span sent again naming run-b, stored, and the process died before
    # links_refresh: the links moved with the span, in its batch's transaction.
    stored_alone(project, "run-b", executed)
    assert send.trajectory(in_tool) == send.trajectory(by_call) == ("run-b", TOOL, MODEL)
    run_b = EffectLink.objects.get(pk=in_tool).run
    assert run_b is not None and (run_b.project_id, run_b.run_id) == (project.pk, "run-b")
    assert EffectLink.objects.get(pk=stranger).run == theirs

    # The model span, moved too, moves no link: their tool span is where they take their run.
    stored_alone(project, "run-c", model)
    assert send.trajectory(in_tool) == send.trajectory(by_call) == ("run-b", TOOL, MODEL)


def test_a_receipt_with_trace_context_links_an_effect_whose_intent_had_none(send):
    effect = send.intent()
    send.spans(*genai())
    assert send.trajectory(effect) == (None, None, None)
    send.receipt(external_id="re_1", trace_id=TRACE, span_id=TOOL)
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)


def test_an_effect_links_to_the_run_its_intent_names(send, api):
    effect = send.intent(run_id="order-42")
    with_run = {"events": [{"id": "r1", "type": "run", "run_id": "order-42"}]}
    assert api.post("events", with_run).status_code == 207
    assert send.trajectory(effect) == ("order-42", None, None)


def test_spans_of_another_project_never_link(send, other_api):
    post_traces(other_api.client, other_api.key, request(*genai()))
    effect = send.intent(trace_id=TRACE, span_id=TOOL, tool_call_id="call_1")
    assert send.trajectory(effect) == (None, None, None)


def test_the_openapi_document_describes_the_trajectory_ids(api):
    schema = api.get("openapi.json").json()["components"]["schemas"]["EffectDetailOut"]
    assert {"run_id", "tool_span_id", "model_span_id"} <= set(schema["properties"])


# -- the repair pass: PostgreSQL holds the truth, a lost job is put right ----------------


def test_a_link_job_lost_with_redis_is_put_right_by_the_next_scheduled_pass(
    send, api, queue, django_capture_on_commit_callbacks
):
    send.spans(*genai())
    with django_capture_on_commit_callbacks(execute=True):
        api.intent("refund:1", trace_id=TRACE, span_id=TOOL)
    assert queue.count == 1
    queue.connection.flushdb()  # Redis is lost, and the link job with it
    lost = Effect.objects.get(key="refund:1").pk
    assert send.trajectory(lost) == (None, None, None)
    # As rqcron enqueues it; at once, as the test's transaction never commits.
    scheduled = django_rq.get_queue("default", commit_mode="auto")
    repair, duplicate = scheduled.enqueue(jobs.links_repair), scheduled.enqueue(jobs.links_repair)
    work(queue)
    assert repair.latest_result().return_value == 1
    assert duplicate.latest_result().return_value == 0
    assert send.trajectory(lost) == (TRACE, TOOL, MODEL)


def test_the_pass_links_an_effect_whose_spans_came_after_a_lost_refresh(send, api, project):
    effect = send.intent(trace_id=TRACE, span_id=TOOL)
    # Stored, then the process died before links_refresh: the link still waits.
    ingest.spans_ingest(
        project=project, spans=otlp.decode_protobuf(request(*genai()).SerializeToString()).spans
    )
    assert send.trajectory(effect) == (None, None, None)
    assert links.links_repair() == [effect]
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)
    assert links.links_repair() == []


def test_the_pass_leaves_links_waiting_for_spans_and_effects_naming_no_trajectory(send, api):
    send.intent("waits", trace_id=TRACE, span_id=TOOL)
    send.intent("names-nothing")
    assert EffectLink.objects.get().resolved is None
    assert links.links_repair() == []


def test_the_pass_is_bounded_newest_first_and_looks_back_one_window(send, api):
    send.spans(*genai())
    for n in range(4):
        api.intent(f"refund:{n}", tool_call_id="call_1")
    ids = dict(Effect.objects.values_list("key", "pk"))
    Effect.objects.filter(key="refund:0").update(
        created=timezone.now() - links.REPAIR_WINDOW - timedelta(minutes=1)
    )
    Effect.objects.filter(key="refund:1").update(created=timezone.now() - timedelta(hours=1))
    assert links.links_repair(limit=2) == [ids["refund:3"], ids["refund:2"]]
    assert links.links_repair(limit=2) == [ids["refund:1"]]
    assert links.links_repair(limit=2) == []
    assert not EffectLink.objects.filter(pk=ids["refund:0"]).exists()


def test_without_redis_the_pass_runs_inline(
    send, api, queue, settings, django_capture_on_commit_callbacks
):
    settings.REDIS_URL = ""
    send.spans(*genai())
    # Inline jobs run at commit; the test's transaction never commits, so this one is lost.
    lost = api.intent("refund:1", tool_call_id="call_1").json()["effect"]["id"]
    assert not EffectLink.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        enqueue(jobs.links_repair)
    assert queue.count == 0
    assert send.trajectory(lost) == (TRACE, TOOL, MODEL)


def test_a_tool_call_id_holding_a_secret_links_by_its_digest(send):
    call = "call_ghp_" + "k" * 36
    effect = send.intent(tool_call_id=call)
    send.spans(
        span(AGENT),
        chat(MODEL, calls=(call,), parent=AGENT, at_ms=10),
        tool(TOOL, call, parent=AGENT, at_ms=100),
    )
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)
    assert Effect.objects.get(pk=effect).tool_call_id.startswith("call_[REDACTED:")


def mcp_call(span_id, *, parent="", attributes=None):
    """The mcp package's client span of a tools/call request (MCP conventions, no GenAI ones)."""
    return span(
        span_id,
        "MCP send tools/call refund",
        parent=parent,
        at_ms=110,
        attributes={
            "mcp.method.name": "tools/call",
            "jsonrpc.request.id": "7",
            **(attributes or {}),
        },
    )


def test_an_effect_recorded_in_an_mcp_call_links_to_the_framework_tool_span_around_it(send):
    send.spans(*genai(), mcp_call(HTTP, parent=TOOL))
    effect = send.intent(trace_id=TRACE, span_id=HTTP)
    assert send.trajectory(effect) == (TRACE, TOOL, MODEL)
    assert EffectLink.objects.get(pk=effect).tool_span.tool_name == "refund"


def test_an_mcp_call_alone_is_a_tool_span_named_by_its_session_and_request_id(send, project):
    send.spans(mcp_call(HTTP, attributes={"mcp.session.id": "s-81"}))
    stored = Span.objects.get(span_id=HTTP)
    assert (stored.kind, stored.tool_name, stored.tool_call_id) == ("tool", "refund", "mcp:s-81:7")
    # What tallybook-mcp records for that call over streamable HTTP: no trace context needed.
    effect = send.intent(tool_call_id="mcp:s-81:7")
    assert send.trajectory(effect)[1] == HTTP


# -- one resolution, in SQL on PostgreSQL and with the ORM on SQLite ----------------------


def test_the_statement_resolves_every_link_as_the_orm_resolution_does(send, api, project):
    """LINKS_RESOLVE (PostgreSQL) and the ORM's resolution (SQLite, the demo) say the same,
    whatever the link names: a span at any depth below a tool span, a tool span inside another
    of the same tool, a span never stored, a tool call asked for in two traces or in none, a
    run only."""
    other_trace = "5" * 32
    outer, inner, below_inner, below_outer = "7" * 16, "8" * 16, "9" * 16, "b" * 16
    unasked, deep = "c" * 16, ["d" * 15 + str(n) for n in range(4)]
    send.spans(
        *genai(),
        span(below_outer, "POST /refunds", parent=TOOL, at_ms=110),
        tool(outer, "call_2", parent=AGENT, at_ms=150),
        tool(inner, "call_2", parent=outer, at_ms=151, attributes={"gen_ai.tool.call.id": ""}),
        span(below_inner, "POST /mcp", parent=inner, at_ms=152),
        chat("e" * 16, calls=(), parent=AGENT, at_ms=170),
        tool(unasked, "call_x", parent=AGENT, at_ms=200, attributes={"gen_ai.tool.name": "x"}),
        span(deep[0], "deep", parent=TOOL, at_ms=120),
        *(span(deep[n], "deep", parent=deep[n - 1], at_ms=120 + n) for n in range(1, 4)),
        run_id="run-a",
    )
    post_traces(
        api.client,
        api.key,
        in_run("run-b", chat("f" * 16, calls=("call_1",), trace_id=other_trace, at_ms=300)),
    )
    named = [
        {"trace_id": TRACE, "span_id": s}
        for s in (AGENT, MODEL, TOOL, HTTP, below_outer, outer, inner, below_inner, unasked)
    ]
    named += [{"trace_id": TRACE, "span_id": deep[3]}, {"trace_id": TRACE, "span_id": "a1" * 8}]
    named += [{"tool_call_id": c} for c in ("call_1", "call_2", "call_x", "call_none")]
    named += [{"run_id": "run-b"}, {"run_id": "run-none"}, {"trace_id": other_trace}]
    named += [{"trace_id": other_trace, "span_id": "f" * 16, "tool_call_id": "call_1"}]
    effects = [send.intent(f"refund:{n}", **fields) for n, fields in enumerate(named)]

    def resolved() -> list[tuple[Any, ...]]:
        found = EffectLink.objects.filter(pk__in=effects).order_by("pk")
        return [(*row[:-1], row[-1] is not None) for row in found.values_list(*FIELDS)]

    assert links.links_resolve(effect_ids=effects) == sorted(effects)
    by_statement = resolved()
    blank = {"run": None, "resolved": None} | dict.fromkeys(links.LINK_FIELDS[1:], "")
    EffectLink.objects.filter(pk__in=effects).update(**blank)
    assert all(links._link_resolve_orm(effect) for effect in effects)
    assert resolved() == by_statement
    linked = dict(zip(effects, by_statement, strict=True))
    run_a = Span.objects.get(span_id=TOOL).run_id
    # As the module's docstring says, for a few: the nearest tool span above, the outer of two
    # of one tool, and the model that asked in the tool span's own trace.
    assert linked[effects[4]][1:5] == (TRACE, TOOL, TRACE, MODEL)
    assert linked[effects[7]][1:3] == (TRACE, outer)
    assert linked[effects[9]][1:3] == (TRACE, TOOL)
    assert linked[effects[11]][:5] == (run_a, TRACE, TOOL, TRACE, MODEL)
    assert linked[effects[14]][5] is False  # call_none: nothing found, unresolved


FIELDS = [*links.LINK_FIELDS, "resolved"]
