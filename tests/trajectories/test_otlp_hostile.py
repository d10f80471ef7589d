"""POST /v1/traces against odd and hostile input: one bad span is refused alone, with its
place and field named; a request too large or too deep is refused whole; nothing is a 500."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.trajectories.support import (
    NOW,
    PROTOBUF,
    post_traces,
    request,
    span,
    to_json,
)
from trajectories import otlp
from trajectories.models import Run, Span

GOOD, BAD = "1" * 16, "2" * 16


def partial(r, *, as_json: bool) -> tuple[int, str]:
    """rejectedSpans and errorMessage of a 200 answer."""
    assert r.status_code == 200
    if as_json:
        body = r.json().get("partialSuccess", {})
        return int(body.get("rejectedSpans", 0)), body.get("errorMessage", "")
    answer = ExportTraceServiceResponse.FromString(r.content).partial_success
    return answer.rejected_spans, answer.error_message


def with_bad_json_span(api, change) -> tuple[int, str]:
    """A good and a bad span in OTLP/JSON: `change` edits the bad one's JSON in place."""
    body = to_json(request(span(GOOD), span(BAD)))
    change(body["resourceSpans"][0]["scopeSpans"][0]["spans"][1])
    r = post_traces(api.client, api.key, body, as_json=True)
    return partial(r, as_json=True)


def attribute(key: str, value: dict) -> dict:
    return {"key": key, "value": value}


def add(span_json: dict, kv: dict) -> None:
    span_json.setdefault("attributes", []).append(kv)


@pytest.mark.parametrize(
    "change, field",
    [
        # isdigit() accepts superscripts that int() refuses.
        (lambda s: s.update(startTimeUnixNano="¹⁷⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰⁰"), "startTimeUnixNano"),
        (lambda s: s.update(startTimeUnixNano="9" * 5000), "startTimeUnixNano"),
        (lambda s: s.update(endTimeUnixNano=10**30), "endTimeUnixNano"),
        # 1 ns after 1970, and the last fixed64 (year 2554): times no agent reports.
        (lambda s: s.update(startTimeUnixNano="1"), "startTimeUnixNano must lie between"),
        (lambda s: s.update(endTimeUnixNano=str(2**64 - 1)), "endTimeUnixNano must lie between"),
        (lambda s: s.update(startTimeUnixNano=1.7e18), "startTimeUnixNano must be an integer"),
        (lambda s: s.update(status={"code": "²"}), "status.code"),
        (lambda s: s.update(status=[]), "status must be an object"),
        (
            lambda s: add(s, attribute("x", {"doubleValue": "not a number"})),
            "doubleValue must be a number",
        ),
        (
            lambda s: add(s, attribute("x", {"doubleValue": {}})),
            "doubleValue must be a number",
        ),
        (
            lambda s: add(s, attribute("x", {"intValue": str(2**64)})),
            "intValue must lie between",
        ),
        (
            lambda s: add(s, attribute("x", {"stringValue": {"a": 1}})),
            "stringValue must be a string",
        ),
        (
            lambda s: s.setdefault("attributes", []).append(
                attribute("gen_ai.usage.input_tokens", {"doubleValue": "Infinity"})
            ),
            "gen_ai.usage.input_tokens must be a whole number of tokens",
        ),
        (
            lambda s: s.setdefault("attributes", []).append(
                attribute("gen_ai.usage.output_tokens", {"stringValue": "1e999"})
            ),
            "gen_ai.usage.output_tokens must be a whole number of tokens",
        ),
        (
            lambda s: add(s, attribute("tallybook.run.id", {"stringValue": "a\0b"})),
            "attributes.tallybook.run.id: NUL characters",
        ),
        (lambda s: s.update(name="na\0me"), "name: NUL characters"),
        (lambda s: s.update(name="\ud800"), "name: lone surrogates"),
        (
            lambda s: add(s, attribute("\udc00key", {"stringValue": "v"})),
            "(the key): lone surrogates",
        ),
        (
            lambda s: s.setdefault("attributes", []).append(
                attribute("tallybook.run.id", {"stringValue": "run-\udfff"})
            ),
            "attributes.tallybook.run.id: lone surrogates",
        ),
    ],
)
def test_one_bad_json_span_is_refused_alone_naming_its_place_and_field(api, change, field):
    rejected, message = with_bad_json_span(api, change)
    assert rejected == 1
    assert f"spans[1] (spanId {BAD})" in message and field in message
    assert list(Span.objects.values_list("span_id", flat=True)) == [GOOD]
    assert list(Run.objects.values_list("span_count", flat=True)) == [1]


@pytest.mark.parametrize(
    "bad, field",
    [
        (span(BAD, attributes={"gen_ai.usage.input_tokens": float("inf")}), "input_tokens"),
        (span(BAD, attributes={"tallybook.run.id": "a\0b"}), "NUL characters"),
        (span(BAD, "na\0me"), "name: NUL"),
    ],
)
def test_one_bad_protobuf_span_is_refused_alone(api, bad, field):
    bad.end_time_unix_nano = 0
    r = post_traces(api.client, api.key, request(span(GOOD), bad))
    rejected, message = partial(r, as_json=False)
    assert rejected == 1 and field in message and "spans[1]" in message
    assert list(Span.objects.values_list("span_id", flat=True)) == [GOOD]


