"""What the framework integrations share: a model's tool call made an effect, and its spans.

Every integration (these, and the ones beside them) keys, declares and receipts a tool call
through this module, so that the rules hold alike:

- `default_key(tool, run_id, args)`: a call's key unless the tool declares its own, the run,
  the tool's name and a fingerprint of the arguments (`argument_fingerprint`). A model that
  retries the call after a restart gives it a new call id but the same arguments, so the key
  survives; two deliberate identical calls in one run need a key of their own.
- `ToolEffect` checks itself when it is made (`check_effect`: a key, a receipt and an amount
  of the right type, a key template naming only the tool's parameters once `check_effect`
  is given them); a mistake raises TypeError before any effect.
- `receipt_of(result, receipt, system, call_id)`: the receipt of a result, from a field path
  ("id", "refund.id"), a function, or the result itself when it is a Receipt; with none, a
  receipt of system `TOOL_CALL` naming the call, which the desk shows as "no provider id".

The tool's result is stored with the receipt and returned again, without calling the tool,
when the effect is already done. The integrations record the tool call's span and the span
of the model request that asked for it as span events (`POST /api/v1/events`), spooled and
sent in the background like receipts: no OpenTelemetry setup is needed for the links, and
the agent never waits for them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from tallybook import tracing
from tallybook.client import (
    REPLAY_POLICIES,
    Base,
    EffectOptions,
    ReplayPolicy,
    polls,
    still_in_doubt,
)
from tallybook.records import EffectStatus, Receipt
from tallybook.scope import current_run
from tallybook.tools import template_names

if TYPE_CHECKING:
    from typing import TypeAlias


# The system of a receipt that names the model's tool call because the tool declared no
# provider id: the server and the desk read it as "no provider id".
TOOL_CALL = "tool-call"
# The names a key template may use besides the tool's arguments.
CALL_NAMES = ("run_id", "tool_call_id", "tool")
KeyFrom = Union[str, Callable[..., str]]  # noqa: UP007 (runs on 3.10)
ReceiptFrom = Union[str, Callable[[Any], Receipt]]  # noqa: UP007


@dataclass(frozen=True)
class ToolEffect:
    """How one tool's calls become effects; declared once per tool, checked when made.

    `key` is a template of the call's arguments and of `run_id`, `tool_call_id` and `tool`
    ("refund:{order_id}"), or a function of the arguments; by default `default_key`: the
    run, the tool and a fingerprint of the arguments. `receipt` is where the provider's id is
    in the tool's result: a field path ("id", "refund.id") or a function of the result
    returning a Receipt; without it the receipt says the tool declared no provider id. The
    other fields are those of `tb.effect(...)`.
    """

    kind: str = "tool"
    target: str | None = None  # the tool's name unless given
    replay: ReplayPolicy = "never"
    key: KeyFrom | None = None
    receipt: ReceiptFrom | None = None
    timeout_s: int | None = None
    authority: dict[str, Any] | None = None
    amount: Callable[..., Mapping[str, str]] | Mapping[str, str] | None = None
    definitive_on: tuple[type[BaseException], ...] = ()
    fail_open: bool | None = None

    def __post_init__(self) -> None:
        check_effect(self)


def check_effect(
    effect: ToolEffect | Mapping[str, Any], tool: str | None = None, params: Any = None
) -> None:
    """Refuse a declaration that would fail only once its effect happened: TypeError.

    `effect` is a ToolEffect or the options of one (pydantic-ai's dict form). With `params`
    (the tool's parameter names) a key template or function naming another is refused too.
    """
    get = effect.get if isinstance(effect, Mapping) else lambda name: getattr(effect, name, None)
    of = f" of {tool!r}" if tool else ""
    key, receipt, amount = get("key"), get("receipt"), get("amount")
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise TypeError(f"key={key!r}{of} must be a template (str) or a function of the arguments")
    named = template_names(key) if isinstance(key, str) else set()
    if receipt is not None and not (isinstance(receipt, str) or callable(receipt)):
        raise TypeError(
            f"receipt={receipt!r}{of} must be the result's field with the provider's id "
            "(receipt='id') or a function of the result returning a tallybook.Receipt"
        )
    if isinstance(receipt, str) and (not receipt or any(not p for p in receipt.split("."))):
        raise TypeError(f"receipt={receipt!r}{of} must name a field path ('id', 'refund.id')")
    if amount is not None and not (isinstance(amount, Mapping) or callable(amount)):
        raise TypeError(f"amount={amount!r}{of} must be a mapping or a function of the arguments")
    replay = get("replay")
    if replay is not None and replay not in REPLAY_POLICIES:
        raise TypeError(f"replay={replay!r}{of} must be one of {', '.join(REPLAY_POLICIES)}")
    definitive = get("definitive_on") or ()
    if not isinstance(definitive, tuple) or not all(
        isinstance(e, type) and issubclass(e, BaseException) for e in definitive
    ):
        raise TypeError(f"definitive_on={definitive!r}{of} must be a tuple of exception types")
    for name in ("kind", "target"):
        if get(name) is not None and not isinstance(get(name), str):
            raise TypeError(f"{name}={get(name)!r}{of} must be a string")
    if params is not None:
        if callable(key):
            named = _accepted(key)
        names_known(f"the key{of}", named, params, CALL_NAMES, "the tool")
        if callable(amount):
            names_known(f"the amount{of}", _accepted(amount), params, CALL_NAMES, "the tool")


def check_declarations(declarations: Mapping[str, Any] | None, params: Mapping[str, Any]) -> None:
    """Check each declaration against its tool's parameters (`params`: tool name to parameter
    names, None when they cannot be known): a policy, a ToolEffect, or None."""
    for tool, declaration in (declarations or {}).items():
        if declaration is None:
            continue
        if isinstance(declaration, str):
            if declaration not in REPLAY_POLICIES:
                raise TypeError(
                    f"the declaration of {tool!r}, {declaration!r}, must be a ToolEffect, None "
                    f"or a replay policy ({', '.join(REPLAY_POLICIES)})"
                )
            continue
        if not isinstance(declaration, (ToolEffect, Mapping)):
            raise TypeError(
                f"the declaration of {tool!r} must be a ToolEffect, a replay policy or None, "
                f"not {type(declaration).__name__}"
            )
        check_effect(declaration, tool, params.get(tool))


def names_known(
    what: str, names: set[str], params: Any, extra: tuple[str, ...], taker: str = "it"
) -> None:
    """Refuse a key or amount (`what`) that names what its tool or activity does not take:
    TypeError."""
    if unknown := names - {*params, *extra}:
        raise TypeError(
            f"{what} names {', '.join(sorted(unknown))}, which {taker} does not take "
            f"(its parameters: {', '.join(params) or 'none'}; also {', '.join(extra) or 'none'})"
        )


def _accepted(fn: Callable[..., Any]) -> set[str]:
    """The keyword names a function takes; none to check when it takes **kwargs."""
    try:
        accepts = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in accepts):
        return set()
    return {p.name for p in accepts}


def canonical_json(value: Any) -> str:
    """The value's canonical JSON: sorted keys, no spaces, UTF-8 unescaped, anything JSON
    cannot hold as its text."""
    return json.dumps(
        jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )


def argument_fingerprint(args: Any) -> str:
    """SHA-256 (hex) of the arguments' canonical JSON: the server's own request fingerprint,
    so a call's key and its intent's fingerprint agree. Keys use its first 32 hex digits."""
    return hashlib.sha256(canonical_json(args).encode()).hexdigest()


def default_key(tool: str, run_id: str | None, args: Any, call_id: str | None = None) -> str:
    """A call's key when its tool declares none: the run, the tool and its arguments'
    fingerprint, the same when the model retries the call with a new id. Without a run
    there is nothing to resume, and the call id keeps calls apart."""
    if run_id is None:
        return f"{tool}:{call_id or argument_fingerprint(args)[:32]}"
    return f"{tool}:{run_id}:{argument_fingerprint(args)[:32]}"


def key_of(
    key: KeyFrom | None, tool: str, run_id: str | None, call_id: str, args: Mapping[str, Any]
) -> str:
    """The key of one call: the declared template or function, else `default_key`."""
    if key is None:
        return default_key(tool, run_id, args, call_id)
    if callable(key):
        return key(**args)
    return key.format(**{**args, "run_id": run_id, "tool_call_id": call_id, "tool": tool})


def receipt_of(result: Any, receipt: ReceiptFrom | None, system: str, call_id: str) -> Receipt:
    """The receipt of a tool's result: from a field path, a function, the result itself when
    it is a Receipt, else one naming the tool call (system `TOOL_CALL`: no provider id)."""
    if receipt is None:
        if isinstance(result, Receipt):
            return result
        return Receipt(system=TOOL_CALL, external_id=call_id)
    if isinstance(receipt, str):
        return Receipt(system=system, external_id=str(field_at(result, receipt)))
    made = receipt(result)
    if not isinstance(made, Receipt):
        raise TypeError(f"receipt= must return a tallybook.Receipt, not {type(made).__name__}")
    return made


def field_at(result: Any, path: str) -> Any:
    """The value at a dotted path of keys or attributes; a JSON object's text is read as
    the object (a framework may hand the tool's result on as text)."""
    value = result
    for part in path.split("."):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
    if value is None or value == "":
        raise TypeError(f"the tool's result has no {path!r} to take the provider's id from")
    return value


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
    if isinstance(declaration, Mapping):
        return ToolEffect(**declaration)
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
    workflow: str  # the run's name when the call opens it: the agent's

    @property
    def key(self) -> str:
        return key_of(self.effect.key, self.tool, self.run_id, self.call_id, self.args)

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
        made = receipt_of(
            result, self.effect.receipt, self.effect.target or self.tool, self.call_id
        )
        stored: dict[str, Any] = {"result": jsonable(result)}
        if made.data is not None:
            stored["data"] = made.data
        return {
            "system": made.system,
            "external_id": made.external_id,
            "observed_at": made.observed_at,
            "data": stored,
        }

    @contextmanager
    def in_run(self, tb: Base) -> Iterator[None]:
        """Inside the call's run: the framework's when no `tb.run(...)` is open."""
        if self.run_id is None or current_run() == self.run_id:
            with nullcontext():
                yield
        else:
            with tb.run(self.workflow, run_id=self.run_id):
                yield


def stored_result(receipt: Receipt | None) -> Any:
    """The tool's result stored with the receipt of an effect done before."""
    data = receipt.data if receipt is not None else None
    return data.get("result") if isinstance(data, dict) else None


def jsonable(value: Any) -> Any:
    """The value as JSON can hold it: itself, a mapping's values each made so, else its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        if isinstance(value, Mapping):
            return {str(k): jsonable(v) for k, v in value.items()}
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


def run_event(
    tb: Base,
    run_id: str,
    *,
    status: str = "running",
    workflow: str | None = None,
    agent: str | None = None,
    trace_ids: list[str] | None = None,
    error: BaseException | None = None,
) -> None:
    """Say how a run goes: `status` "running", with its start, or its end ("ok", "error":
    with when it ended, and the error), named for its `workflow` (else its `agent`); the
    traces it joins. Spooled and sent in the background like a receipt, so that a run does
    not read `running` for ever. The one way the integrations describe a run."""
    at = now().isoformat()
    event: dict[str, Any] = {
        "type": "run",
        "id": f"run:{run_id}:{status}:{secrets.token_hex(8)}",
        "run_id": run_id,
        "agent": agent,
        "workflow": workflow or agent,
        "status": status,
        "trace_ids": trace_ids,
        "attributes": {"error": str(error)[:4000]} if error is not None else None,
        "started" if status == "running" else "ended": at,
    }
    tb._record("events", {"events": [{k: v for k, v in event.items() if v is not None}]})


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

    def run(
        self,
        run_id: str | None,
        *,
        agent: str | None = None,
        workflow: str | None = None,
        status: str = "running",
        error: BaseException | None = None,
    ) -> None:
        """The run's event (`run_event`): named for the agent while it runs, and its end
        (`ok`, `error`).

        The current OpenTelemetry trace (another instrumentation's, e.g. OpenInference's)
        joins the run, so one conversation is one run. Sent even with `spans=False`.
        """
        if run_id is None:
            return
        trace_id, _ = tracing.current_ids()
        run_event(
            self.tb or default_client(),
            run_id,
            status=status,
            agent=agent,
            workflow=workflow,
            trace_ids=[trace_id] if trace_id else None,
            error=error,
        )

    def send(self, span: dict[str, Any]) -> None:
        if not self.enabled:
            return
        span["end"] = now()
        event = {k: v for k, v in span.items() if v is not None}
        event["start"], event["end"] = event["start"].isoformat(), event["end"].isoformat()
        event.update(type="span", id=f"span:{event['trace_id']}:{event['span_id']}")
        self.deliver(event)

    def deliver(self, event: dict[str, Any]) -> None:
        # Telemetry never blocks the agent: to the spool, and the delivery thread sends it.
        tb = self.tb or default_client()
        tb.spool.release(tb.spool.put("events", {"events": [event]}))
        tb._sender_start()
