"""Fuzzing POST /v1/traces (Hypothesis, fixed seed): whatever the body, protobuf or JSON, the
answer is never a 5xx; a request refused whole stores nothing, and a span refused alone
stores nothing of its own."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tests.trajectories.support import NOW, TRACE, post_traces
from trajectories.models import RequestedToolCall, Run, RunTrace, Span
from trajectories.semconv import ALIASES

FUZZ = settings(
    max_examples=150,
    derandomize=True,  # a fixed seed: CI sees the same examples every run
    database=None,  # and writes no example database into the checkout
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # the api and its rows are shared on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# Texts with what PostgreSQL refuses (NUL; lone surrogates, JSON only) and what isdigit()
# misreads (superscripts, other scripts' digits).
ODD_TEXT = st.sampled_from(
    ["", "\x00", "a\x00b", "¹²³", "٣", "9" * 5000, "-1", "1e999", "[" * 5000, '{"a":1,"a":2}']
)
# And in JSON, lone surrogates (json.dumps writes them as \ud800 escapes, as clients do).
JSON_TEXT = st.one_of(st.text(max_size=10), ODD_TEXT, st.sampled_from(["\ud800", "a\udfffb"]))
KEYS = st.one_of(st.sampled_from(sorted(ALIASES)), st.text(max_size=8), ODD_TEXT)


def _mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` 15 times in 16, else `odd`: most spans get far enough to be stored."""
    return st.integers(0, 15).flatmap(lambda n: odd if n == 15 else valid)


TIMES = _mostly(
    st.integers(NOW - 10**12, NOW + 10**12),
    st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1])),
)


# The tables an export request stores into, counted in one statement: twice per example.
_ROWS = "SELECT " + ", ".join(
    f"(SELECT count(*) FROM {connection.ops.quote_name(m._meta.db_table)})"
    for m in (Span, Run, RunTrace, RequestedToolCall)
)


def _rows() -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute(_ROWS)
        return tuple(cursor.fetchone())


def _checked(response: Any, sent: int, before: tuple[int, ...], *, as_json: bool) -> None:
    assert response.status_code < 500, response.content[:500]
    after = _rows()
    if response.status_code != 200:
        assert after == before, "a request refused whole stored something"
        return
    if as_json:
        partial = response.json().get("partialSuccess", {})
        rejected = int(partial.get("rejectedSpans", 0))
    else:
        partial_success = ExportTraceServiceResponse.FromString(response.content).partial_success
        rejected = partial_success.rejected_spans
    assert 0 <= rejected <= sent
    assert after[0] - before[0] <= sent - rejected
    if rejected == sent:
        assert after == before, "a request whose every span was refused stored something"


# -- protobuf ----------------------------------------------------------------------------


def _any_value(children: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
    def array(values: list[AnyValue]) -> AnyValue:
        value = AnyValue()
        value.array_value.values.extend(values)
        return value

    def kvlist(pairs: list[tuple[str, AnyValue]]) -> AnyValue:
        value = AnyValue()
        value.kvlist_value.values.extend(KeyValue(key=k, value=v) for k, v in pairs)
        return value

    return st.one_of(
        st.lists(children, max_size=3).map(array),
        st.lists(st.tuples(KEYS, children), max_size=3).map(kvlist),
    )


PB_SCALARS = st.one_of(
    st.one_of(st.text(max_size=20), ODD_TEXT).map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: AnyValue(int_value=n)),
    st.floats().map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
)
PB_VALUES = st.recursive(PB_SCALARS, _any_value, max_leaves=6)
# The attributes the conventions give a meaning (a run, token counts, messages), given scalars.
PB_ATTRIBUTES = st.one_of(
    st.tuples(KEYS, PB_VALUES),
    st.tuples(
        st.sampled_from(
            ["tallybook.run.id", "gen_ai.usage.input_tokens", "gen_ai.output.messages"]
        ),
        PB_SCALARS,
    ),
)
IDS = st.one_of(st.binary(max_size=17), st.just(bytes.fromhex(TRACE)))


@st.composite
def pb_spans(draw: st.DrawFn) -> PbSpan:
    span = PbSpan(
        trace_id=draw(_mostly(st.just(bytes.fromhex(TRACE)), IDS)),
        span_id=draw(_mostly(st.integers(1, 2**64 - 1).map(lambda n: n.to_bytes(8)), IDS)),
        parent_span_id=draw(_mostly(st.just(b""), IDS)),
        name=draw(_mostly(st.text(max_size=20), ODD_TEXT)),
        start_time_unix_nano=draw(TIMES),
        end_time_unix_nano=draw(st.one_of(st.just(0), TIMES)),
    )
    span.status.code = draw(st.integers(-3, 5))  # type: ignore[assignment]
    span.status.message = draw(st.one_of(st.text(max_size=10), ODD_TEXT))
    for key, value in draw(st.lists(PB_ATTRIBUTES, max_size=5)):
        span.attributes.append(KeyValue(key=key, value=value))
    return span


