"""Validation schemas of POST /api/v1/events: run and span events, each with its own id."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

from durability.schemas import SpanId, Text, TraceId
from durability.schemas import Strict as StrictModel

MAX_EVENTS = 1000
EventId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=255),
    Field(description="The client's id for this event; an id seen before changes nothing."),
]
# JSON has no datetime type: timestamps arrive as ISO 8601 strings.
Timestamp = Annotated[datetime, Strict(False)]
Count = Annotated[int, Field(ge=0, le=2**53)]
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


class EventBatchIn(BaseModel):
    """The envelope only: each event is validated on its own, so one bad event fails alone."""

    model_config = ConfigDict(extra="forbid", strict=True)

    events: Annotated[list[Any], Field(min_length=1, max_length=MAX_EVENTS)] = Field(
        description="Run and span events; each is accepted or rejected on its own."
    )


class EventResultOut(BaseModel):
    index: int
    id: str | None
    status: Literal[201, 200, 400] = Field(
        description="201 stored, 200 an id seen before (nothing changed), 400 rejected."
    )
    result: Literal["stored", "duplicate", "rejected"]
    error: str | None = None
    fields: dict[str, str] | None = None


class EventBatchOut(BaseModel):
    stored: int
    duplicates: int
    rejected: int
    results: list[EventResultOut]
