"""OTLP/HTTP traces: decode protobuf or JSON requests into spans, encode the answers.

Follows the OTLP specification: JSON ids are hex strings, enums are integers (names are
accepted too), 64-bit integers may be strings; a span that breaks the rules is rejected
alone and counted in `partialSuccess`, its place and field named in `errorMessage`; a
payload that cannot be decoded is a 400, one too large to take a 413.
"""

from __future__ import annotations

import base64
import json
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import wraps
from typing import Any, Concatenate

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from durability.api.decorators import DATABASE_AWAY, DATABASE_RETRY_AFTER
from durability.inbound import (
    MAX_DEPTH,
    Path,
    decimal_digits,
    instant_from_unix_nanos,
    json_loads,
    unstorable_at,
)
from trajectories.semconv import SpanData, span_from_otel

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# A request may carry at most this many spans, and its body may inflate to at most this
# many bytes; a larger one is a 413 and stores nothing. The OpenTelemetry SDK exports 512
# spans a batch by default, the Collector 8,192: 10,000 spans take about a second to store,
# so one request cannot hold an ingest slot (and a web thread) for long. 16 MiB holds
# 10,000 spans of 1.6 KB; spans with long messages come in smaller batches anyway.
MAX_SPANS = 10_000
MAX_INFLATED = 16 * 1024 * 1024
# A request over this many bytes once inflated is a large batch: one web process works on at
# most TALLYBOOK_INGEST_LARGE_PER_PROCESS of them at once (ingest.large_batch). Under it a
# request costs the process tens of milliseconds at most, and the OpenTelemetry SDK's batches
# (512 spans of a few hundred bytes) stay under it; a maximum request costs seconds.
LARGE_BODY = 256 * 1024
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}
STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_HEX = re.compile(r"^[0-9a-fA-F]*$")
# At most this many reasons are joined into partialSuccess.errorMessage.
MAX_REASONS = 5


class Undecodable(Exception):
    """The payload is not an OTLP trace export request."""


class TooLarge(Exception):
    """The request is over MAX_SPANS or MAX_INFLATED: a 413, nothing stored."""


class BadSpan(Exception):
    """One span breaks the rules; it is rejected, the others are kept."""


@dataclass
class Decoded:
    spans: list[SpanData] = field(default_factory=list)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject(self, where: str, reason: str) -> None:
        self.rejected += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(f"{where}: {reason}")


def is_large(body: bytes, encoding: str) -> bool:
    """Whether the body is over LARGE_BODY once inflated, found out by inflating no more than
    LARGE_BODY + 1 bytes of it (a millisecond): what a gzip body weighs says nothing of what it
    costs (the flood's maximum requests are 66 KB of gzip inflating to 16 MiB). A body that
    does not inflate is not large: inflate() refuses it."""
    encoding = encoding.strip().lower()
    if encoding not in ("gzip", "deflate"):
        return len(body) > LARGE_BODY
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        return len(inflater.decompress(body, LARGE_BODY + 1)) > LARGE_BODY
    except zlib.error:
        return False


