"""The OpenAI Agents SDK (`openai-agents`): every function tool call of an agent is an effect.

    from tallybook.integrations.openai_agents import durable

    agent = durable(agent, tb, tools={"lookup_order": "safe", "refund": ToolEffect(...)})
    with tb.run("support-bot", run_id=ticket_id):
        result = await Runner.run(agent, message)
        while result.interruptions:             # approvals, and effects in doubt
            result = await Runner.run(agent, await settle(agent, result))

Each call's intent is recorded once, by the tool's `needs_approval` policy, before the
framework decides whether the call may run: a `wait` (a grant that requires approval, an
effect left in doubt by a crash) interrupts the run with the framework's approval item;
`settle` waits until an operator has decided in the desk and approves or rejects the items
accordingly. The tool then runs inside the block that intent opened; an effect done before
returns the result stored with its receipt, and a denied one tells the model it was not
performed. The model request and the tool call are recorded as spans (agent hooks and the
tool wrapper), so the effect links to both; the run is named for the agent, and ends when
the agent's final output does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import Agent, AgentHooks, FunctionTool, RunContextWrapper, RunResult, RunState
from agents.items import ModelResponse
from agents.tool import maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from tallybook.aio import AsyncEffect
from tallybook.client import Base
from tallybook.errors import EffectConflict, EffectDenied, EffectInDoubt
from tallybook.integrations._tool_calls import (
    DEFAULT,
    Call,
    Declarations,
    Spans,
    ToolEffect,
    arguments,
    check_declarations,
    declared,
    default_client,
    now,
    stored_result,
    wait_for,
)
from tallybook.scope import current_run

__all__ = ["ToolEffect", "durable", "settle"]

RunId = Callable[[RunContextWrapper[Any]], str | None]


@dataclasses.dataclass
class _Durable:
    """What `durable` wrapped a tool with: the client, its declaration and the run id."""

    client: Base | None
    effect: ToolEffect
    run_id: RunId | None
    spans: Spans
    workflow: str  # the agent's name
    # What `needs_approval` was answered for a call, by call id, for its invocation to use:
    # the block its intent entered, or the refusal. One intent per tool call.
    asked: dict[str, AsyncEffect | EffectDenied | EffectConflict] = dataclasses.field(
        default_factory=dict
    )

    @property
    def tb(self) -> Base:
        return self.client or default_client()

    def call(self, context: RunContextWrapper[Any], tool: str, raw: str, call_id: str) -> Call:
        run_id = current_run() or (self.run_id(context) if self.run_id else None)
        return Call(tool, call_id, arguments(raw), run_id, self.effect, self.workflow)


def durable(
    agent: Agent[Any],
    tb: Base | None = None,
    *,
    tools: Declarations | None = None,
    default: ToolEffect = DEFAULT,
    run_id: RunId | None = None,
    spans: bool = True,
) -> Agent[Any]:
    """A copy of `agent` whose function tool calls are recorded as effects.

    `tools` declares tools by name: a `ToolEffect`, a replay policy ("safe") or None (not an
    effect); the others get `default`. `tb` defaults to `Tallybook()` from the environment,
    made at the first call. `run_id`, a function of the run context, names the run when no
    `tb.run(...)` is open. `spans=False` records no spans of its own.
    """
    function_tools = [t for t in agent.tools if isinstance(t, FunctionTool)]
    check_declarations(
        tools,
        {t.name: (t.params_json_schema or {}).get("properties", {}) for t in function_tools},
    )
    recorder = Spans(tb, spans)
    wrapped = []
    for tool in agent.tools:
        effect = declared(tools, tool.name, default) if isinstance(tool, FunctionTool) else None
        if isinstance(tool, FunctionTool) and effect is not None:
            tool = _durable_tool(tool, _Durable(tb, effect, run_id, recorder, agent.name))
        wrapped.append(tool)
    hooks = _ModelSpans(recorder, run_id, agent.hooks)
    return agent.clone(tools=wrapped, hooks=hooks)


async def settle(agent: Agent[Any], result: RunResult, *, timeout: float = 300.0) -> RunState[Any]:
    """Wait until every interrupted tool call is decided in Tallybook; the state to run again.

    A call Tallybook lets proceed (approved, or settled as not happened when its replay
    policy allows a retry) or knows completed is approved; a denied one is rejected with the
    reason. Raises EffectInDoubt when one is still undecided after `timeout` seconds.
    """
    state = result.to_state()
    tools = {t.name: t for t in agent.tools if isinstance(t, FunctionTool)}
    context = state._context or RunContextWrapper(None)
    for item in result.interruptions:
        durable_tool = getattr(tools.get(item.tool_name or ""), "_tallybook", None)
        if not isinstance(durable_tool, _Durable):
            continue  # an approval of the framework's own: the agent's code decides it
        raw = item.raw_item
        call = durable_tool.call(
            context, item.tool_name or "", _field(raw, "arguments"), str(_field(raw, "call_id"))
        )
        try:
            durable_tool.asked[call.call_id] = await _ask(durable_tool.tb, call)
        except EffectInDoubt:
            status = await asyncio.to_thread(wait_for, durable_tool.tb, call.key, timeout)
            if status.decision not in ("proceed", "completed"):
                state.reject(item, rejection_message=f"Not performed: {status.reason}")
                continue
        except (EffectDenied, EffectConflict) as report:
            state.reject(item, rejection_message=f"Not performed. {report}")
            continue
        state.approve(item)
    return state


async def _ask(tb: Base, call: Call) -> AsyncEffect:
    """Record the call's intent, performing nothing: the entered block, or the interruption
    report raised. The block's span ends with the intent (the tool runs in another task)."""
    block = AsyncEffect(tb, call.key, call.options())
    with call.in_run(tb):
        await block.__aenter__()
    block._span.end(None)
    return block


