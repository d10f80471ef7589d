"""What the framework integrations share: a model's tool call made an effect, and its spans.

A call's key is derived from the run and the tool call id unless the tool declares its own;
the tool's result is stored with the receipt and returned again, without calling the tool,
when the effect is already done. The integrations record the tool call's span and the span
of the model request that asked for it as span events (`POST /api/v1/events`), spooled and
sent in the background like receipts: no OpenTelemetry setup is needed for the links, and
the agent never waits for them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from tallybook import tracing
from tallybook.client import Base, EffectOptions, ReplayPolicy, polls, still_in_doubt
from tallybook.records import EffectStatus, Receipt
from tallybook.scope import current_run

if TYPE_CHECKING:
    from typing import TypeAlias


@dataclass(frozen=True)
class ToolEffect:
    """How one tool's calls become effects; declared once per tool.

    `key` is a template of the call's arguments and of `run_id`, `tool_call_id` and `tool`
    ("refund:{order_id}"), or a function of the arguments; by default "{run_id}:{tool_call_id}".
    `receipt` makes the receipt from the tool's result (the provider's id); by default the
    receipt names the tool call. The other fields are those of `tb.effect(...)`.
    """

    kind: str = "tool"
    target: str | None = None  # the tool's name unless given
    replay: ReplayPolicy = "never"
    key: str | Callable[..., str] | None = None
    receipt: Callable[[Any], Receipt] | None = None
    timeout_s: int | None = None
    authority: dict[str, Any] | None = None
    amount: Callable[..., Mapping[str, str]] | Mapping[str, str] | None = None
    definitive_on: tuple[type[BaseException], ...] = ()
    fail_open: bool | None = None


# A tool's declaration: a ToolEffect, a replay policy alone, or None for "not an effect".
Declaration: TypeAlias = Union[ToolEffect, ReplayPolicy, None]  # noqa: UP007 (runs on 3.10)
Declarations: TypeAlias = Mapping[str, Declaration]
DEFAULT = ToolEffect()


def declared(tools: Declarations | None, name: str, default: ToolEffect) -> ToolEffect | None:
    """The declaration of tool `name`: its own, else the default; None when it is no effect."""
    if tools is None or name not in tools:
        return default
    declaration = tools[name]
    if isinstance(declaration, str):
        return dataclasses.replace(default, replay=declaration, key=None, receipt=None)
    return declaration


@functools.cache
def default_client() -> Base:
    """The client of integrations given none: `Tallybook()` from the environment, made at
    the first tool call (never at import), one per process."""
    from tallybook.client import Tallybook

    return Tallybook()


def wait_for(tb: Base, key: str, timeout: float) -> EffectStatus:
    """`Tallybook.wait_for` for either client: blocks (the async one runs it in a thread)."""
    pauses = polls(timeout, 1.0)
    while (status := tb._status(key)).decision == "wait":
        pause = next(pauses, None)
        if pause is None:
            raise still_in_doubt(key, status, timeout)
        time.sleep(pause)
    return status


@dataclass(frozen=True)
class Call:
    """One tool call a model asked for."""

    tool: str
    call_id: str
    args: dict[str, Any]
    run_id: str | None
    effect: ToolEffect

    @property
    def key(self) -> str:
        key = self.effect.key
        if key is None:
            return f"{self.run_id}:{self.call_id}" if self.run_id else f"{self.tool}:{self.call_id}"
        if callable(key):
            return key(**self.args)
        names = {"run_id": self.run_id, "tool_call_id": self.call_id, "tool": self.tool}
        return key.format(**self.args, **names)

    def options(self) -> EffectOptions:
        effect = self.effect
        options: EffectOptions = {
            "kind": effect.kind,
            "target": effect.target or self.tool,
            "replay": effect.replay,
            "request": self.args,
            "tool_call_id": self.call_id,
        }
        if effect.timeout_s is not None:
            options["timeout_s"] = effect.timeout_s
        if effect.authority is not None:
            options["authority"] = effect.authority
        if effect.amount is not None:
            amount = effect.amount(**self.args) if callable(effect.amount) else effect.amount
            options["amount"] = {"value": amount["value"], "currency": amount["currency"]}
        if effect.definitive_on:
            options["definitive_on"] = effect.definitive_on
        if effect.fail_open is not None:
            options["fail_open"] = effect.fail_open
        return options

    def receipt(self, result: Any) -> dict[str, Any]:
        """The arguments of `fx.receipt(...)` for the tool's result, which the receipt stores."""
        made = self.effect.receipt(result) if self.effect.receipt else None
        if made is not None and not isinstance(made, Receipt):
            raise TypeError(f"the receipt of {self.tool!r} must be a tallybook.Receipt")
        stored: dict[str, Any] = {"result": jsonable(result)}
        if made is not None and made.data is not None:
            stored["data"] = made.data
        return {
            "system": made.system if made else self.effect.target or self.tool,
            "external_id": made.external_id if made else self.call_id,
            "observed_at": made.observed_at if made else None,
            "data": stored,
        }

    @contextmanager
    def in_run(self, tb: Base, workflow: str) -> Iterator[None]:
        """Inside the call's run: the framework's when no `tb.run(...)` is open."""
        if self.run_id is None or current_run() == self.run_id:
            with nullcontext():
                yield
        else:
            with tb.run(workflow, run_id=self.run_id):
                yield


