"""OTLP/HTTP traces: decode protobuf or JSON requests into spans, encode the answers.

Follows the OTLP specification: JSON ids are hex strings, enums are integers (names are
accepted too), 64-bit integers may be strings; a span that breaks the rules is rejected
alone and counted in `partialSuccess`; a payload that cannot be decoded is a 400.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.http import HttpResponse
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from trajectories.semconv import SpanData, span_from_otel

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# A gzip body may not inflate beyond this: a small request must not become a huge one.
MAX_INFLATED = 32 * 1024 * 1024
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}
STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_HEX = re.compile(r"^[0-9a-fA-F]*$")
# At most this many reasons are joined into partialSuccess.errorMessage.
MAX_REASONS = 5


class Undecodable(Exception):
    """The payload is not an OTLP trace export request."""


class BadSpan(Exception):
    """One span breaks the rules; it is rejected, the others are kept."""


@dataclass
class Decoded:
    spans: list[SpanData] = field(default_factory=list)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.reasons) < MAX_REASONS and reason not in self.reasons:
            self.reasons.append(reason)


def inflate(body: bytes, encoding: str) -> bytes:
    """The body without its Content-Encoding (gzip, deflate or none)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Undecodable(f"Content-Encoding {encoding!r} is not supported (use gzip)")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, MAX_INFLATED)
    except zlib.error as exc:
        raise Undecodable(f"The {encoding} body does not inflate: {exc}") from exc
    if inflater.unconsumed_tail:
        raise Undecodable(f"The inflated body is over {MAX_INFLATED} bytes")
    return data