class _Asked:
    """`async with`: the block `needs_approval` entered for the call, else a new one."""

    def __init__(self, durable_tool: _Durable, call: Call) -> None:
        self._durable, self._call = durable_tool, call
        self._block: AsyncEffect | None = None

    async def __aenter__(self) -> AsyncEffect:
        asked = self._durable.asked.pop(self._call.call_id, None)
        if isinstance(asked, (EffectDenied, EffectConflict)):
            raise asked
        self._block = asked or await _ask(self._durable.tb, self._call)
        return self._block

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._block is not None
        await self._block.__aexit__(*exc_info)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _durable_tool(tool: FunctionTool, durable_tool: _Durable) -> FunctionTool:
    # The tool's own invoker turns its exceptions into a message for the model; the effect
    # block must see them (a failure is reported, not a receipt), so call beneath it.
    invoke_tool = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)
    own_approval = tool.needs_approval

    async def needs_approval(context: RunContextWrapper[Any], params: Any, call_id: str) -> bool:
        """Record the intent now: a `wait` interrupts the run with an approval item."""
        if own_approval is True or (
            callable(own_approval) and await own_approval(context, params, call_id)
        ):
            return True
        call = durable_tool.call(context, tool.name, json.dumps(params), call_id)
        try:
            durable_tool.asked[call_id] = await _ask(durable_tool.tb, call)
        except EffectInDoubt:
            return True  # asked again when the run resumes with the call approved
        except (EffectDenied, EffectConflict) as report:
            durable_tool.asked[call_id] = report  # the call tells the model
        return False

    async def on_invoke_tool(context: ToolContext[Any], raw: str) -> Any:
        call = durable_tool.call(context, tool.name, raw, context.tool_call_id)
        tb = durable_tool.tb
        started, result = now(), None
        error: BaseException | None = None
        try:
            with call.in_run(tb):
                async with _Asked(durable_tool, call) as fx:
                    if fx.completed:
                        result = stored_result(fx.receipt.stored)
                        return result
                    try:
                        result = await invoke_tool(context, raw)
                    except Exception as exc:
                        # A failure, not a receipt; the model gets the tool's message as before.
                        error = exc
                        message = await maybe_invoke_function_tool_failure_error_function(
                            function_tool=tool, context=context, error=exc
                        )
                        if message is None:
                            raise
                        await fx.fail(exc, definitive=isinstance(exc, call.effect.definitive_on))
                        return message
                    await fx.receipt(**call.receipt(result))
                    return result
        except (EffectDenied, EffectConflict) as report:
            error = report
            return f"Not performed. {report}"
        except BaseException as exc:
            error = exc
            raise
        finally:
            durable_tool.spans.tool(call, started, output=result, error=error)

    wrapped = dataclasses.replace(
        tool, on_invoke_tool=on_invoke_tool, needs_approval=needs_approval
    )
    wrapped._tallybook = durable_tool  # type: ignore[attr-defined]
    return wrapped


class _ModelSpans(AgentHooks[Any]):
    """Records each model request of the agent as a span; passes every hook on to `inner`."""

    def __init__(self, spans: Spans, run_id: RunId | None, inner: AgentHooks[Any] | None) -> None:
        self._spans, self._run_id, self._inner = spans, run_id, inner
        self._started: dict[int, Any] = {}

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, items: Any) -> None:
        self._started[id(context)] = now()
        if self._inner:
            await self._inner.on_llm_start(context, agent, system_prompt, items)

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        start = self._started.pop(id(context), None) or now()
        calls = [
            {"id": item.call_id, "name": item.name, "arguments": item.arguments}
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall)
        ]
        model = agent.model if isinstance(agent.model, str) else None
        self._spans.model(
            run_id=self._run(context),
            start=start,
            calls=calls,
            model=model or getattr(agent.model, "model", None) or type(agent.model).__name__,
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
        )
        if self._inner:
            await self._inner.on_llm_end(context, agent, response)

    def _run(self, context: Any) -> str | None:
        return current_run() or (self._run_id(context) if self._run_id else None)

    async def on_start(self, context: Any, agent: Any) -> None:
        self._spans.run(self._run(context), agent=agent.name)
        if self._inner:
            await self._inner.on_start(context, agent)

    async def on_end(self, context: Any, agent: Any, output: Any) -> None:
        self._spans.run(self._run(context), agent=agent.name, status="ok")
        if self._inner:
            await self._inner.on_end(context, agent, output)

    async def on_handoff(self, context: Any, agent: Any, source: Any) -> None:
        if self._inner:
            await self._inner.on_handoff(context, agent, source)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        if self._inner:
            await self._inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if self._inner:
            await self._inner.on_tool_end(context, agent, tool, result)
