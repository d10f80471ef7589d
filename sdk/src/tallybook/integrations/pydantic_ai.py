"""pydantic-ai: every tool call an agent makes becomes an effect Tallybook records.

    from pydantic_ai import Agent
    from pydantic_ai.capabilities import Instrumentation
    from tallybook.integrations.pydantic_ai import Effects

    agent = Agent("openai:gpt-5", tools=[refund], capabilities=[Effects(), Instrumentation()])

`Effects` is a capability: around each tool call it records the intent (key, request, tool
call id, the `execute_tool` span), runs the tool only when Tallybook answers `proceed`, and
sends the tool's result as the receipt. A call done before is answered from its receipt; a
call that needs a person becomes pydantic-ai's approval-required deferred call, a refused one
a failed tool result the model sees. The run is pydantic-ai's conversation unless the agent
runs inside `tb.run(...)`; its id is stamped on pydantic-ai's spans as `tallybook.run.id`.
Needs pydantic-ai (`pip install "tallybook-sdk[pydantic-ai]"`, Python 3.11+).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    ModelRetry,
    RunContext,
    ToolFailed,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ToolFailedError, ToolRetryError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from tallybook.aio import AsyncTallybook
from tallybook.client import APPROVAL, ToolOptions
from tallybook.errors import EffectDenied, EffectInDoubt, EffectInterrupted
from tallybook.integrations._tool_calls import (
    Spans,
    check_effect,
    default_key,
    receipt_of,
)
from tallybook.records import Receipt
from tallybook.scope import current_run
from tallybook.tools import template_names

if TYPE_CHECKING:
    from pydantic_ai.capabilities.abstract import (
        WrapModelRequestHandler,
        WrapRunHandler,
        WrapToolExecuteHandler,
    )
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import ToolDefinition
    from typing_extensions import NotRequired

RUN_ID = "tallybook.run.id"  # the span attribute the server files spans under a run by
# A tool that raised one of these did not perform its effect: pydantic-ai's retry, failure and
# deferral signals (raw, and as the tool manager wraps them).
NOT_PERFORMED = (
    ModelRetry,
    ToolFailed,
    ToolRetryError,
    ToolFailedError,
    ApprovalRequired,
    CallDeferred,
)
KeyFrom = str | Callable[[dict[str, Any]], str]
ReceiptFrom = str | Callable[[Any], Receipt]


class ToolEffect(ToolOptions):
    """How one tool's calls are recorded: the effect's options, its key, where its receipt is."""

    # A template of "tool", "run_id", "tool_call_id" and the tool's arguments, or a function of
    # the arguments; the capability's key by default, else the run, the tool and a fingerprint
    # of the arguments (the same when the model retries the call with a new id).
    key: NotRequired[KeyFrom]
    # The result's field path holding the provider's id, or a function of the result returning
    # the Receipt; by default the result if it is one, else a receipt with no provider id.
    receipt: NotRequired[ReceiptFrom]


@dataclass(init=False, eq=False)
class Effects(AbstractCapability[Any]):
    """Records each tool call as an effect, and answers a repeated call from its receipt.

    `tools` declares, once per tool, its kind, target, replay policy and the rest of
    `tb.effect`'s options (plus `key` and `receipt`); only the tools named are recorded. Without
    `tools`, every function tool is, as kind "tool_call" on the target named after the tool,
    with the default replay policy `never`.
    """

    def __init__(
        self,
        tb: AsyncTallybook | None = None,
        *,
        tools: Mapping[str, ToolEffect] | None = None,
        key: KeyFrom | None = None,
        workflow: str | None = None,
        version: str | None = None,
    ) -> None:
        self._tb = tb
        self._tools = dict(tools) if tools is not None else None
        check_effect({"key": key})
        for name, declared in (self._tools or {}).items():
            if not isinstance(declared, Mapping):
                raise TypeError(f"the declaration of {name!r} must be a dict of effect options")
            check_effect(declared, name)
        self._key = key
        self._workflow, self._version = workflow, version

    @property
    def tb(self) -> AsyncTallybook:
        """The client: the one given, else one from the environment, made on first use."""
        if self._tb is None:
            self._tb = AsyncTallybook()
        return self._tb

    def declared(self, tool: str) -> ToolEffect | None:
        """How calls of `tool` are recorded; None when they are not."""
        if self._tools is None:
            return {"kind": "tool_call", "target": tool}
        return self._tools.get(tool)

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        current = current_run()
        if current is not None:
            _stamp(current)
            return await handler()
        # The conversation, not pydantic-ai's run: a run resumed with deferred tool results is a
        # new pydantic-ai run of the same conversation (and, under durable execution, both ids
        # come from the workflow's, so they are the same when the engine re-executes it).
        run_id = ctx.conversation_id or ctx.run_id
        agent = ctx.agent.name if ctx.agent is not None else None
        name = self._workflow or agent or "pydantic-ai"
        spans = Spans(self.tb)
        with self.tb.run(name, version=self._version, run_id=run_id):
            _stamp(run_id)
            spans.run(run_id, agent=agent, workflow=name)
            try:
                result = await handler()
            except (ApprovalRequired, CallDeferred, EffectInDoubt):
                raise  # stopped for the desk: the run goes on
            except BaseException as exc:
                spans.run(run_id, agent=agent, workflow=name, status="error", error=exc)
                raise
            if not _deferred(result):
                spans.run(run_id, agent=agent, workflow=name, status="ok")
            return result

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        _stamp(current_run())
        return await handler(request_context)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        run_id = current_run()
        _stamp(run_id)
        declared = self.declared(call.tool_name)
        if declared is None:
            return await handler(args)
        options: dict[str, Any] = dict(declared)
        key_from: KeyFrom | None = options.pop("key", self._key)
        receipt_from: ReceiptFrom | None = options.pop("receipt", None)
        options["definitive_on"] = (*options.get("definitive_on", ()), *NOT_PERFORMED)
        request = to_jsonable_python(args)
        if key_from is None:
            key = default_key(call.tool_name, run_id, request, call.tool_call_id)
        elif isinstance(key_from, str):
            ids = {"tool": call.tool_name, "run_id": run_id, "tool_call_id": call.tool_call_id}
            if unknown := template_names(key_from) - {*ids, *request}:
                raise TypeError(f"the key of {call.tool_name!r} names {', '.join(unknown)}")
            key = key_from.format(**{**ids, **request})
        else:
            key = key_from(request)
        try:
            async with self.tb.effect(
                key, request=request, tool_call_id=call.tool_call_id, **options
            ) as fx:
                if fx.completed:
                    return _replayed(fx._done_before())
                result = await handler(args)
                await fx.receipt(**_evidence(result, receipt_from, options["target"], call))
                return result
        except EffectInDoubt as report:
            if report.case is not None and report.case.reason == APPROVAL:
                # Resuming the run with this call approved asks Tallybook again: the desk's
                # approval is what lets the tool run.
                raise ApprovalRequired(metadata={"tallybook": _described(report)}) from report
            raise
        except EffectDenied as report:
            raise ToolFailed(str(report)) from report


def _stamp(run_id: str | None) -> None:
    """File the current span (pydantic-ai's run, model request or tool call) under the run."""
    if run_id is not None:
        trace.get_current_span().set_attribute(RUN_ID, run_id)


def _described(report: EffectInterrupted) -> dict[str, Any]:
    return {
        "key": report.key,
        "decision": report.decision,
        "reason": report.reason,
        "case": report.case.reason if report.case else None,
        "case_url": report.case_url,
    }


def _evidence(
    result: Any, receipt_from: ReceiptFrom | None, system: str, call: ToolCallPart
) -> dict[str, Any]:
    """`fx.receipt`'s arguments for a tool's result; the result is kept with the receipt."""
    if receipt_from is None and isinstance(result, Receipt):
        made, kept = result, result.data
    else:
        made = receipt_of(result, receipt_from, system, call.tool_call_id)
        try:
            kept = {"result": to_jsonable_python(result)}
        except PydanticSerializationError:
            kept = {}  # the effect happened: its receipt goes without the result
        if made.data is not None:
            kept["data"] = made.data
    return {
        "system": made.system,
        "external_id": made.external_id,
        "observed_at": made.observed_at,
        "data": kept,
    }


def _replayed(stored: Receipt) -> Any:
    """What a call done before answers: the result it returned then, else its receipt (an
    operator or a reconciler found the effect, and no result came with it)."""
    if isinstance(stored.data, dict) and "result" in stored.data:
        return stored.data["result"]
    return stored


def _deferred(result: Any) -> bool:
    """The run ended waiting for deferred calls (an approval in the desk): it goes on."""
    return isinstance(getattr(result, "output", None), DeferredToolRequests)
