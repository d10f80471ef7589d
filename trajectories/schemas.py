"""Schemas of POST /api/v1/events (run and span events, each with its own id) and of the
OTLP/JSON bodies of POST /v1/traces; the OpenAPI document is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    StringConstraints,
)

from durability.api.schemas import NOT_ALL_ZERO, WHOLE, SpanId, Text, Timestamp, TraceId
from durability.api.schemas import Strict as StrictModel

MAX_EVENTS = 1000
EventId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=255),
    Field(description="The client's id for this event; an id seen before changes nothing."),
]


Count = Annotated[int, Field(ge=0, le=2**53), WHOLE]
Id = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class RunEventIn(StrictModel):
    """Names a run and says how it went; sent again to update it."""

    id: EventId
    type: Literal["run"]
    run_id: Id
    agent: Text | None = None
    workflow: Text | None = None
    workflow_version: Text | None = None
    conversation_id: Text | None = None
    status: Literal["running", "ok", "error"] | None = None
    started: Timestamp | None = None
    ended: Timestamp | None = None
    trace_ids: Annotated[list[TraceId], Field(max_length=100)] = Field(
        default_factory=list,
        description="OpenTelemetry traces of this run: their spans join it.",
    )
    attributes: dict[str, Any] | None = None


class SpanEventIn(StrictModel):
    """One step of a run: a model request, a tool call, an agent step or anything else."""

    id: EventId
    type: Literal["span"]
    run_id: Id | None = Field(
        default=None, description="The run; else the run of the trace, else a run per trace."
    )
    trace_id: TraceId
    span_id: SpanId
    parent_span_id: SpanId | None = None
    kind: Literal["model", "tool", "agent", "other"] = "other"
    name: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    start: Timestamp
    end: Timestamp | None = None
    status: Literal["unset", "ok", "error"] = "unset"
    status_message: Annotated[str, StringConstraints(max_length=4000)] | None = None
    provider: Text | None = None
    request_model: Text | None = None
    response_model: Text | None = None
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    tool_call_id: Text | None = None
    tool_name: Text | None = None
    attributes: dict[str, Any] | None = None
    input: Any = Field(
        default=None, description="Model input messages or tool arguments; stored redacted."
    )
    output: Any = Field(
        default=None,
        description="Model output messages (GenAI `tool_call` parts name the calls asked for) "
        "or the tool result; stored redacted.",
    )


EVENT_SCHEMAS: dict[str, type[RunEventIn | SpanEventIn]] = {
    "run": RunEventIn,
    "span": SpanEventIn,
}


EventIn = Annotated[RunEventIn | SpanEventIn, Field(discriminator="type")]


class EventBatchIn(BaseModel):
    """The envelope only: each event is validated on its own, so one bad event fails alone."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Documented as run and span events, but left as parsed from JSON: ingest validates
    # each one alone (EVENT_SCHEMAS), so that a bad event is rejected in its result.
    events: Annotated[list[SkipValidation[EventIn]], Field(min_length=1, max_length=MAX_EVENTS)] = (
        Field(description="Run and span events; each is accepted or rejected on its own.")
    )


EventStatus = Literal[201, 200, 400]
EventResultName = Literal["stored", "duplicate", "rejected"]


class EventResultOut(BaseModel):
    index: int
    id: str | None = Field(
        description="The event's id as stored: a secret in it replaced by its digest."
    )
    status: EventStatus = Field(
        description="201 stored, 200 an id seen before (nothing changed), 400 rejected."
    )
    result: EventResultName
    error: str | None = None
    fields: dict[str, str] | None = None


class EventBatchOut(BaseModel):
    stored: int
    duplicates: int
    rejected: int
    results: list[EventResultOut]


# -- OTLP/JSON (POST /v1/traces) ---------------------------------------------------------
# The OTLP/HTTP JSON encoding of ExportTraceServiceRequest, for the OpenAPI document;
# trajectories.otlp decodes it. Unknown fields are ignored, as OTLP requires.

OtlpInt = Annotated[
    int | Annotated[str, StringConstraints(pattern=r"^[0-9]+$")],
    Field(description="A 64-bit integer, as a number or a decimal string."),
]


class OtlpArrayValue(BaseModel):
    values: list[OtlpAnyValue] = []


class OtlpKeyValueList(BaseModel):
    values: list[OtlpKeyValue] = []


class OtlpAnyValue(BaseModel):
    """One of its fields is set."""

    stringValue: str | None = None
    boolValue: bool | None = None
    intValue: OtlpInt | None = None
    doubleValue: float | str | None = None
    arrayValue: OtlpArrayValue | None = None
    kvlistValue: OtlpKeyValueList | None = None
    bytesValue: str | None = Field(default=None, description="Base64; stored as sent.")


class OtlpKeyValue(BaseModel):
    key: str
    value: OtlpAnyValue | None = None


class OtlpResource(BaseModel):
    attributes: list[OtlpKeyValue] = []


class OtlpStatus(BaseModel):
    code: int | Literal["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"] = Field(
        default=0, description="0 unset, 1 ok, 2 error."
    )
    message: str = ""


class OtlpSpan(BaseModel):
    """A span; one that breaks these rules is rejected alone, in `partialSuccess`."""

    traceId: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{32}$")] = Field(
        description="32 hex digits, not all zero.", json_schema_extra=NOT_ALL_ZERO
    )
    spanId: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{16}$")] = Field(
        description="16 hex digits, not all zero.", json_schema_extra=NOT_ALL_ZERO
    )
    parentSpanId: Annotated[str, StringConstraints(pattern=r"^([0-9a-fA-F]{16})?$")] = Field(
        default="", description="16 hex digits; empty for a root span."
    )
    name: str = ""
    startTimeUnixNano: OtlpInt = Field(description="Required, after the epoch.")
    endTimeUnixNano: OtlpInt | None = Field(
        default=None, description="Absent while running; not before the start."
    )
    attributes: list[OtlpKeyValue] = Field(
        default=[],
        description="GenAI semantic conventions (and OpenInference, Traceloop aliases) map "
        "onto the span's fields; the other attributes are kept.",
    )
    status: OtlpStatus | None = None


class OtlpScopeSpans(BaseModel):
    spans: list[OtlpSpan] = []


class OtlpResourceSpans(BaseModel):
    resource: OtlpResource | None = None
    scopeSpans: list[OtlpScopeSpans] = []


class OtlpExportIn(BaseModel):
    """An ExportTraceServiceRequest in OTLP/JSON: ids are hex, not base64."""

    resourceSpans: list[OtlpResourceSpans] = []


class OtlpPartialSuccessOut(BaseModel):
    rejectedSpans: str = Field(description="How many spans were rejected (an int64 string).")
    errorMessage: str = Field(description="Why, for the first few reasons.")


class OtlpExportOut(BaseModel):
    """ExportTraceServiceResponse: empty when every span was stored."""

    partialSuccess: OtlpPartialSuccessOut | None = None


class OtlpStatusOut(BaseModel):
    """A google.rpc.Status: the gRPC code (3 invalid argument, 8 resource exhausted,
    14 unavailable) and a message."""

    code: int
    message: str
