"""LangGraph: every tool call a `ToolNode` runs is an effect.

    from tallybook.integrations.langgraph import DurableToolNode, invoke

    builder.add_node("tools", DurableToolNode(tools, effects={"refund": ToolEffect(...)}))
    graph = builder.compile(checkpointer=saver)
    result = invoke(graph, inputs, {"configurable": {"thread_id": ticket_id}})

`invoke` (and `ainvoke`) refuses a graph without a checkpointer before it runs, runs the
graph as the Tallybook run of its thread, named for the graph, resumes it (`settle`) while
it stops for an approval or an effect in doubt, up to `wait` seconds, and ends the run.
The node's tool call interceptor (`wrap_tool_call`) enters the effect block around each
call: the run is the `tb.run(...)` open around the graph, else the graph's thread. A `wait`
(an approval the grant requires, an effect left in doubt by a crash) calls `interrupt()`
with the interruption report: the graph stops at its checkpoint, and the call asks again
when it is resumed. An effect done before returns the result stored with its receipt; a
denied one tells the model it was not performed. The tool call and the model message that
asked for it are recorded as spans, so the effect links to both.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from tallybook import tracing
from tallybook.aio import AsyncEffect
from tallybook.client import Base, Effect
from tallybook.errors import EffectConflict, EffectDenied, EffectInDoubt
from tallybook.integrations._tool_calls import (
    DEFAULT,
    Call,
    Declarations,
    Spans,
    ToolEffect,
    check_declarations,
    declared,
    default_client,
    now,
    stored_result,
    wait_for,
)
from tallybook.scope import current_run

__all__ = ["DurableToolNode", "ToolEffect", "ainvoke", "invoke", "settle"]

WORKFLOW = "langgraph"
WAIT = 300.0  # seconds `invoke` waits for the desk's decision on a call the graph stopped for
NO_CHECKPOINTER = (
    "a graph with a DurableToolNode needs a checkpointer (builder.compile(checkpointer=...)): "
    "a call stopped for an approval or an effect in doubt is resumed from it"
)
Result = ToolMessage | Command[Any]
Execute = Callable[[ToolCallRequest], Result]
AsyncExecute = Callable[[ToolCallRequest], Awaitable[Result]]


class DurableToolNode(ToolNode):
    """A `ToolNode` whose tool calls are recorded as effects.

    `effects` declares tools by name: a `ToolEffect`, a replay policy ("safe") or None (not
    an effect); the others get `default`. `tb` defaults to `Tallybook()` from the
    environment. `spans=False` records no spans (when another instrumentation sends them).
    """

    def __init__(
        self,
        tools: Sequence[Any],
        tb: Base | None = None,
        *,
        effects: Declarations | None = None,
        default: ToolEffect = DEFAULT,
        spans: bool = True,
        **options: Any,
    ) -> None:
        self._tb, self._effects, self._default = tb, effects, default
        self._spans = Spans(tb, spans)
        super().__init__(tools, wrap_tool_call=self._wrap, awrap_tool_call=self._awrap, **options)
        check_declarations(
            effects,
            {name: dict(tool.args) for name, tool in self.tools_by_name.items()},
        )

    @property
    def tb(self) -> Base:
        if self._tb is None:
            self._tb = default_client()
        return self._tb

    def _call(self, request: ToolCallRequest) -> Call | None:
        tool_call = request.tool_call
        effect = declared(self._effects, tool_call["name"], self._default)
        if effect is None:
            return None
        config = getattr(request.runtime, "config", None) or {}
        configurable = config.get("configurable", {})
        if not configurable.get(CONFIG_KEY_CHECKPOINTER):
            raise TypeError(NO_CHECKPOINTER)  # before the effect, not once it is approved
        run_id = current_run() or configurable.get("thread_id")
        call = Call(
            tool_call["name"],
            str(tool_call["id"]),
            dict(tool_call["args"]),
            run_id,
            effect,
            WORKFLOW,
        )
        self._model_span(request, call)
        return call

    def _model_span(self, request: ToolCallRequest, call: Call) -> None:
        """The model message that asked for the call, as a span: once per message."""
        if not self._spans.enabled:
            return
        message = _asking(request.state, call.call_id)
        if message is None:
            return
        first = message.tool_calls[0]["id"] if message.tool_calls else call.call_id
        span_id = hashlib.sha256(f"{call.run_id}:{message.id or first}".encode()).hexdigest()
        usage: dict[str, Any] = dict(message.usage_metadata or {})
        self._spans.model(
            run_id=call.run_id,
            start=now(),
            calls=[
                {"id": c["id"], "name": c["name"], "arguments": c["args"]}
                for c in message.tool_calls
            ],
            model=message.response_metadata.get("model_name"),
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
            text=message.text or None,
            span_id=span_id[:16],
        )

    def _tool_span(self, call: Call, started: Any, result: Any, error: Any) -> None:
        self._spans.tool(call, started, output=_content(result), error=error)

    def _wrap(self, request: ToolCallRequest, execute: Execute) -> Result:
        call = self._call(request)
        if call is None:
            return execute(request)
        started = now()
        result: Result | None = None
        error: BaseException | None = None
        try:
            with call.in_run(self.tb):
                while True:
                    try:
                        with Effect(self.tb, call.key, _options(call)) as fx:
                            if fx.completed:
                                result = _replayed(call, fx.receipt.stored)
                                return result
                            result = execute(request)
                            if _failed(result):
                                fx.fail(str(_content(result)))
                            else:
                                fx.receipt(**call.receipt(_content(result)))
                            return result
                    except EffectInDoubt as report:
                        # Stops the graph at its checkpoint; resumed, the call asks again.
                        interrupt(_report(call, report))
        except (EffectDenied, EffectConflict) as report:
            error, result = report, _not_performed(call, report)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._tool_span(call, started, result, error)

    async def _awrap(self, request: ToolCallRequest, execute: AsyncExecute) -> Result:
        call = self._call(request)
        if call is None:
            return await execute(request)
        started = now()
        result: Result | None = None
        error: BaseException | None = None
        try:
            with call.in_run(self.tb):
                while True:
                    try:
                        async with AsyncEffect(self.tb, call.key, _options(call)) as fx:
                            if fx.completed:
                                result = _replayed(call, fx.receipt.stored)
                                return result
                            result = await execute(request)
                            if _failed(result):
                                await fx.fail(str(_content(result)))
                            else:
                                await fx.receipt(**call.receipt(_content(result)))
                            return result
                    except EffectInDoubt as report:
                        interrupt(_report(call, report))
        except (EffectDenied, EffectConflict) as report:
            error, result = report, _not_performed(call, report)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._tool_span(call, started, result, error)


def invoke(
    graph: Any,
    input: Any,
    config: dict[str, Any],
    tb: Base | None = None,
    *,
    wait: float = WAIT,
    agent: str | None = None,
) -> dict[str, Any]:
    """`graph.invoke` as a Tallybook run: the graph's state once it ends, or once a call it
    stopped for is still undecided (`wait=0`: at once, for the caller's own interrupt
    handling; `settle` resumes it later). Raises EffectInDoubt when `settle` gave up."""
    run = _GraphRun(graph, config, tb, agent)
    with run.opened():
        result = graph.invoke(input, config)
        while "__interrupt__" in result and wait > 0:
            result = graph.invoke(settle(result, run.tb, timeout=wait), config)
        return run.ended(result)


async def ainvoke(
    graph: Any,
    input: Any,
    config: dict[str, Any],
    tb: Base | None = None,
    *,
    wait: float = WAIT,
    agent: str | None = None,
) -> dict[str, Any]:
    """`invoke` for `graph.ainvoke`."""
    run = _GraphRun(graph, config, tb, agent)
    with run.opened():
        result = await graph.ainvoke(input, config)
        while "__interrupt__" in result and wait > 0:
            resume = await asyncio.to_thread(settle, result, run.tb, timeout=wait)
            result = await graph.ainvoke(resume, config)
        return run.ended(result)


class _GraphRun:
    """The Tallybook run of one graph thread: named for the graph, ended with it."""

    def __init__(self, graph: Any, config: dict[str, Any], tb: Base | None, agent: str | None):
        if not getattr(graph, "checkpointer", None):
            raise TypeError(NO_CHECKPOINTER)
        self.tb = tb or default_client()
        self.run_id = current_run() or config.get("configurable", {}).get("thread_id")
        self.agent = agent or graph.get_name()
        self.spans = Spans(self.tb)

    @contextmanager
    def opened(self) -> Iterator[None]:
        with (
            nullcontext() if current_run() else self.tb.run(self.agent, run_id=self.run_id),
            tracing.agent_span(self.tb.tracer_provider, self.agent, self.run_id),
        ):
            # Names the current trace (the agent span's): another instrumentation's spans
            # started inside join the run.
            self.spans.run(self.run_id, agent=self.agent)
            try:
                yield
            except BaseException as exc:
                if not isinstance(exc, EffectInDoubt):
                    self.spans.run(self.run_id, agent=self.agent, status="error", error=exc)
                raise

    def ended(self, result: Any) -> dict[str, Any]:
        if "__interrupt__" not in result:  # stopped for the desk: the run goes on
            self.spans.run(self.run_id, agent=self.agent, status="ok")
        return dict(result)


def settle(
    result: dict[str, Any], tb: Base | None = None, *, timeout: float = WAIT
) -> Command[Any]:
    """Wait until every call the graph stopped for is decided in Tallybook; the resume command.

    Other interrupts are resumed with None. Raises EffectInDoubt when a call is still
    undecided after `timeout` seconds.
    """
    client = tb or default_client()
    decisions: dict[str, Any] = {}
    for stopped in result.get("__interrupt__", ()):
        value = stopped.value
        if isinstance(value, dict) and "tallybook" in value:
            decisions[stopped.id] = wait_for(client, value["key"], timeout).decision
        else:
            decisions[stopped.id] = None
    return Command(resume=decisions)


def _options(call: Call) -> Any:
    options = call.options()
    # A tool that interrupts the graph itself (to ask a person) has done nothing yet.
    options["definitive_on"] = (*options.get("definitive_on", ()), GraphBubbleUp)
    return options


def _asking(state: Any, call_id: str) -> AIMessage | None:
    """The model message in the state that asked for the call."""
    messages = state.get("messages", []) if isinstance(state, dict) else state
    if not isinstance(messages, list):
        messages = getattr(state, "messages", [])
    for message in reversed(messages):
        if isinstance(message, AIMessage) and any(c["id"] == call_id for c in message.tool_calls):
            return message
    return None


def _content(result: Any) -> Any:
    return result.content if isinstance(result, ToolMessage) else None


def _failed(result: Result) -> bool:
    """The node turned the tool's exception into an error message (`handle_tool_errors`)."""
    return isinstance(result, ToolMessage) and result.status == "error"


def _replayed(call: Call, receipt: Any) -> ToolMessage:
    return ToolMessage(
        content=stored_result(receipt) or "", name=call.tool, tool_call_id=call.call_id
    )


def _not_performed(call: Call, report: Exception) -> ToolMessage:
    return ToolMessage(
        content=f"Not performed. {report}",
        name=call.tool,
        tool_call_id=call.call_id,
        status="error",
    )


def _report(call: Call, report: EffectInDoubt) -> dict[str, Any]:
    """What the graph's caller sees in `__interrupt__`: the interruption report."""
    return {
        "tallybook": report.decision,
        "key": call.key,
        "tool": call.tool,
        "tool_call_id": call.call_id,
        "reason": report.reason,
        "case": report.case.reason if report.case else None,
        "case_url": report.case_url,
    }
