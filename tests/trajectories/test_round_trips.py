"""What one OTLP batch costs in PostgreSQL, pinned: the same few round trips whatever its
size (issue 13: at most 8), from the API key's check to the links the spans may complete."""

from __future__ import annotations

import pytest
from django.db import close_old_connections, connection
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import Api
from tests.round_trips import Cost, cost
from tests.trajectories.support import chat, post_traces, queue, request, span, tool, work
from trajectories.models import EffectLink, RequestedToolCall, Run, Span

__all__ = ["queue"]

pytestmark = pytest.mark.django_db(transaction=True)  # real BEGIN and COMMIT, as served

# A batch's statements, as trajectories.api.traces runs them; the three pipelines count one
# round trip each (the BEGIN goes in the first, the COMMIT in the second:
# `durability.rows.send`).
BATCH = [
    "SELECT durability_keysversion",  # the key and its project cached here still hold
    "SELECT pg_try_advisory_lock",  # one of the project's ingest slots
    "BEGIN",
    "SELECT set_config",  # pipelined: the waits' bounds,
    "SELECT trace.trace_id, run.run_id",  # the runs the batch's traces belong to,
    "SELECT DISTINCT",  # and the runs holding the spans it sends again
    "INSERT INTO trajectories_run",  # pipelined: the runs, created or locked,
    "INSERT INTO trajectories_runtrace",  # the traces new to them,
    "WITH staged AS",  # the spans and the tool calls they ask for,
    "UPDATE trajectories_run SET",  # the runs' aggregates,
    "SELECT pg_advisory_unlock",  # the slot given back,
    "COMMIT",  # and the COMMIT
    "COMMIT",  # Django's, which finds the transaction closed and sends nothing
    "WITH locked AS",  # pipelined: the links the spans may complete, locked,
    "WITH RECURSIVE due AS",  # resolved, however many
]


def _trace(salt: int, t: int) -> str:
    return f"{salt:04x}{t + 1:028x}"


def _batch(spans: int, *, salt: int = 0) -> bytes:
    """`spans` spans in traces of 50 (an agent root, then model calls asking for tools and
    the tool calls): as many runs inferred as there are traces."""
    made = []
    for n in range(spans):
        t, i = divmod(n, 50)
        trace, span_id = _trace(salt, t), f"{salt:04x}{t:04x}{i + 1:08x}"
        root = f"{salt:04x}{t:04x}{1:08x}"
        if i == 0:
            made.append(span(span_id, "invoke_agent", trace_id=trace, duration_ms=900))
        elif i % 2:
            made.append(chat(span_id, calls=(f"call_{t}_{i}",), trace_id=trace, parent=root))
        else:
            made.append(tool(span_id, f"call_{t}_{i - 1}", trace_id=trace, parent=root))
    return request(*made).SerializeToString()


def _named(spent: Cost) -> list[str]:
    """The statements by the first words BATCH gives them (their texts grow with a batch)."""
    return [
        max((b for b in BATCH if sql.startswith(b)), key=len, default=sql)
        for sql in spent.statements
    ]


def _posted(api: Api, body: bytes) -> Cost:
    with cost() as spent:
        close_old_connections()  # as every request served starts (the test client skips it)
        r = post_traces(api.client, api.key, body)
        assert r.status_code == 200
        assert r.content == b""  # every span stored
    return spent


def _warmed(api: Api) -> None:
    """Batches first, on a connection of the test's own."""
    connection.close()
    for n in range(2):
        _posted(api, _batch(60, salt=0xF000 + n))


def test_an_otlp_batch_costs_the_same_few_round_trips_whatever_its_size(api: Api) -> None:
    _warmed(api)

    small = _posted(api, _batch(10, salt=1))
    large = _posted(api, _batch(2_000, salt=2))

    assert _named(small) == _named(large) == BATCH
    assert small.round_trips == large.round_trips == len(BATCH) - 10 <= 8
    assert Span.objects.filter(span_id__startswith="0002").count() == 2_000
    assert RequestedToolCall.objects.filter(span_id__startswith="0002").count() == 1_000