def test_a_protobuf_span_that_ends_after_the_last_fixed64_year_is_refused_alone(api):
    bad = span(BAD)
    bad.end_time_unix_nano = 2**64 - 1
    rejected, message = partial(
        post_traces(api.client, api.key, request(span(GOOD), bad)), as_json=False
    )
    assert rejected == 1 and "endTimeUnixNano must lie between" in message


def test_a_resource_with_a_nul_in_its_run_id_refuses_its_spans_and_no_other(api):
    body = to_json(request(span(BAD)))
    body["resourceSpans"][0]["resource"].setdefault("attributes", []).append(
        attribute("tallybook.run.id", {"stringValue": "run\0"})
    )
    body["resourceSpans"].append(to_json(request(span(GOOD)))["resourceSpans"][0])
    rejected, message = partial(post_traces(api.client, api.key, body, as_json=True), as_json=True)
    assert rejected == 1 and "resource.tallybook.run.id: NUL characters" in message
    assert list(Span.objects.values_list("span_id", flat=True)) == [GOOD]


def test_json_deep_inside_a_message_attribute_is_kept_as_text(api):
    deep = "[" * 10_000 + "]" * 10_000
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": deep}
    r = post_traces(api.client, api.key, request(span(GOOD, attributes=attributes)))
    assert partial(r, as_json=False) == (0, "")
    assert Span.objects.get().output == deep[: len(Span.objects.get().output)]


def test_json_escaping_a_lone_surrogate_in_a_message_attribute_is_kept_as_text(api):
    # Valid JSON, which jsonb refuses: stored as the text it came as, the batch not lost.
    lone = '[{"role": "user", "content": "\\ud800"}]'
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": lone}
    r = post_traces(api.client, api.key, request(span(GOOD, attributes=attributes)))
    assert partial(r, as_json=False) == (0, "")
    assert Span.objects.get().input == lone


@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceSpans": {}}',
        b'{"resourceSpans": [{"scopeSpans": {}}]}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": {}}]}]}',
        b'{"resourceSpans": ["x"]}',
        b'{"resourceSpans": [], "resourceSpans": []}',
        b'{"resourceSpans": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"resourceSpans": NaN}',
    ],
    ids=["map", "scopes-map", "spans-map", "entry-string", "duplicate-key", "deep", "nan"],
)
def test_a_json_request_of_the_wrong_shape_is_a_400_in_json(api, body):
    r = api.client.post(
        "/v1/traces",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert r.status_code == 400
    assert r.json()["code"] == 3 and "ExportTraceServiceRequest" in r.json()["message"]
    assert not Span.objects.exists()


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_a_request_over_the_span_cap_is_a_413_in_its_own_encoding(api, as_json):
    spans = [span(f"{n + 1:016x}") for n in range(otlp.MAX_SPANS + 1)]
    r = post_traces(api.client, api.key, request(*spans), as_json=as_json)
    assert r.status_code == 413
    message = r.json()["message"] if as_json else status_pb2.Status.FromString(r.content).message
    assert f"{otlp.MAX_SPANS + 1} spans in one request, over {otlp.MAX_SPANS}" in message
    assert not Span.objects.exists()


def test_a_request_at_the_span_cap_is_stored(api, monkeypatch):
    monkeypatch.setattr(otlp, "MAX_SPANS", 3)
    spans = [span(f"{n + 1:016x}") for n in range(3)]
    assert partial(post_traces(api.client, api.key, request(*spans)), as_json=False) == (0, "")
    assert Span.objects.count() == 3


def test_a_gzip_bomb_is_a_413_and_is_not_inflated_past_the_cap(api):
    bomb = gzip.compress(b"\0" * (otlp.MAX_INFLATED + 1))
    assert len(bomb) < 100_000
    r = post_traces(api.client, api.key, bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and r["Content-Type"] == PROTOBUF
    assert "inflates to over" in status_pb2.Status.FromString(r.content).message
    assert not Span.objects.exists()


def test_a_truncated_gzip_body_is_a_400(api):
    body = gzip.compress(request(span(GOOD)).SerializeToString())[:-12]
    r = post_traces(api.client, api.key, body, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert "truncated" in status_pb2.Status.FromString(r.content).message


def test_a_protobuf_request_is_refused_in_protobuf_at_the_front_door(api, monkeypatch):
    anonymous = api.client.post(
        "/v1/traces", data=request(span(GOOD)).SerializeToString(), content_type=PROTOBUF
    )
    assert anonymous.status_code == 401 and anonymous["Content-Type"] == PROTOBUF
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert status_pb2.Status.FromString(anonymous.content).code == 16  # UNAUTHENTICATED
    too_big = post_traces(api.client, api.key, b"\n" * (4 * 1024 * 1024 + 1))
    assert too_big.status_code == 413 and too_big["Content-Type"] == PROTOBUF
    assert "over" in status_pb2.Status.FromString(too_big.content).message


def test_a_json_request_is_refused_in_otlp_json_at_the_front_door(api):
    r = api.client.post("/v1/traces", data="{}", content_type="application/json")
    assert r.status_code == 401
    assert r.json() == {"code": 16, "message": "Missing, wrong or revoked API key"}


def test_times_are_stored_in_utc_to_the_microsecond(api):
    post_traces(api.client, api.key, request(span(GOOD)), as_json=True)
    start = Span.objects.get().start
    assert start.utcoffset() == timedelta(0)
    assert start == datetime.fromtimestamp(NOW // 10**9, UTC) + timedelta(
        microseconds=NOW % 10**9 // 1000
    )