def stored_result(receipt: Receipt | None) -> Any:
    """The tool's result stored with the receipt of an effect done before."""
    data = receipt.data if receipt is not None else None
    return data.get("result") if isinstance(data, dict) else None


def jsonable(value: Any) -> Any:
    """The value as JSON can hold it: itself, else its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def arguments(raw: str | None) -> dict[str, Any]:
    """A tool call's arguments sent as JSON text; anything but an object is kept whole."""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {"arguments": raw}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Spans:
    """Records tool and model spans as span events, sent in the background through the spool."""

    tb: Base | None  # default_client() unless given
    enabled: bool = True

    def ids(self, run_id: str | None) -> tuple[str, str | None]:
        """The trace for a new span and its parent: the current OpenTelemetry span's, else
        one trace per run (the same in every process), else a new one."""
        trace_id, parent = tracing.current_ids()
        if trace_id:
            return trace_id, parent
        if run_id:
            return hashlib.sha256(f"tallybook-run:{run_id}".encode()).hexdigest()[:32], None
        return secrets.token_hex(16), None

    def tool(
        self,
        call: Call,
        start: datetime,
        *,
        output: Any = None,
        error: BaseException | str | None = None,
        parent: tuple[str, str | None] | None = None,
    ) -> None:
        trace_id, parent_id = parent or self.ids(call.run_id)
        self.send(
            {
                "kind": "tool",
                "name": f"execute_tool {call.tool}",
                "run_id": call.run_id,
                "trace_id": trace_id,
                "span_id": secrets.token_hex(8),
                "parent_span_id": parent_id,
                "start": start,
                "status": "error" if error is not None else "ok",
                "status_message": str(error)[:4000] if error is not None else None,
                "tool_call_id": call.call_id,
                "tool_name": call.tool,
                "attributes": {"gen_ai.operation.name": "execute_tool", "tallybook.key": call.key},
                "input": call.args,
                "output": jsonable(output),
            }
        )

    def model(
        self,
        *,
        run_id: str | None,
        start: datetime,
        calls: list[dict[str, Any]],
        model: str | None = None,
        provider: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        text: str | None = None,
        span_id: str | None = None,
    ) -> None:
        """A model request whose response asked for `calls` ({"id", "name", "arguments"})."""
        trace_id, parent_id = self.ids(run_id)
        parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
        parts += [{"type": "tool_call", **call} for call in calls]
        self.send(
            {
                "kind": "model",
                "name": f"chat {model}" if model else "chat",
                "run_id": run_id,
                "trace_id": trace_id,
                "span_id": span_id or secrets.token_hex(8),
                "parent_span_id": parent_id,
                "start": start,
                "status": "ok",
                "provider": provider,
                "request_model": model,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "attributes": {"gen_ai.operation.name": "chat"},
                "output": [{"role": "assistant", "parts": parts}],
            }
        )

    def send(self, span: dict[str, Any]) -> None:
        if not self.enabled:
            return
        span["end"] = now()
        event = {k: v for k, v in span.items() if v is not None}
        event["start"], event["end"] = event["start"].isoformat(), event["end"].isoformat()
        event.update(type="span", id=f"span:{event['trace_id']}:{event['span_id']}")
        # Telemetry never blocks the agent: to the spool, and the delivery thread sends it.
        tb = self.tb or default_client()
        tb.spool.release(tb.spool.put("events", {"events": [event]}))
        tb._sender_start()