def inflate(body: bytes, encoding: str) -> bytes:
    """The body without its Content-Encoding (gzip, deflate or none).

    Inflates at most one byte past MAX_INFLATED, so a small bomb never becomes a big body.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Undecodable(f"Content-Encoding {encoding!r} is not supported (use gzip)")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, MAX_INFLATED + 1)
    except zlib.error as exc:
        raise Undecodable(f"The {encoding} body does not inflate: {exc}") from exc
    if len(data) > MAX_INFLATED:
        raise TooLarge(f"The body inflates to over {MAX_INFLATED} bytes; send smaller batches")
    if not inflater.eof:
        raise Undecodable(f"The {encoding} body is truncated")
    return data


def _spans_within(count: int) -> None:
    if count > MAX_SPANS:
        raise TooLarge(f"{count} spans in one request, over {MAX_SPANS}; send smaller batches")


def _time(nanos: int, name: str) -> datetime:
    try:
        return instant_from_unix_nanos(nanos)
    except ValueError as exc:
        message = str(exc)
        joined = f"{name} {message}" if message.startswith("must") else f"{name}: {message}"
        raise BadSpan(joined) from None


def _shown(path: Path, is_key: bool) -> str:
    """A path as OTLP's errors show it, `attributes.tags[0]`; a key that cannot be stored
    cannot be shown as it is either."""
    shown = ""
    for n, part in enumerate(path):
        if isinstance(part, int):
            shown += f"[{part}]"
        else:
            name = ascii(part) if is_key and n == len(path) - 1 else part
            shown += f".{name}" if shown else name
    return f"{shown} (the key)" if is_key else shown


def _refuse_unstorable(texts: dict[str, Any]) -> None:
    """BadSpan naming the first NUL character or lone surrogate among `texts`.

    One encoding of them all first: almost every span holds neither, and walking every
    attribute of every span would cost more than storing it.
    """
    dumped = json.dumps(texts, ensure_ascii=False)
    if "\\u0000" not in dumped:
        try:
            dumped.encode()
            return
        except UnicodeEncodeError:
            pass
    if (found := unstorable_at(texts)) is not None:
        path, is_key, why = found
        raise BadSpan(f"{_shown(path, is_key)}: {why}")


def _without_nul(name: str, status_message: str, attributes: dict[str, Any]) -> bool:
    """Whether a protobuf span's texts surely hold no NUL, the one thing its valid UTF-8 (the
    decoder refuses any other) can hold that PostgreSQL cannot store; found without encoding
    them. False also for an attribute that nests (an array, a map): left to the full search."""
    if "\x00" in name or "\x00" in status_message:
        return False
    for key, value in attributes.items():
        if "\x00" in key or (type(value) is str and "\x00" in value):
            return False
        if type(value) is list or type(value) is dict:
            return False
    return True


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
    utf8: bool = False,
) -> None:
    """Check the times and texts and keep the span; its ids are valid lowercase hex already,
    its texts valid UTF-8 when `utf8` (protobuf's)."""
    if start_ns <= 0:
        raise BadSpan("startTimeUnixNano is required")
    start = _time(start_ns, "startTimeUnixNano")
    end = _time(end_ns, "endTimeUnixNano") if end_ns else None
    if end is not None and end < start:
        raise BadSpan("endTimeUnixNano is before startTimeUnixNano")
    if not (utf8 and _without_nul(name, status_message, attributes)):
        _refuse_unstorable(
            {"name": name, "status.message": status_message, "attributes": attributes}
        )
    try:
        mapped = span_from_otel(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent_span_id,
            name=name,
            start=start,
            end=end,
            status=STATUS_CODES.get(status_code, "unset"),
            status_message=status_message[:4000],
            attributes=attributes,
            resource=resource,
        )
    except ValueError as exc:  # an attribute the conventions give a meaning it cannot have
        raise BadSpan(str(exc)) from None
    decoded.spans.append(mapped)


def _where(r: int, s: int, i: int, span_id: Any) -> str:
    """A span's place in the request, as errorMessage names it (with its id, if one)."""
    place = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
    if isinstance(span_id, str) and 0 < len(span_id) <= 32 and _HEX.match(span_id):
        return f"{place} (spanId {span_id})"
    return place


def _resource_refusal(resource: dict[str, Any]) -> str | None:
    """Why the spans of a resource are refused, or None: a resource text PostgreSQL cannot
    store (it is stored with every span, `tallybook.run.id` names their run)."""
    try:
        _refuse_unstorable({"resource": resource})
    except BadSpan as exc:
        return str(exc)
    return None


# -- protobuf ----------------------------------------------------------------------------


# AnyValue fields read as they are; arrays, maps and bytes are converted.
_PB_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value"})


def _pb_value(value: AnyValue, depth: int = 1) -> Any:
    which = value.WhichOneof("value")
    if which in _PB_SCALARS:
        return getattr(value, which)
    if depth > MAX_DEPTH:
        raise BadSpan(f"an attribute value nested deeper than {MAX_DEPTH} levels")
    if which == "array_value":
        return [_pb_value(v, depth + 1) for v in value.array_value.values]
    if which == "kvlist_value":
        return _pb_attributes(value.kvlist_value.values, depth + 1)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def _pb_attributes(pairs: Any, depth: int = 1) -> dict[str, Any]:
    attributes = {}
    for kv in pairs:
        value = kv.value
        # Inline for strings, most attributes: one function call less each.
        if value.WhichOneof("value") == "string_value":
            attributes[kv.key] = value.string_value
        else:
            attributes[kv.key] = _pb_value(value, depth)
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
    _spans_within(sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans))
    decoded = Decoded()
    for r, resource_spans in enumerate(request.resource_spans):
        try:
            resource = _pb_attributes(resource_spans.resource.attributes)
            refusal = _resource_refusal(resource)
        except BadSpan as exc:
            refusal = str(exc)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            for i, span in enumerate(scope_spans.spans):
                if refusal is not None:
                    decoded.reject(_where(r, s, i, span.span_id.hex()), refusal)
                    continue
                try:
                    _pb_span(decoded, resource, span)
                except BadSpan as exc:
                    decoded.reject(_where(r, s, i, span.span_id.hex()), str(exc))
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
        utf8=True,
    )


