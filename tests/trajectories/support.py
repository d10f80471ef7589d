"""OTLP requests for the trajectory tests: hand-built spans, OTLP/JSON encoding, posting;
a Redis queue, and an ingest path kept busy by another connection."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, cast

import django_rq
import psycopg
import pytest
from django.db import connection
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from rq import SimpleWorker

from trajectories import ingest

PROTOBUF = "application/x-protobuf"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
NOW = time.time_ns()


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        result = AnyValue()
        result.array_value.values.extend(any_value(v) for v in value)
        return result
    if isinstance(value, dict):
        result = AnyValue()
        result.kvlist_value.values.extend(
            KeyValue(key=k, value=any_value(v)) for k, v in value.items()
        )
        return result
    return AnyValue(string_value=str(value))


def span(
    span_id: str,
    name: str = "span",
    *,
    trace_id: str = TRACE,
    parent: str = "",
    at_ms: int = 0,
    duration_ms: int = 10,
    status: int = 0,
    attributes: dict[str, Any] | None = None,
) -> Span:
    """A span `at_ms` after NOW; ids are hex (any length: invalid ones are for bad-input tests)."""
    result = Span(
        trace_id=bytes.fromhex(trace_id),
        span_id=bytes.fromhex(span_id),
        parent_span_id=bytes.fromhex(parent),
        name=name,
        start_time_unix_nano=NOW + at_ms * 10**6,
        end_time_unix_nano=NOW + (at_ms + duration_ms) * 10**6 if duration_ms else 0,
    )
    result.status.code = status  # type: ignore[assignment]
    for key, value in (attributes or {}).items():
        result.attributes.append(KeyValue(key=key, value=any_value(value)))
    return result


def request(*spans: Span, resource: dict[str, Any] | None = None) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    for key, value in (resource or {"service.name": "refund-agent"}).items():
        resource_spans.resource.attributes.append(KeyValue(key=key, value=any_value(value)))
    resource_spans.scope_spans.add().spans.extend(spans)
    return message


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants hex ids."""
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex()
            if k in ("traceId", "spanId", "parentSpanId")
            else _hex_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


def to_json(message: ExportTraceServiceRequest) -> dict[str, Any]:
    """The OTLP/JSON encoding of a request: camelCase keys, hex ids, integer enums."""
    return cast(
        dict[str, Any], _hex_ids(json_format.MessageToDict(message, use_integers_for_enums=True))
    )


def post_traces(
    client: Any,
    key: str,
    message: Any,
    *,
    as_json: bool = False,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST /v1/traces: a request as protobuf (or OTLP/JSON), raw bytes, or a JSON dict."""
    body: bytes | str
    if as_json:
        body = json.dumps(message if isinstance(message, dict) else to_json(message))
        content_type = "application/json"
    else:
        body = message if isinstance(message, bytes) else message.SerializeToString()
        content_type = PROTOBUF
    return client.post(
        "/v1/traces",
        data=body,
        content_type=content_type,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    )


def chat(span_id: str, *, calls: tuple[str, ...] = ("call_1",), at_ms: int = 0, **kw: Any) -> Span:
    """A GenAI chat span whose output asks for the given tool calls."""
    output = [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": c, "name": "refund"} for c in calls],
            "finish_reason": "tool_call",
        }
    ]
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.output.messages": json.dumps(output),
        **kw.pop("attributes", {}),
    }
    return span(span_id, "chat gpt-4o", at_ms=at_ms, attributes=attributes, **kw)


def tool(span_id: str, call_id: str = "call_1", *, at_ms: int = 50, **kw: Any) -> Span:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "refund",
        "gen_ai.tool.call.id": call_id,
        **kw.pop("attributes", {}),
    }
    return span(span_id, "execute_tool refund", at_ms=at_ms, attributes=attributes, **kw)


@pytest.fixture
def queue(settings):
    """The RQ queue on the test Redis, empty; run its jobs with `work(queue)`."""
    assert settings.REDIS_URL, "these tests need REDIS_URL"
    q = django_rq.get_queue("default")
    q.connection.flushdb()
    yield q
    q.connection.flushdb()


def work(queue: Any) -> None:
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def _other_connection() -> psycopg.Connection[Any]:
    dsn = connection.settings_dict
    return psycopg.connect(
        dbname=dsn["NAME"], user=dsn["USER"], host=dsn["HOST"], port=dsn["PORT"] or 5432
    )


@pytest.fixture
def slots_taken(project):
    """Another connection holds every ingest slot of the project, as busy batches would."""
    with _other_connection() as held, held.transaction():
        for slot in range(ingest.SLOTS_PER_PROJECT):
            held.execute(
                "SELECT pg_advisory_xact_lock(%s, ((%s::bigint * %s + %s) %% 2147483647)::int)",
                [ingest.SLOT_LOCK_CLASS, project.pk, ingest.SLOTS_PER_PROJECT, slot],
            )
        yield


@pytest.fixture
def ingest_stalled(db, monkeypatch):
    """Another connection locks the runs and event ids, so that ingest times out waiting.

    Use before the test's own transaction has touched those tables.
    """
    monkeypatch.setattr(ingest, "LOCK_TIMEOUT", "50ms")
    with _other_connection() as held, held.transaction():
        held.execute("SET LOCAL lock_timeout = '5s'")
        held.execute("LOCK TABLE trajectories_run, trajectories_seenevent IN ACCESS EXCLUSIVE MODE")
        yield
