"""Span attributes to span fields: the OpenTelemetry GenAI semantic conventions, with the
aliases of OpenInference and Traceloop (OpenLLMetry). Attributes not mapped are kept."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durability.inbound import decimal_digits, json_loads, unstorable_at
from trajectories.models import SpanKind

MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "embeddings"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})
OPENINFERENCE_KINDS = {
    "LLM": SpanKind.MODEL,
    "EMBEDDING": SpanKind.MODEL,
    "RERANKER": SpanKind.MODEL,
    "TOOL": SpanKind.TOOL,
    "AGENT": SpanKind.AGENT,
}
TRACELOOP_KINDS = {"tool": SpanKind.TOOL, "agent": SpanKind.AGENT, "workflow": SpanKind.AGENT}
# The MCP conventions: a client's or server's span of a `tools/call` request is a tool call,
# named "{mcp.method.name} {gen_ai.tool.name}" (the mcp package's client: "MCP send tools/call
# refund"); the session and the JSON-RPC request id name the call when no tool call id does.
MCP_METHOD = "mcp.method.name"
MCP_TOOL_CALL = "tools/call"
MCP_SESSION = "mcp.session.id"
MCP_REQUEST = "jsonrpc.request.id"
# Our own attributes, on the span or its resource: put a span into a named run.
RUN_ID = "tallybook.run.id"
WORKFLOW = "tallybook.workflow"
WORKFLOW_VERSION = "tallybook.workflow.version"
# Flattened tool calls asked for by a model: OpenInference, then Traceloop.
_FLAT_TOOL_CALL_ID = re.compile(
    r"^(?:llm\.output_messages\.\d+\.message\.tool_calls\.\d+\.tool_call\.id"
    r"|gen_ai\.completion\.\d+\.tool_calls\.\d+\.id)$"
)


@dataclass(slots=True)
class SpanData:
    """A span as received, before redaction and caps."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start: datetime
    end: datetime | None
    kind: str = SpanKind.OTHER
    status: str = "unset"
    status_message: str = ""
    operation: str = ""
    provider: str = ""
    request_model: str = ""
    response_model: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_call_id: str = ""
    tool_name: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    input: Any = None
    output: Any = None
    # The JSON text input and output arrived as, when they arrived as JSON text.
    input_text: str | None = None
    output_text: str | None = None
    requested_calls: list[str] = field(default_factory=list)
    # The run: an explicit id, else the run of the trace, else one named after the trace.
    run_key: str = ""
    # What the span tells about its run, to fill fields no run event has set.
    agent: str = ""
    workflow: str = ""
    workflow_version: str = ""
    conversation_id: str = ""


IO_FIELDS = frozenset(
    f"{who}_{side}" for who in ("model", "tool", "any") for side in ("input", "output")
)
# Attribute -> (field, rank): when aliases of one field are all present, the lowest rank
# wins and the others stay among the kept attributes.
ALIASES: dict[str, tuple[str, int]] = {
    "gen_ai.operation.name": ("operation", 0),
    "openinference.span.kind": ("openinference_kind", 0),
    "traceloop.span.kind": ("traceloop_kind", 0),
    "gen_ai.provider.name": ("provider", 0),
    "gen_ai.system": ("provider", 1),
    "llm.provider": ("provider", 2),
    "llm.system": ("provider", 3),
    "gen_ai.request.model": ("request_model", 0),
    "llm.model_name": ("request_model", 1),
    "gen_ai.response.model": ("response_model", 0),
    "gen_ai.usage.input_tokens": ("input_tokens", 0),
    "gen_ai.usage.prompt_tokens": ("input_tokens", 1),
    "llm.token_count.prompt": ("input_tokens", 2),
    "gen_ai.usage.output_tokens": ("output_tokens", 0),
    "gen_ai.usage.completion_tokens": ("output_tokens", 1),
    "llm.token_count.completion": ("output_tokens", 2),
    "gen_ai.tool.call.id": ("tool_call_id", 0),
    "tool_call.id": ("tool_call_id", 1),
    "gen_ai.tool.name": ("tool_name", 0),
    "tool.name": ("tool_name", 1),
    "gen_ai.input.messages": ("model_input", 0),
    "gen_ai.output.messages": ("model_output", 0),
    "gen_ai.tool.call.arguments": ("tool_input", 0),
    "gen_ai.tool.call.result": ("tool_output", 0),
    "input.value": ("any_input", 0),
    "traceloop.entity.input": ("any_input", 1),
    "output.value": ("any_output", 0),
    "traceloop.entity.output": ("any_output", 1),
    RUN_ID: ("run_key", 0),
}


