"""A model span's messages and a tool span's call, for people to read.

Read from what ingest kept (`semconv.span_from_otel`): the GenAI conventions' message
lists (`gen_ai.input.messages` / `gen_ai.output.messages`, parts of type `text`,
`tool_call`, `tool_call_response`), in the span's input and output; OpenAI-style messages
(`content`, `tool_calls`) the same way; and the flattened attributes of OpenInference
(`llm.input_messages.0.message.role`, …) and Traceloop (`gen_ai.prompt.0.role`, …). Whatever
an agent sent, malformed included, reads as some message or none: never an exception.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from trajectories.models import Span, SpanKind

# A part longer than this many lines or characters shows its start, and the rest on "more".
PREVIEW_LINES = 4
PREVIEW_CHARS = 320
# A conversation shows its last messages; the earlier ones open on "earlier messages".
RECENT_MESSAGES = 3
# Text kept of one part: a page is for reading, the span's JSON keeps everything.
MAX_TEXT = 20_000
# Flattened messages read at most this many items of each list, this many names deep.
MAX_ITEMS = 200
MAX_DEPTH = 8

_INPUT_FLAT = ("llm.input_messages.", "gen_ai.prompt.")
_OUTPUT_FLAT = ("llm.output_messages.", "gen_ai.completion.")


@dataclass
class Part:
    """One piece of a message: text, a tool call (name, arguments) or a tool's result."""

    kind: str  # "text", "tool_call", "tool_result" or the part's own type
    text: str = ""
    name: str = ""
    call_id: str = ""

    @property
    def preview(self) -> str:
        lines = self.text.splitlines()[:PREVIEW_LINES]
        return "\n".join(lines)[:PREVIEW_CHARS]

    @property
    def clipped(self) -> bool:
        return self.preview != self.text


@dataclass
class Message:
    role: str
    parts: list[Part] = field(default_factory=list)
    finish_reason: str = ""


@dataclass
class Conversation:
    """A model span's messages, asked and answered."""

    asked: list[Message]
    answered: list[Message]

    @property
    def earlier(self) -> list[Message]:
        return self.asked[:-RECENT_MESSAGES]

    @property
    def recent(self) -> list[Message]:
        return self.asked[-RECENT_MESSAGES:]

    def __bool__(self) -> bool:
        return bool(self.asked or self.answered)


@dataclass
class ToolCall:
    """A tool span's call: the tool, its arguments and its result."""

    name: str
    call_id: str
    arguments: Part | None
    result: Part | None


def conversation_of(span: Span | None) -> Conversation:
    """The messages of a model span (none for another span, or none sent)."""
    if span is None or span.kind != SpanKind.MODEL:
        return Conversation([], [])
    attributes = span.attributes if isinstance(span.attributes, dict) else {}
    return Conversation(
        _messages(span.input) or _flat_messages(attributes, _INPUT_FLAT),
        _messages(span.output) or _flat_messages(attributes, _OUTPUT_FLAT),
    )


def tool_call_of(span: Span | None) -> ToolCall | None:
    """The call a tool span made, with its arguments and result as sent."""
    if span is None or span.kind != SpanKind.TOOL:
        return None
    arguments = _part("arguments", span.input) if span.input not in (None, "") else None
    result = _part("result", span.output) if span.output not in (None, "") else None
    return ToolCall(span.tool_name, span.tool_call_id, arguments, result)


def _part(kind: str, value: Any, **names: str) -> Part:
    return Part(kind, _shown(value), **names)


def _shown(value: Any) -> str:
    """A value as text: a string as it is (JSON text indented), anything else as JSON."""
    if isinstance(value, str):
        text = value[:MAX_TEXT]
        if value[:1] not in ("{", "["):
            return text
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return text
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (ValueError, RecursionError):  # a circular or otherwise unprintable value
        text = repr(value)
    return text[:MAX_TEXT]