def test_a_resent_batch_costs_no_more_round_trips_than_a_new_one(api: Api) -> None:
    _warmed(api)
    body = _batch(200, salt=3)

    first = _posted(api, body)
    again = _posted(api, body)

    assert again.round_trips == first.round_trips
    assert Span.objects.filter(span_id__startswith="0003").count() == 200
    assert Run.objects.get(run_id=_trace(3, 0)).span_count == 50


def _naming(body: bytes, run_id: str) -> bytes:
    """The batch with its spans naming run `run_id`."""
    named = ExportTraceServiceRequest.FromString(body)
    attribute = named.resource_spans[0].resource.attributes.add(key="tallybook.run.id")
    attribute.value.string_value = run_id
    return named.SerializeToString()


def test_a_batch_moving_spans_to_another_run_costs_no_more_round_trips(api: Api) -> None:
    _warmed(api)
    body = _batch(200, salt=4)
    first = _posted(api, _naming(body, "run-4"))

    again = _posted(api, _naming(body, "run-5"))

    # One refresh, of both runs; no trace to claim (they are run-4's); the spans' statement
    # moves the effect links taking their runs from them too (links.LINKS_FOLLOW).
    assert _named(again) == [b for b in BATCH if b != "INSERT INTO trajectories_runtrace"]
    assert again.round_trips == first.round_trips
    assert Run.objects.get(run_id="run-5").span_count == 200
    assert Run.objects.get(run_id="run-4").span_count == 0


def _asking(n: int, *, salt: int) -> bytes:
    """A trace of an agent and `n` model calls, each asking for a tool call that its tool span
    then runs (`call_<salt>_<k>`)."""
    trace, root = _trace(salt, 0), f"{salt:04x}{0:012x}"
    made = [span(root, "invoke_agent", trace_id=trace, duration_ms=900)]
    for k in range(n):
        call = f"call_{salt}_{k}"
        asking, running = f"{salt:04x}{2 * k + 1:012x}", f"{salt:04x}{2 * k + 2:012x}"
        made.append(chat(asking, calls=(call,), trace_id=trace, parent=root, at_ms=2 * k))
        made.append(tool(running, call, trace_id=trace, parent=root, at_ms=2 * k + 1))
    return request(*made).SerializeToString()


def _links_waiting(api: Api, queue: object, n: int, *, salt: int) -> list[int]:
    """`n` effects naming the tool calls of `_asking(n, salt=salt)`, their links recorded
    before its spans come: waiting."""
    effects = [
        api.intent(f"refund:{salt}:{k}", tool_call_id=f"call_{salt}_{k}").json()["effect"]["id"]
        for k in range(n)
    ]
    work(queue)  # the link jobs
    assert EffectLink.objects.filter(pk__in=effects, resolved=None).count() == n
    return effects


def test_an_otlp_batch_resolving_twenty_links_costs_what_one_resolving_one_does(
    api: Api, queue: object
) -> None:
    _warmed(api)
    one, twenty = _links_waiting(api, queue, 1, salt=5), _links_waiting(api, queue, 20, salt=6)

    first = _posted(api, _asking(1, salt=5))
    second = _posted(api, _asking(20, salt=6))

    assert _named(first) == _named(second) == BATCH
    assert first.round_trips == second.round_trips == len(BATCH) - 10
    for effects, salt in ((one, 5), (twenty, 6)):
        linked = EffectLink.objects.filter(pk__in=effects).order_by("effect__key")
        assert [(link.tool_span_id, link.model_span_id) for link in linked] == [
            (f"{salt:04x}{2 * k + 2:012x}", f"{salt:04x}{2 * k + 1:012x}")
            for k in sorted(range(len(effects)), key=lambda k: f"refund:{salt}:{k}")
        ]
        assert all(link.resolved is not None and link.run is not None for link in linked)