def _mapped(attributes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The mapped fields {name: value}, the attribute each came from, and the attributes left.

    The attributes are copied only when some are mapped.
    """
    chosen: dict[str, tuple[int, str]] = {}
    for key in attributes:
        alias = ALIASES.get(key)
        if alias is not None and (alias[0] not in chosen or alias[1] < chosen[alias[0]][0]):
            chosen[alias[0]] = (alias[1], key)
    if not chosen:
        return {}, {}, attributes
    rest = dict(attributes)
    keys = {name: key for name, (_, key) in chosen.items()}
    return {name: rest.pop(key) for name, key in keys.items()}, keys, rest


def _first(attributes: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value not in (None, ""):
            return value
    return None


def _text(value: Any, limit: int = 255) -> str:
    return "" if value is None else str(value)[:limit]


# The most tokens one span may count: beyond any real request, and exact in a double.
MAX_TOKENS = 2**53


def _count(value: Any, key: str | None) -> int | None:
    """A token count: an integer (a whole float or a decimal string too), or ValueError
    naming the attribute; None when the span gives none."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, str):
        try:
            number = decimal_digits(value)
        except ValueError:
            number = None
    elif isinstance(value, float):
        number = int(value) if value.is_integer() else None
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    if number is None or not 0 <= number <= MAX_TOKENS:
        raise ValueError(f"{key} must be a whole number of tokens from 0 to {MAX_TOKENS}")
    return number


def _json(value: Any) -> tuple[Any, str | None]:
    """Messages and arguments are often JSON in a string attribute: store them as JSON.

    Returns the value and, when it was JSON text, that text.
    """
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            parsed = json_loads(value)
        except ValueError:  # not JSON, or JSON we refuse (too deep, duplicate keys): text
            return value, None
        # An escaped lone surrogate ("\ud800") is JSON, but not JSON PostgreSQL stores.
        if ("\\ud" in value or "\\uD" in value) and unstorable_at(parsed) is not None:
            return value, None
        return parsed, value
    return value, None


def requested_tool_calls(messages: Any) -> list[str]:
    """Ids of the tool calls in model output messages.

    GenAI conventions: `{"parts": [{"type": "tool_call", "id": …}]}`; OpenAI style:
    `{"tool_calls": [{"id": …}]}`.
    """
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        return []
    ids: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        message = message.get("message", message)
        for part in message.get("parts") or []:
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("id"):
                ids.append(str(part["id"])[:255])
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                ids.append(str(call["id"])[:255])
    return ids


def _kind(fields: dict[str, Any], rest: dict[str, Any]) -> SpanKind:
    # Any attribute value may be a list or a map, which no set of names holds.
    operation = _text(fields.get("operation"))
    if operation in MODEL_OPERATIONS:
        return SpanKind.MODEL
    if operation == "execute_tool":
        return SpanKind.TOOL
    if operation in AGENT_OPERATIONS:
        return SpanKind.AGENT
    openinference = _text(fields.get("openinference_kind")).upper()
    if openinference in OPENINFERENCE_KINDS:
        return OPENINFERENCE_KINDS[openinference]
    traceloop = _text(fields.get("traceloop_kind")).lower()
    if traceloop in TRACELOOP_KINDS:
        return TRACELOOP_KINDS[traceloop]
    if _text(rest.get(MCP_METHOD)) == MCP_TOOL_CALL:
        return SpanKind.TOOL
    if "request_model" in fields or "llm.request.type" in rest:
        return SpanKind.MODEL
    if "tool_call_id" in fields:
        return SpanKind.TOOL
    return SpanKind.OTHER


# The input and output fields of a model span (True) and of any other (False): its own,
# else the generic one.
IO_CHOICES = {
    True: (("model_input", "any_input"), ("model_output", "any_output")),
    False: (("tool_input", "any_input"), ("tool_output", "any_output")),
}
_FLAT_PREFIXES = ("llm.output_messages.", "gen_ai.completion.")


def _call_id_in(output: Any, kind: SpanKind) -> str | None:
    """The tool call id a tool span names only in its output: OpenInference's LangChain
    instrumentation (0.1.80) puts it in the ToolMessage it records as `output.value`
    (`{"type": "tool", "data": {..., "tool_call_id": ...}}`), never in an attribute."""
    if kind != SpanKind.TOOL or not isinstance(output, dict):
        return None
    data = output.get("data")
    found = output.get("tool_call_id") or (
        data.get("tool_call_id") if isinstance(data, dict) else None
    )
    return found if isinstance(found, str) else None


def span_from_otel(
    *,
    trace_id: str,
    span_id: str,
    parent_span_id: str,
    name: str,
    start: datetime,
    end: datetime | None,
    status: str,
    status_message: str,
    attributes: dict[str, Any],
    resource: dict[str, Any],
) -> SpanData:
    """Map an OpenTelemetry span's attributes onto span fields; what is not mapped stays.

    Runs for every span ingested: written for few function calls per span.
    """
    fields, keys, rest = _mapped(attributes)
    kind = _kind(fields, rest)
    tool_name = fields.get("tool_name")
    if tool_name is None and kind == SpanKind.TOOL:
        tool_name = rest.pop("traceloop.entity.name", None)
    tool_call_id = fields.get("tool_call_id")
    if _text(rest.get(MCP_METHOD)) == MCP_TOOL_CALL:
        tool_name = tool_name or name.partition(f"{MCP_TOOL_CALL} ")[2] or None
        session, request_id = rest.get(MCP_SESSION), rest.get(MCP_REQUEST)
        if tool_call_id is None and session and request_id is not None:
            # What tallybook-mcp gives the effects it records in that session.
            tool_call_id = f"mcp:{session}:{request_id}"
    agent = rest.get("gen_ai.agent.name")
    if agent is None and kind == SpanKind.AGENT:
        agent = _first(rest, "agent.name", "traceloop.entity.name")
    model = kind == SpanKind.MODEL
    used = [
        own if own in fields else other if other in fields else ""
        for own, other in IO_CHOICES[model]
    ]
    for unused in IO_FIELDS.intersection(fields):
        if unused not in used:
            # Not this kind of span's input or output: kept as an attribute.
            rest[keys[unused]] = fields[unused]
    input_value, input_text = _json(fields.get(used[0]))
    output, output_text = _json(fields.get(used[1]))
    requested = []
    if model:
        requested = requested_tool_calls(output)
        requested += [
            str(v)[:255]
            for k, v in rest.items()
            if k.startswith(_FLAT_PREFIXES) and _FLAT_TOOL_CALL_ID.match(k)
        ]
    workflow = _first(rest, WORKFLOW, "traceloop.workflow.name") or resource.get(WORKFLOW)
    return SpanData(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        name=name[:255] or "(unnamed)",
        start=start,
        end=end,
        kind=kind,
        status=status,
        status_message=status_message,
        operation=_text(fields.get("operation"), 64),
        provider=_text(fields.get("provider"), 100),
        request_model=_text(fields.get("request_model")),
        response_model=_text(fields.get("response_model")),
        input_tokens=_count(fields.get("input_tokens"), keys.get("input_tokens")),
        output_tokens=_count(fields.get("output_tokens"), keys.get("output_tokens")),
        tool_call_id=_text(tool_call_id or _call_id_in(output, kind)),
        tool_name=_text(tool_name),
        attributes=rest,
        resource=resource,
        input=input_value,
        output=output,
        input_text=input_text,
        output_text=output_text,
        requested_calls=requested,
        run_key=_text(fields.get("run_key") or resource.get(RUN_ID)),
        agent=_text(agent),
        workflow=_text(workflow),
        workflow_version=_text(_first(rest, WORKFLOW_VERSION) or resource.get(WORKFLOW_VERSION)),
        conversation_id=_text(_first(rest, "gen_ai.conversation.id", "session.id")),
    )
