"""Temporal: an activity declared as an effect records its intent before it runs and its
receipt after it returns, through a worker plugin.

    from tallybook.integrations.temporal import TallybookPlugin, effect

    @effect(kind="payment", target="stripe", key="refund:{order}", receipt="id")
    @activity.defn
    async def refund(order: str, cents: int) -> dict: ...

    Worker(client, task_queue="refunds", activities=[refund], plugins=[TallybookPlugin()])

The plugin adds an activity interceptor to the worker; undeclared activities pass through
untouched. The key survives Temporal's retries (the workflow id and the activity id, or the
declared template), each Temporal attempt is its own attempt in Tallybook (so a retry while
an earlier attempt may still run is never told to carry on), and the answer is given in
Temporal's terms:

- `proceed`: the activity runs; its result is the receipt, and is kept with it.
- `completed`: the activity does not run; the stored result is returned.
- `wait` (an approval, an effect in doubt) and an intent not recorded: a retryable
  `ApplicationError`, so the activity's retry policy asks again later; nothing is held in
  memory while a person decides.
- `denied`, `conflict`: a non-retryable `ApplicationError` with the reason and the case URL.

The receipt is reported from inside the attempt, so an attempt that finishes after Temporal
gave up on it (its result dropped by the server) is still evidence: a `late_success`, or a
`duplicate_effect` when a retry did it too. Needs `temporalio` (`pip install
"tallybook-sdk[temporal]"`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import temporalio.worker
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    WorkerConfig,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tallybook import tracing
from tallybook.aio import AsyncEffect, AsyncTallybook
from tallybook.client import REPLAY_POLICIES, Base, EffectOptions, ReplayPolicy
from tallybook.errors import EffectInterrupted, IntentNotRecorded
from tallybook.integrations._tool_calls import (
    TOOL_CALL,
    _accepted,
    field_at,
    jsonable,
    names_known,
)
from tallybook.records import Json, Receipt
from tallybook.tools import MAX_RESULT, template_names

log = logging.getLogger("tallybook")
F = TypeVar("F", bound=Callable[..., Any])

ATTRIBUTE = "__tallybook_effect__"
# The names a key template may use besides the activity's parameters.
ACTIVITY_NAMES = ("workflow_id", "activity_id", "activity_type")
# The longest deadline the server takes for an attempt (timeout_s).
MAX_TIMEOUT_S = 7 * 24 * 3600
ReceiptFrom = Union[str, Callable[[Any], Receipt]]  # noqa: UP007 (runs on 3.10)


@dataclass(frozen=True)
class ActivityEffect:
    """What `@effect(...)` declared about one activity; checked when it is made."""

    name: str
    params: tuple[str, ...]
    kind: str
    target: str
    replay: ReplayPolicy = "never"
    key: str | Callable[..., str] | None = None
    receipt: ReceiptFrom | None = None
    authority: dict[str, Any] | None = None
    amount: Mapping[str, str] | Callable[..., Mapping[str, str]] | None = None
    definitive_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        of = f" of activity {self.name}"
        for field in ("kind", "target"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise TypeError(f"{field}={getattr(self, field)!r}{of} must be a non-empty string")
        if self.replay not in REPLAY_POLICIES:
            raise TypeError(
                f"replay={self.replay!r}{of} must be one of {', '.join(REPLAY_POLICIES)}"
            )
        if isinstance(self.key, str):
            named = template_names(self.key)
            names_known(f"the key template{of}", named, self.params, ACTIVITY_NAMES)
        elif callable(self.key):
            names_known(f"the key function{of}", _accepted(self.key), self.params, ACTIVITY_NAMES)
        elif self.key is not None:
            raise TypeError(f"key={self.key!r}{of} must be a template or a function")
        if isinstance(self.receipt, str):
            if not self.receipt or not all(self.receipt.split(".")):
                raise TypeError(
                    f"receipt={self.receipt!r}{of} must name a field ('id', 'refund.id')"
                )
        elif self.receipt is not None and not callable(self.receipt):
            raise TypeError(
                f"receipt={self.receipt!r}{of} must be the result's field with the provider's id "
                "or a function of the result returning a tallybook.Receipt"
            )
        if callable(self.amount):
            names_known(f"the amount function{of}", _accepted(self.amount), self.params, ())
        elif self.amount is not None and not (
            isinstance(self.amount, Mapping) and {"value", "currency"} <= set(self.amount)
        ):
            raise TypeError(
                f"amount={self.amount!r}{of} must be {{'value', 'currency'}} or a function"
            )
        if not isinstance(self.definitive_on, tuple) or not all(
            isinstance(e, type) and issubclass(e, BaseException) for e in self.definitive_on
        ):
            raise TypeError(f"definitive_on{of} must be a tuple of exception types")
        if self.authority is not None and not isinstance(self.authority, dict):
            raise TypeError(f"authority={self.authority!r}{of} must be a dict ({{'grant': 4}})")


def effect(
    *,
    kind: str,
    target: str,
    key: str | Callable[..., str] | None = None,
    replay: ReplayPolicy = "never",
    receipt: ReceiptFrom | None = None,
    authority: dict[str, Any] | None = None,
    amount: Mapping[str, str] | Callable[..., Mapping[str, str]] | None = None,
    definitive_on: tuple[type[BaseException], ...] = (),
) -> Callable[[F], F]:
    """Declare an activity an effect; above or below `@activity.defn`, the function unchanged.

    `key` is a template of the activity's arguments and of `workflow_id`, `activity_id` and
    `activity_type` ("refund:{order}", "{req.order_id}"), or a function of the arguments; by
    default "{workflow_id}:{activity_type}:{activity_id}". `receipt` is the result's field
    holding the provider's id ("id", "refund.id"), or a function of the result returning a
    `Receipt`. `kind`, `target`, `replay`, `authority`, `amount` and `definitive_on` are those
    of `tb.effect(...)`. A mistake is a TypeError here, before any activity runs.
    """

    def declare(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@effect declares an activity function, not {fn!r}")
        parameters = list(inspect.signature(fn).parameters)
        if parameters[:1] == ["self"]:
            parameters = parameters[1:]  # an activity method: bound when the worker calls it
        declared = ActivityEffect(
            name=getattr(fn, "__qualname__", repr(fn)),
            params=tuple(parameters),
            kind=kind,
            target=target,
            replay=replay,
            key=key,
            receipt=receipt,
            authority=authority,
            amount=amount,
            definitive_on=definitive_on,
        )
        setattr(fn, ATTRIBUTE, declared)
        return fn

    return declare


class TallybookInterceptor(temporalio.worker.Interceptor):
    """The worker interceptor: records each declared activity as an effect.

    `tb` is the client (`AsyncTallybook()` from the environment unless given); `build_id` the
    worker's, recorded as the workflow version of each attempt (Temporal's default build id,
    a digest of the loaded code, unless given).
    """

    def __init__(self, tb: Base | None = None, *, build_id: str | None = None) -> None:
        self.tb = tb if tb is not None else AsyncTallybook()
        self.build_id = build_id

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Activities(next, self)

    def version(self) -> str | None:
        if self.build_id is None:
            try:
                from temporalio.worker._worker import load_default_build_id
            except ImportError:  # a private function: its absence costs the version only
                return None
            self.build_id = load_default_build_id()
        return self.build_id


class TallybookPlugin(SimplePlugin):
    """The worker plugin: `Worker(..., plugins=[TallybookPlugin()])`, or on the client.

    Adds a `TallybookInterceptor` to each worker, after the interceptors it has (after
    Temporal's OpenTelemetry interceptor, so the effect links to the activity's span), with
    the worker's build id; and lets `tallybook` through the workflow sandbox.
    """

    def __init__(self, tb: Base | None = None) -> None:
        self.tb = tb if tb is not None else AsyncTallybook()

        def runner(given: WorkflowRunner | None) -> WorkflowRunner:
            if given is None:
                raise ValueError("No WorkflowRunner provided to the Tallybook plugin.")
            if isinstance(given, SandboxedWorkflowRunner):
                restrictions = given.restrictions.with_passthrough_modules("tallybook")
                return dataclasses.replace(given, restrictions=restrictions)
            return given

        super().__init__("tallybook.TallybookPlugin", workflow_runner=runner)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        deployment = config.get("deployment_config")
        build_id = deployment.version.build_id if deployment else config.get("build_id")
        interceptor = TallybookInterceptor(self.tb, build_id=build_id)
        config["interceptors"] = [*config.get("interceptors", []), interceptor]
        return config


class _Activities(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, root: TallybookInterceptor) -> None:
        super().__init__(next)
        self.root = root

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        declared: ActivityEffect | None = getattr(input.fn, ATTRIBUTE, None)
        if declared is None:
            return await self.next.execute_activity(input)
        info = activity.info()
        call = _Call(declared, info, _arguments(input.fn, input.args))
        tb = self.root.tb
        run_id = info.workflow_id or f"activity:{info.activity_id}"
        _name_span(info, run_id, call.tool_call_id)
        context = {"temporal_run_id": info.workflow_run_id, "task_queue": info.task_queue}
        with tb.run(
            info.workflow_type or info.activity_type,
            version=self.root.version(),
            run_id=run_id,
            **{k: v for k, v in context.items() if v},
        ):
            # Each Temporal attempt is an attempt of its own: a retry that runs while the
            # attempt before it may still be running (Temporal gave up on it) must not be told
            # to carry on with it, even in the same process.
            try:
                key, options = call.key(), call.options()
            except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
                # The declaration does not fit these arguments: the same on every retry.
                raise ApplicationError(
                    f"The effect declaration of {declared.name} failed for these arguments, "
                    f"so the activity did not run: {exc!r}",
                    type="EffectDeclarationError",
                    non_retryable=True,
                ) from exc
            block = _Attempt(tb, key, options, f"{tb.worker}#{info.attempt}")
            try:
                async with block as fx:
                    if fx.completed:
                        return call.replay(fx._done_before())
                    result = await self.next.execute_activity(input)
                    await fx.receipt(**call.evidence(result))
                    return result
            except EffectInterrupted as report:
                raise refusal(report) from None


class _Attempt(AsyncEffect):
    """An effect block whose intent names the Temporal attempt as its worker."""

    def __init__(self, tb: Base, key: str, options: EffectOptions, worker: str) -> None:
        super().__init__(tb, key, options)
        self._worker = worker

    def _begin(self) -> Json:
        body = super()._begin()
        body["worker"] = self._worker
        return body


@dataclass(frozen=True)
class _Call:
    """One attempt of a declared activity: its key, its intent's options, its receipt."""

    effect: ActivityEffect
    info: activity.Info
    args: dict[str, Any]

    @property
    def tool_call_id(self) -> str:
        """The activity, as the call of a tool: unique in the project, as the activity id
        alone (its place in its workflow) is not."""
        return f"{self.info.workflow_id or 'activity'}:{self.info.activity_id}"

    def key(self) -> str:
        names = {
            "workflow_id": self.info.workflow_id or "activity",
            "activity_id": self.info.activity_id,
            "activity_type": self.info.activity_type,
        }
        key = self.effect.key
        if key is None:
            return "{workflow_id}:{activity_type}:{activity_id}".format(**names)
        if callable(key):
            return key(**_named(key, {**names, **self.args}))
        return key.format(**{**names, **self.args})

    def options(self) -> EffectOptions:
        effect = self.effect
        options: EffectOptions = {
            "kind": effect.kind,
            "target": effect.target,
            "replay": effect.replay,
            "request": _json(self.args),
            "tool_call_id": self.tool_call_id,
        }
        if (timeout := _deadline(self.info)) is not None:
            options["timeout_s"] = timeout
        if effect.authority is not None:
            options["authority"] = effect.authority
        if effect.amount is not None:
            amount = (
                effect.amount(**_named(effect.amount, self.args))
                if callable(effect.amount)
                else effect.amount
            )
            options["amount"] = {"value": str(amount["value"]), "currency": amount["currency"]}
        if effect.definitive_on:
            options["definitive_on"] = effect.definitive_on
        return options

    def evidence(self, result: Any) -> dict[str, Any]:
        """`fx.receipt`'s arguments for the activity's result, kept with it.

        The activity has done its effect: a receipt that cannot be read from the result is
        logged, and the effect recorded under its Temporal attempt all the same.
        """
        try:
            made = self._receipt(result)
        except Exception as exc:
            log.warning(
                "No receipt in the result of %s (%s): recorded without", self.effect.name, exc
            )
            made = None
        if made is None:
            attempt = f"{self.info.workflow_id}/{self.info.activity_id}#{self.info.attempt}"
            # No provider id: the receipt names the Temporal attempt under TOOL_CALL.
            made = Receipt(system=TOOL_CALL, external_id=attempt)
        kept: dict[str, Any] = {"result": _json(result)}
        if made.data is not None:
            kept["data"] = made.data
        if len(json.dumps(kept, default=str)) > MAX_RESULT:
            log.warning(
                "The result of %s is not kept with its receipt (too large)", self.effect.name
            )
            kept = {"data": made.data} if made.data is not None else {}
        return {
            "system": made.system,
            "external_id": made.external_id,
            "observed_at": made.observed_at,
            "data": kept or None,
        }

    def _receipt(self, result: Any) -> Receipt | None:
        receipt = self.effect.receipt
        if receipt is None:
            return result if isinstance(result, Receipt) else None
        if isinstance(receipt, str):
            return Receipt(system=self.effect.target, external_id=str(field_at(result, receipt)))
        made = receipt(result)
        if not isinstance(made, Receipt):
            raise TypeError(f"receipt= returned {type(made).__name__}, not a tallybook.Receipt")
        return made

    def replay(self, stored: Receipt) -> Any:
        """What an activity done before returns: its result then, else the receipt on record
        (a person or a reconciler found the effect)."""
        if isinstance(stored.data, dict) and "result" in stored.data:
            return stored.data["result"]
        return stored