def _time(nanos: int) -> datetime:
    return EPOCH + timedelta(microseconds=nanos // 1000)


def _hex_id(raw: str, size: int, name: str, *, optional: bool = False) -> str:
    """A validated lowercase hex id of `size` bytes, or "" for an empty optional one."""
    if not raw and optional:
        return ""
    if len(raw) != size * 2 or not _HEX.match(raw):
        raise BadSpan(f"{name} must be {size * 2} hex digits")
    if raw.strip("0") == "":
        if optional:
            return ""
        raise BadSpan(f"{name} must not be all zeros")
    return raw.lower()


def _span(
    decoded: Decoded,
    resource: dict[str, Any],
    *,
    trace_id: str,
    span_id: str,
    parent_span_id: str,
    name: str,
    start_ns: int,
    end_ns: int,
    status_code: int,
    status_message: str,
    attributes: dict[str, Any],
) -> None:
    """Check the times and keep the span; its ids are valid lowercase hex already."""
    if start_ns <= 0:
        raise BadSpan("startTimeUnixNano is required")
    if end_ns and end_ns < start_ns:
        raise BadSpan("endTimeUnixNano is before startTimeUnixNano")
    decoded.spans.append(
        span_from_otel(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent_span_id,
            name=name,
            start=_time(start_ns),
            end=_time(end_ns) if end_ns else None,
            status=STATUS_CODES.get(status_code, "unset"),
            status_message=status_message[:4000],
            attributes=attributes,
            resource=resource,
        )
    )


# -- protobuf ----------------------------------------------------------------------------


# AnyValue fields read as they are; arrays, maps and bytes are converted.
_PB_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value"})


def _pb_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which in _PB_SCALARS:
        return getattr(value, which)
    if which == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _pb_attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def _pb_attributes(pairs: Any) -> dict[str, Any]:
    attributes = {}
    for kv in pairs:
        value = kv.value
        # Inline for strings, most attributes: one function call less each.
        if value.WhichOneof("value") == "string_value":
            attributes[kv.key] = value.string_value
        else:
            attributes[kv.key] = _pb_value(value)
    return attributes


def _pb_id(raw: bytes, size: int, name: str, *, optional: bool = False) -> str:
    """The hex of a binary id of `size` bytes, or "" for an empty optional one."""
    if len(raw) != size:
        if optional and not raw:
            return ""
        raise BadSpan(f"{name} must be {size * 2} hex digits")
    if not raw.strip(b"\0"):
        if optional:
            return ""
        raise BadSpan(f"{name} must not be all zeros")
    return raw.hex()


def decode_protobuf(body: bytes) -> Decoded:
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise Undecodable(f"Not an OTLP ExportTraceServiceRequest: {exc}") from exc
    decoded = Decoded()
    for resource_spans in request.resource_spans:
        resource = _pb_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    _pb_span(decoded, resource, span)
                except BadSpan as exc:
                    decoded.reject(str(exc))
    return decoded


def _pb_span(decoded: Decoded, resource: dict[str, Any], span: PbSpan) -> None:
    _span(
        decoded,
        resource,
        trace_id=_pb_id(span.trace_id, 16, "traceId"),
        span_id=_pb_id(span.span_id, 8, "spanId"),
        parent_span_id=_pb_id(span.parent_span_id, 8, "parentSpanId", optional=True),
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status_code=span.status.code,
        status_message=span.status.message,
        attributes=_pb_attributes(span.attributes),
    )


# -- JSON --------------------------------------------------------------------------------


def _json_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise BadSpan(f"{name} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if value is None:
        return 0
    raise BadSpan(f"{name} must be an integer")


def _json_value(value: Any) -> Any:
    if not isinstance(value, dict):
        raise BadSpan("an attribute value must be an AnyValue object")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "intValue" in value:
        return _json_int(value["intValue"], "intValue")
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "doubleValue" in value:
        number = value["doubleValue"]
        if not isinstance(number, (int, float, str)) or isinstance(number, bool):
            raise BadSpan("doubleValue must be a number")
        return float(number)
    if "arrayValue" in value:
        return [_json_value(v) for v in _json_list(value["arrayValue"], "values")]
    if "kvlistValue" in value:
        return _json_attributes(_json_list(value["kvlistValue"], "values"))
    if "bytesValue" in value:
        return str(value["bytesValue"])
    return None


def _json_list(parent: Any, key: str) -> list[Any]:
    if not isinstance(parent, dict):
        raise BadSpan(f"expected an object holding {key!r}")
    items = parent.get(key) or []
    if not isinstance(items, list):
        raise BadSpan(f"{key} must be an array")
    return items


def _json_attributes(pairs: list[Any]) -> dict[str, Any]:
    attributes = {}
    for kv in pairs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise BadSpan("an attribute must be an object with a string key")
        attributes[kv["key"]] = _json_value(kv.get("value", {}))
    return attributes


def _json_status(status: Any) -> tuple[int, str]:
    if not isinstance(status, dict):
        return 0, ""
    code = status.get("code", 0)
    if isinstance(code, str):
        code = STATUS_NAMES.get(code, 0)
    return _json_int(code, "status.code"), str(status.get("message") or "")


def _json_span(decoded: Decoded, resource: dict[str, Any], span: Any) -> None:
    if not isinstance(span, dict):
        raise BadSpan("a span must be an object")
    for name in ("traceId", "spanId", "parentSpanId", "name"):
        if not isinstance(span.get(name, ""), str):
            raise BadSpan(f"{name} must be a string")
    status_code, status_message = _json_status(span.get("status"))
    start_ns = _json_int(span.get("startTimeUnixNano"), "startTimeUnixNano")
    end_ns = _json_int(span.get("endTimeUnixNano"), "endTimeUnixNano")
    attributes = _json_attributes(_json_list(span, "attributes"))
    _span(
        decoded,
        resource,
        trace_id=_hex_id(span.get("traceId", ""), 16, "traceId"),
        span_id=_hex_id(span.get("spanId", ""), 8, "spanId"),
        parent_span_id=_hex_id(span.get("parentSpanId", ""), 8, "parentSpanId", optional=True),
        name=span.get("name", ""),
        start_ns=start_ns,
        end_ns=end_ns,
        status_code=status_code,
        status_message=status_message,
        attributes=attributes,
    )


def decode_json(body: bytes) -> Decoded:
    try:
        request = json.loads(body)
        resource_spans = _json_list(request, "resourceSpans")
    except (ValueError, BadSpan) as exc:
        raise Undecodable(f"Not an OTLP/JSON ExportTraceServiceRequest: {exc}") from exc
    decoded = Decoded()
    for entry in resource_spans:
        try:
            resource = _json_attributes(_json_list(entry.get("resource") or {}, "attributes"))
            scopes = _json_list(entry, "scopeSpans")
            spans = [s for scope in scopes for s in _json_list(scope, "spans")]
        except (BadSpan, AttributeError) as exc:
            raise Undecodable(f"Malformed resourceSpans: {exc}") from exc
        for span in spans:
            try:
                _json_span(decoded, resource, span)
            except BadSpan as exc:
                decoded.reject(str(exc))
    return decoded


def decode(body: bytes, content_type: str) -> Decoded:
    return decode_protobuf(body) if content_type == PROTOBUF else decode_json(body)


# -- answers -----------------------------------------------------------------------------


def export_response(content_type: str, decoded: Decoded) -> HttpResponse:
    """200, with partialSuccess when some spans were rejected."""
    message = "; ".join(decoded.reasons)
    if content_type == PROTOBUF:
        answer = ExportTraceServiceResponse()
        if decoded.rejected:
            answer.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=decoded.rejected, error_message=message)
            )
        return HttpResponse(answer.SerializeToString(), content_type=PROTOBUF)
    body: dict[str, Any] = {}
    if decoded.rejected:
        # int64 is a string in the protobuf JSON mapping.
        body["partialSuccess"] = {"rejectedSpans": str(decoded.rejected), "errorMessage": message}
    return HttpResponse(json.dumps(body), content_type=JSON)


GRPC_CODES = {
    400: code_pb2.INVALID_ARGUMENT,
    413: code_pb2.INVALID_ARGUMENT,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}


def status_response(
    content_type: str, status: int, message: str, retry_after: int | None = None
) -> HttpResponse:
    """An error as OTLP wants it: a google.rpc.Status in the request's encoding."""
    code = GRPC_CODES[status]
    if content_type == PROTOBUF:
        body = status_pb2.Status(code=code, message=message).SerializeToString()
        response = HttpResponse(body, status=status, content_type=PROTOBUF)
    else:
        text = json.dumps({"code": code, "message": message})
        response = HttpResponse(text, status=status, content_type=JSON)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