# -- JSON --------------------------------------------------------------------------------

# The bounds of OTLP's 64-bit integers: fixed64 times, int64 attribute values.
UINT64 = (0, 2**64 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _json_int(value: Any, name: str, bounds: tuple[int, int] = UINT64) -> int:
    """A 64-bit integer as the protobuf JSON mapping writes it: a number or a decimal string."""
    if value is None:
        return 0
    if isinstance(value, str):
        digits = value.removeprefix("-")
        try:
            number = decimal_digits(digits) * (-1 if digits != value else 1)
        except ValueError as exc:
            raise BadSpan(f"{name}: {exc}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BadSpan(f"{name} must be an integer")
    if not bounds[0] <= number <= bounds[1]:
        raise BadSpan(f"{name} must lie between {bounds[0]} and {bounds[1]}")
    return number


# The special values of a double in the protobuf JSON mapping.
_DOUBLE_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _json_double(value: Any) -> float:
    if isinstance(value, str):
        if value in _DOUBLE_NAMES:
            return _DOUBLE_NAMES[value]
        if len(value) <= 64 and value.isascii():
            try:
                return float(value)
            except ValueError:
                pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            pass
    raise BadSpan("doubleValue must be a number")


def _json_value(value: Any, depth: int = 1) -> Any:
    if not isinstance(value, dict):
        raise BadSpan("an attribute value must be an AnyValue object")
    if "stringValue" in value:
        if not isinstance(value["stringValue"], str):
            raise BadSpan("stringValue must be a string")
        return value["stringValue"]
    if "intValue" in value:
        return _json_int(value["intValue"], "intValue", INT64)
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise BadSpan("boolValue must be true or false")
        return value["boolValue"]
    if "doubleValue" in value:
        return _json_double(value["doubleValue"])
    if depth > MAX_DEPTH:
        raise BadSpan(f"an attribute value nested deeper than {MAX_DEPTH} levels")
    if "arrayValue" in value:
        return [_json_value(v, depth + 1) for v in _json_list(value["arrayValue"], "values")]
    if "kvlistValue" in value:
        return _json_attributes(_json_list(value["kvlistValue"], "values"), depth + 1)
    if "bytesValue" in value:
        if not isinstance(value["bytesValue"], str):
            raise BadSpan("bytesValue must be a base64 string")
        return value["bytesValue"]
    return None


def _json_list(parent: Any, key: str) -> list[Any]:
    if not isinstance(parent, dict):
        raise BadSpan(f"expected an object holding {key!r}")
    # Absent is empty, as in protobuf; null (which the document does not allow) is refused.
    if key not in parent:
        return []
    items = parent[key]
    if not isinstance(items, list):
        raise BadSpan(f"{key} must be an array")
    return items


def _json_attributes(pairs: list[Any], depth: int = 1) -> dict[str, Any]:
    attributes = {}
    for kv in pairs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise BadSpan("an attribute must be an object with a string key")
        attributes[kv["key"]] = _json_value(kv.get("value", {}), depth)
    return attributes


def _json_status(status: Any) -> tuple[int, str]:
    if status is None:
        return 0, ""
    if not isinstance(status, dict):
        raise BadSpan("status must be an object")
    code = status.get("code", 0)
    if isinstance(code, str) and code in STATUS_NAMES:
        code = STATUS_NAMES[code]
    message = status.get("message") or ""
    if not isinstance(message, str):
        raise BadSpan("status.message must be a string")
    return _json_int(code, "status.code"), message


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


def _json_resource(entry: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A resourceSpans entry's resource attributes, and why its spans are refused (or None)."""
    try:
        resource = _json_attributes(_json_list(entry.get("resource") or {}, "attributes"))
    except BadSpan as exc:
        return {}, f"resource: {exc}"
    return resource, _resource_refusal(resource)


def decode_json(body: bytes) -> Decoded:
    """Spans from OTLP/JSON; the whole shape (arrays of objects down to the spans) is checked
    before any span, so that a malformed request stores nothing."""
    try:
        request = json_loads(body)
        entries = _json_list(request, "resourceSpans")
        scopes = [
            (r, entry, [(s, _json_list(scope, "spans")) for s, scope in enumerate(_scopes(entry))])
            for r, entry in enumerate(entries)
        ]
    except (ValueError, BadSpan) as exc:
        raise Undecodable(f"Not an OTLP/JSON ExportTraceServiceRequest: {exc}") from exc
    _spans_within(sum(len(spans) for _, _, lists in scopes for _, spans in lists))
    decoded = Decoded()
    for r, entry, lists in scopes:
        resource, refusal = _json_resource(entry)
        for s, spans in lists:
            for i, span in enumerate(spans):
                span_id = span.get("spanId") if isinstance(span, dict) else None
                where = _where(r, s, i, span_id if isinstance(span_id, str) else None)
                if refusal is not None:
                    decoded.reject(where, refusal)
                    continue
                try:
                    _json_span(decoded, resource, span)
                except BadSpan as exc:
                    decoded.reject(where, str(exc))
    return decoded


def _scopes(entry: Any) -> list[Any]:
    if not isinstance(entry, dict):
        raise BadSpan("a resourceSpans entry must be an object")
    return _json_list(entry, "scopeSpans")


def decode(body: bytes, content_type: str) -> Decoded:
    """The spans of a request; Undecodable (400) or TooLarge (413) for the whole of it."""
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
    401: code_pb2.UNAUTHENTICATED,
    413: code_pb2.INVALID_ARGUMENT,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}


def status_response(
    content_type: str, status: int, message: str, retry_after: int | None = None
) -> HttpResponse:
    """An error as OTLP wants it: a google.rpc.Status in the request's encoding."""
    code = GRPC_CODES.get(status, code_pb2.UNKNOWN)
    if content_type == PROTOBUF:
        body = status_pb2.Status(code=code, message=message).SerializeToString()
        response = HttpResponse(body, status=status, content_type=PROTOBUF)
    else:
        text = json.dumps({"code": code, "message": message})
        response = HttpResponse(text, status=status, content_type=JSON)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


type _View[**P] = Callable[Concatenate[HttpRequest, P], HttpResponse]


def in_request_encoding[**P](view: _View[P]) -> _View[P]:
    """The API's front door refuses in JSON (`{"error": …}`: a 401, a 413 over the body
    limit); an OTLP client reads a google.rpc.Status in its request's encoding."""

    @wraps(view)
    def wrapper(request: HttpRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
        content_type = PROTOBUF if request.content_type == PROTOBUF else JSON
        try:
            response = view(request, *args, **kwargs)
        except (OperationalError, InterfaceError):
            # PostgreSQL away while the key is looked up: what the API's middleware answers
            # in JSON (durability/api/middleware.py), in the request's encoding.
            return status_response(content_type, 503, DATABASE_AWAY, DATABASE_RETRY_AFTER)
        if response.status_code < 400 or not isinstance(response, JsonResponse):
            return response
        message = json.loads(response.content).get("error") or response.reason_phrase
        encoded = status_response(content_type, response.status_code, message)
        for header in ("WWW-Authenticate", "Retry-After"):
            if header in response:
                encoded[header] = response[header]
        return encoded

    return wrapper