def refusal(report: EffectInterrupted) -> ApplicationError:
    """The interruption report as Temporal's failure: `wait` and an intent not recorded (the
    server away) are retryable, so the retry policy asks again; `denied`, `conflict` and an
    intent the server refused are not."""
    # An intent the server refused (a 4xx) fails the same way however often it is sent.
    refused = isinstance(report, IntentNotRecorded) and report.status is not None
    retryable = report.decision in ("wait", "unrecorded") and not refused
    details = {
        "key": report.key,
        "decision": report.decision,
        "reason": report.reason,
        "case": report.case.id if report.case else None,
        "case_url": report.case_url,
    }
    return ApplicationError(
        str(report), details, type=type(report).__name__, non_retryable=not retryable
    )


def _name_span(info: activity.Info, run_id: str, tool_call_id: str) -> None:
    """Name the activity's span (Temporal's OpenTelemetry interceptor's, when it is on) as
    the tool call of the run, so Tallybook files it under the run and links the effect."""
    if not tracing.OTEL:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(
            {
                "gen_ai.tool.name": info.activity_type,
                "gen_ai.tool.call.id": tool_call_id,
                "tallybook.run.id": run_id,
            }
        )


def _deadline(info: activity.Info) -> int | None:
    """The attempt's deadline in Tallybook: the activity's start-to-close timeout (else its
    schedule-to-close), in whole seconds."""
    timeout = info.start_to_close_timeout or info.schedule_to_close_timeout
    if not timeout:
        return None
    return max(1, min(MAX_TIMEOUT_S, math.ceil(timeout.total_seconds())))


def _arguments(fn: Callable[..., Any], args: Sequence[Any]) -> dict[str, Any]:
    """The activity's arguments by name, defaults applied."""
    try:
        bound = inspect.signature(fn).bind(*args)
    except TypeError:
        return {f"arg{i}": value for i, value in enumerate(args)}
    bound.apply_defaults()
    return dict(bound.arguments)


def _json(value: Any) -> Any:
    """The value as JSON, the way Temporal's payload converter writes it (dataclasses,
    pydantic models with its converter); else its text."""
    try:
        payload = activity.payload_converter().to_payloads([value])[0]
    except Exception:
        payload = None
    if payload is not None and payload.metadata.get("encoding") == b"json/plain":
        return json.loads(payload.data)
    if payload is not None and payload.metadata.get("encoding") == b"binary/null":
        return None
    return jsonable(value)


def _named(fn: Callable[..., Any], values: dict[str, Any]) -> dict[str, Any]:
    accepts = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepts.values()):
        return values
    return {name: value for name, value in values.items() if name in accepts}


__all__ = ["ActivityEffect", "TallybookInterceptor", "TallybookPlugin", "effect", "refusal"]