def _messages(value: Any) -> list[Message]:
    """Messages from a list of them, one of them, `{"messages": [...]}` or plain text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        with contextlib.suppress(ValueError, RecursionError):
            value = json.loads(value)
    if isinstance(value, dict):
        inner = value.get("messages")
        value = inner if isinstance(inner, list) else [value]
    if isinstance(value, str):
        return [Message("", [Part("text", value[:MAX_TEXT])])] if value else []
    if not isinstance(value, list):
        return []
    found = [m for item in value[:MAX_ITEMS] if (m := _message(item)) is not None]
    return found


def _message(item: Any) -> Message | None:
    if isinstance(item, str):
        return Message("", [Part("text", item[:MAX_TEXT])])
    if not isinstance(item, dict):
        return None
    inner = item.get("message")  # OpenInference wraps each message
    if isinstance(inner, dict):
        item = inner
    role = _text(item.get("role"))
    parts: list[Part] = []
    for part in _items(item.get("parts")):
        parts.extend(_genai_part(part))
    content = item.get("content")
    if isinstance(content, str):
        if content:
            parts.append(Part("text", content[:MAX_TEXT]))
    elif isinstance(content, list):
        for part in content[:MAX_ITEMS]:
            parts.extend(_genai_part(part))
    elif content is not None:
        parts.append(_part("text", content))
    for part in _items(item.get("contents")):  # OpenInference's list of contents
        inner = part.get("message_content", part)
        if isinstance(inner, dict) and inner.get("text"):
            parts.append(Part("text", _text(inner.get("text"), MAX_TEXT)))
    for call in _items(item.get("tool_calls")):
        wrapped = call.get("tool_call")  # OpenInference wraps each call too
        call = wrapped if isinstance(wrapped, dict) else call
        named = call.get("function")
        function: dict[str, Any] = named if isinstance(named, dict) else call
        parts.append(
            _part(
                "tool_call",
                function.get("arguments", ""),
                name=_text(function.get("name")),
                call_id=_text(call.get("id")),
            )
        )
    if role == "tool" and parts and (answered := _text(item.get("tool_call_id"))):
        parts = [Part("tool_result", p.text, call_id=answered) for p in parts]
    if not role and not parts:
        return None
    return Message(role, parts, _text(item.get("finish_reason")))


def _genai_part(part: Any) -> list[Part]:
    """A part of the GenAI conventions' message (or an OpenAI content part)."""
    if isinstance(part, str):
        return [Part("text", part[:MAX_TEXT])]
    if not isinstance(part, dict):
        return []
    kind = _text(part.get("type")) or "text"
    if kind == "tool_call":
        return [
            _part(
                "tool_call",
                part.get("arguments", ""),
                name=_text(part.get("name")),
                call_id=_text(part.get("id")),
            )
        ]
    if kind == "tool_call_response":
        return [
            _part(
                "tool_result",
                part.get("response", part.get("result", "")),
                call_id=_text(part.get("id")),
            )
        ]
    for name in ("content", "text"):
        if name in part:
            return [
                _part("text" if kind in ("text", "input_text", "output_text") else kind, part[name])
            ]
    rest = {k: v for k, v in part.items() if k != "type"}
    return [_part(kind, rest)] if rest else []


def _flat_messages(attributes: dict[str, Any], prefixes: tuple[str, ...]) -> list[Message]:
    """Messages flattened into attributes (`llm.input_messages.0.message.role`), nested again."""
    for prefix in prefixes:
        tree: dict[str, Any] = {}
        for key, value in attributes.items():
            if not key.startswith(prefix):
                continue
            path = key[len(prefix) :].split(".")
            if len(path) <= MAX_DEPTH:
                _put(tree, path, value)
        if tree:
            return _messages(_listed(tree))
    return []


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for name in path[:-1]:
        child = node.get(name)
        if not isinstance(child, dict):
            child = node[name] = {}
        node = child
    node[path[-1]] = value


def _listed(node: Any) -> Any:
    """Dicts whose keys are all indexes as lists, in index order (at most MAX_ITEMS)."""
    if not isinstance(node, dict):
        return node
    if node and all(k.isascii() and k.isdigit() for k in node):
        return [_listed(node[k]) for k in sorted(node, key=int)[:MAX_ITEMS]]
    return {k: _listed(v) for k, v in node.items()}


def _items(value: Any) -> list[dict[str, Any]]:
    return [v for v in value[:MAX_ITEMS] if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any, limit: int = 255) -> str:
    if value is None:
        return ""
    return (value if isinstance(value, str) else str(value))[:limit]