@st.composite
def pb_requests(draw: st.DrawFn) -> tuple[bytes, int]:
    message = ExportTraceServiceRequest()
    sent = 0
    for _ in range(draw(st.integers(0, 2))):
        resource_spans = message.resource_spans.add()
        for key, value in draw(_mostly(st.just([]), st.lists(st.tuples(KEYS, PB_VALUES)))):
            resource_spans.resource.attributes.append(KeyValue(key=key, value=value))
        spans = draw(st.lists(pb_spans(), max_size=4))
        resource_spans.scope_spans.add().spans.extend(spans)
        sent += len(spans)
    body = message.SerializeToString()
    if draw(st.booleans()):  # or the same bytes, damaged
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.binary(max_size=8)) + body[cut + 1 :]
    return body, sent


@FUZZ
@given(pb_requests())
def test_no_protobuf_request_gets_a_server_error_or_stores_what_was_refused(api, drawn):
    body, sent = drawn
    before = _rows()
    response = post_traces(api.client, api.key, body)
    if response.status_code == 200:
        sent = sum(
            len(ss.spans)
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
        )
    _checked(response, sent, before, as_json=False)


# -- JSON --------------------------------------------------------------------------------

# Any JSON value, where OTLP/JSON wants one particular kind.
JSON_ANY = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([10**30, -(2**63) - 1, 2**64, 1.5, -0.0, 1e308]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
        ODD_TEXT,
        st.sampled_from(["\ud800", "a\udfffb", "NaN", "Infinity"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=5,
)


def _or_odd(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return _mostly(strategy, JSON_ANY)


JSON_SCALARS = st.one_of(
    st.fixed_dictionaries({"stringValue": _or_odd(JSON_TEXT)}),
    st.fixed_dictionaries({"intValue": _or_odd(st.integers().map(str))}),
    st.fixed_dictionaries(
        {
            "doubleValue": _or_odd(
                st.one_of(
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(["NaN", "Infinity", "-Infinity", "1.5", "x", 1e308, 10**400]),
                )
            )
        }
    ),
    st.fixed_dictionaries({"boolValue": _or_odd(st.booleans())}),
    st.fixed_dictionaries({"bytesValue": _or_odd(st.text(max_size=8))}),
)
JSON_VALUES = st.recursive(
    _mostly(JSON_SCALARS, JSON_ANY),
    lambda children: st.one_of(
        st.fixed_dictionaries(
            {"arrayValue": st.fixed_dictionaries({"values": st.lists(children, max_size=3)})}
        ),
        st.fixed_dictionaries(
            {
                "kvlistValue": st.fixed_dictionaries(
                    {
                        "values": st.lists(
                            st.fixed_dictionaries({"key": KEYS, "value": children}), max_size=3
                        )
                    }
                )
            }
        ),
    ),
    max_leaves=5,
)
JSON_ATTRIBUTES = _or_odd(
    st.lists(
        st.fixed_dictionaries({"key": _or_odd(st.one_of(KEYS, JSON_TEXT)), "value": JSON_VALUES}),
        max_size=4,
    )
)
SPAN_IDS = _mostly(st.integers(1, 2**64 - 1).map("{:016x}".format), st.text(max_size=17))


JSON_SPANS = _or_odd(
    st.fixed_dictionaries(
        {
            "traceId": _or_odd(_mostly(st.just(TRACE), st.text(max_size=33))),
            "spanId": _or_odd(SPAN_IDS),
            "startTimeUnixNano": _or_odd(st.one_of(TIMES, TIMES.map(str))),
        },
        optional={
            "parentSpanId": _or_odd(SPAN_IDS),
            "name": _or_odd(JSON_TEXT),
            "endTimeUnixNano": _or_odd(st.one_of(TIMES, TIMES.map(str))),
            "status": _or_odd(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "code": _or_odd(st.integers(0, 2)),
                        "message": _or_odd(st.text(max_size=5)),
                    },
                )
            ),
            "attributes": JSON_ATTRIBUTES,
        },
    )
)


@st.composite
def json_requests(draw: st.DrawFn) -> tuple[str, int]:
    entries = []
    sent = 0
    for _ in range(draw(st.integers(0, 2))):
        spans = draw(st.lists(JSON_SPANS, max_size=4))
        sent += len(spans)
        entries.append(
            {
                "resource": draw(
                    _mostly(st.just({}), st.fixed_dictionaries({"attributes": JSON_ATTRIBUTES}))
                ),
                "scopeSpans": draw(_or_odd(st.just([{"spans": spans}]))),
            }
        )
    document = draw(_or_odd(st.just({"resourceSpans": entries})))
    # ensure_ascii writes lone surrogates as \ud800 escapes, as a client would send them.
    return json.dumps(document), sent


@FUZZ
@given(json_requests())
def test_no_json_request_gets_a_server_error_or_stores_what_was_refused(api, drawn):
    body, sent = drawn
    before = _rows()
    response = api.client.post(
        "/v1/traces",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    _checked(response, sent, before, as_json=True)
