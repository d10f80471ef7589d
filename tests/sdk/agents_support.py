"""Agents of the framework integration tests: a support bot that refunds an order through a
fake payment provider, asked by each framework's test model to call its `refund` tool.

The provider's ledger is a file, one line per refund performed. Run as a script
(`python -m tests.sdk.agents_support FRAMEWORK ...`) it is an agent process: `--crash` kills it
with SIGKILL right after the refund, before the receipt; it prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tallybook import Tallybook
from tallybook.integrations._tool_calls import ToolEffect, default_key

CALL_ID = "call_refund_7"
RUN_ID = "ticket-7"
# The refund's key as the docs' first example declares it, and by default (no key declared:
# the run, the tool and the arguments' fingerprint).
KEY = "refund:7"
DEFAULT_KEY = default_key("refund", RUN_ID, {"order": 7})


class Provider:
    """The fake payment provider: each refund is a line of its ledger; `crash` dies after one."""

    def __init__(self, ledger: Path, crash: bool = False) -> None:
        self.ledger, self.crash = ledger, crash
        ledger.touch()

    def refund(self, order: int) -> str:
        number = len(self.refunds()) + 1
        with self.ledger.open("a") as f:
            f.write(f"{order}\n")
        if self.crash:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"re_{order}_{number}"

    def refunds(self) -> list[str]:
        return self.ledger.read_text().splitlines()


def refund_effect(grant: int, declared: str = "docs") -> ToolEffect:
    """The refund declared as docs/sdk.md's first example declares it (its key, and where its
    receipt is), or with neither ("default")."""
    if declared == "default":
        return ToolEffect(kind="payment", target="fakepay", authority={"grant": grant})
    return ToolEffect(
        kind="payment",
        target="fakepay",
        key="refund:{order}",
        receipt="id",
        authority={"grant": grant},
    )


def openai_agent(
    provider: Provider, tb: Tallybook, grant: int, call_id: str = CALL_ID, declared: str = "docs"
) -> Any:
    from agents import Agent, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call
    from tallybook.integrations.openai_agents import durable

    @function_tool
    def refund(order: int) -> dict[str, str]:
        """Refund an order in full."""
        return {"id": provider.refund(order)}

    model = ScriptedModel(
        [[function_call("refund", {"order": 7}, call_id=call_id)], [assistant_message("Done.")]]
    )
    agent = Agent(name="support", instructions="Refund what is asked.", tools=[refund], model=model)
    return durable(agent, tb, tools={"refund": refund_effect(grant, declared)})


async def openai_run(agent: Any, tb: Tallybook, state: Any = None) -> Any:
    from agents import Runner

    with tb.run("support-bot", version="1.0", run_id=RUN_ID):
        result = await Runner.run(agent, state if state is not None else "Refund order 7.")
    # Receipts go out in the background; the tests read the ledger next.
    assert tb.flush(timeout=60), "the receipts were not delivered"
    return result


def langgraph_agent(
    provider: Provider,
    tb: Tallybook,
    grant: int,
    call_id: str = CALL_ID,
    declared: str = "docs",
    spans: bool = True,
) -> Any:
    """A model node and a tool node: the graph of LangGraph's own agent, with a fake model."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from tallybook.integrations.langgraph import DurableToolNode

    @tool
    def refund(order: int) -> dict[str, str]:
        """Refund an order in full."""
        return {"id": provider.refund(order)}

    asks = AIMessage("", tool_calls=[{"name": "refund", "args": {"order": 7}, "id": call_id}])
    model = FakeMessagesListChatModel(responses=[asks, AIMessage("Done.")])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node(
        "tools",
        DurableToolNode(
            [refund], tb, effects={"refund": refund_effect(grant, declared)}, spans=spans
        ),
    )
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


THREAD = {"configurable": {"thread_id": RUN_ID}}


def langgraph_run(graph: Any, tb: Tallybook, resume: Any = None) -> dict[str, Any]:
    """The graph invoked as the docs' first example invokes it, but returned when it stops
    for the desk (`wait=0`) instead of waiting for a decision."""
    from langchain_core.messages import HumanMessage
    from tallybook.integrations.langgraph import invoke

    start = resume if resume is not None else {"messages": [HumanMessage("Refund order 7.")]}
    return invoke(graph, start, THREAD, tb, wait=0, agent="support")


def agent_process(
    framework: str,
    live_server: Any,
    api_key: str,
    spool: Path,
    provider: Provider,
    grant: int,
    *,
    crash: bool = False,
    call_id: str = CALL_ID,
    declared: str = "docs",
) -> tuple[int, Any]:
    """Run the framework's agent in a process of its own (`main` below), its model naming
    the call `call_id`: its exit code, and the JSON it printed last (or its traceback).

    The process is forked from a server process that has imported the frameworks once per
    test process (multiprocessing's forkserver, AGENT_MODULES preloaded): importing the
    OpenAI Agents SDK takes seconds, paid once instead of by every agent process. Each agent
    process is still one of its own, its Tallybook client and its state its own, and --crash
    kills it (SIGKILL) as it would kill a process started from scratch."""
    argv = [framework, "--url", live_server.url, "--key", api_key, "--spool", str(spool)]
    argv += ["--ledger", str(provider.ledger), "--grant", str(grant), "--call-id", call_id]
    argv += ["--declared", declared]
    argv += ["--crash"] if crash else []
    return forked(main, argv)


def forked(target: Callable[[list[str]], int], argv: list[str]) -> tuple[int, Any]:
    """`target(argv)` in an agent process forked from the forkserver (AGENT_MODULES
    preloaded): its exit code and the JSON line it printed last, or else what it printed
    (the traceback of what it raised; nothing when killed)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(AGENT_MODULES)
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_forked, args=(target, argv, send), daemon=True)
    process.start()
    send.close()
    printed = ""
    with contextlib.suppress(EOFError):  # killed: the pipe closed with it, nothing sent
        if receive.poll(120):
            printed = receive.recv()
    receive.close()
    process.join(120)
    if process.is_alive():
        process.kill()
        process.join(30)
        raise AssertionError("the agent process did not finish in 120 s")
    assert process.exitcode is not None
    lines = printed.strip().splitlines()
    return process.exitcode, json.loads(lines[-1]) if lines and lines[-1][:1] == "{" else printed


# What an agent process imports, once, in the server it is forked from.
AGENT_MODULES = [
    "tests.sdk.agents_support",
    "agents",
    "tallybook.integrations.openai_agents",
    "langchain_core.language_models.fake_chat_models",
    "langgraph.checkpoint.memory",
    "langgraph.graph",
    "langgraph.prebuilt",
    "tallybook.integrations.langgraph",
    "tests.sdk.pydantic_ai_agent",
    "tallybook.integrations.pydantic_ai",
    "pydantic_ai.durable_exec.dbos",
]


def _forked(target: Callable[[list[str]], int], argv: list[str], send: Any) -> None:
    """An agent process: target(argv), what it printed sent back (or the traceback of what it
    raised); killed by --crash, it sends nothing (the pipe closes with it)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = target(argv)
    except BaseException:
        send.send(traceback.format_exc())
        raise
    send.send(printed.getvalue())
    sys.exit(code)


# The integrations as tests/sdk/test_integrations.py's scenario table runs them: each adapter
# asks its framework's agent for the refund (in this process, or in an agent process of its
# own to crash), and says what came of it in the same terms for every framework.

INTEGRATIONS = ("langgraph", "openai_agents", "pydantic_ai")


def refunded(ledger: Path) -> list[str]:
    """The orders the fake provider refunded (none while its ledger does not exist)."""
    return ledger.read_text().splitlines() if ledger.exists() else []


@dataclass
class Outcome:
    """What came of asking an agent for the refund."""

    output: Any  # its final answer; None while it is stopped
    stopped: list[str]  # the tools stopped for the desk
    cases: list[str | None]  # the case each stop names, where the framework says it
    reasons: list[str]  # the reason each stop gives, where the framework says it
    answer: Any  # what the refund's tool call answered the model (None if it did not run)
    raw: Any  # the framework's own result, to resume from


@dataclass
class Integration:
    """One framework's agent, with what its test model asks and what a refund answers."""

    name: str
    order: int
    call: str
    agent: str  # the run's agent name
    keys: dict[str, str]  # the refund's key, by how it is declared ("docs", "default")
    external_id: str  # the provider's id the receipt records
    receipt_data: dict[str, Any]
    output: str  # the agent's final answer once refunded
    answer: Any  # the tool call's answer once refunded
    ledger: Path
    client: Any = None
    reports_case: bool = True  # its stop names the case (the OpenAI Agents SDK's does not)
    tracer: Any = None  # pydantic-ai's spans, also kept in memory (`exported`)
    exported: Any = None
    closers: list[Any] = field(default_factory=list)

    def ask(self, grant: int, declared: str = "docs") -> Outcome:
        """The agent asked "Refund order N", its receipts delivered."""
        if self.name == "langgraph":
            graph = langgraph_agent(Provider(self.ledger), self.client, grant, declared=declared)
            outcome = self._graph(graph, langgraph_run(graph, self.client))
        elif self.name == "openai_agents":
            agent = openai_agent(Provider(self.ledger), self.client, grant, declared=declared)
            outcome = self._openai(agent, asyncio.run(openai_run(agent, self.client)))
        else:
            agent = self.pydantic_agent(receipt="refund_id", authority={"grant": grant})
            result = agent.run_sync(f"Refund order {self.order}", conversation_id=RUN_ID)
            outcome = self._pydantic(agent, result)
        self.flush()
        return outcome

    def resume(self, stopped: Outcome) -> Outcome:
        """The stopped agent resumed as its docs say: LangGraph and the OpenAI Agents SDK
        wait for the desk's decision (`settle`); pydantic-ai asks again at once."""
        if self.name == "langgraph":
            from tallybook.integrations.langgraph import settle

            graph, state = stopped.raw
            resumed = settle(state, self.client, timeout=120)
            outcome = self._graph(graph, langgraph_run(graph, self.client, resumed))
        elif self.name == "openai_agents":
            from agents import Runner
            from tallybook.integrations.openai_agents import settle as settle_call

            agent, result = stopped.raw

            async def resume() -> Any:
                with self.client.run("support-bot", version="1.0", run_id=RUN_ID):
                    state = await settle_call(agent, result, timeout=120)
                    return await Runner.run(agent, state)

            outcome = self._openai(agent, asyncio.run(resume()))
        else:
            from pydantic_ai import DeferredToolResults

            agent, held = stopped.raw
            approve = DeferredToolResults(
                approvals={call.tool_call_id: True for call in held.output.approvals}
            )
            result = agent.run_sync(
                message_history=held.all_messages(), deferred_tool_results=approve
            )
            outcome = self._pydantic(agent, result)
        self.flush()
        return outcome

    def flush(self) -> None:
        if self.name == "pydantic_ai":
            delivered = asyncio.run(self.client.flush(timeout=60))
        else:
            delivered = self.client.flush(timeout=60)
        assert delivered, "the receipts were not delivered"

    def process(
        self,
        live_server: Any,
        api_key: str,
        spool: Path,
        grant: int,
        *,
        crash: bool = False,
        call_id: str | None = None,
        declared: str = "docs",
    ) -> tuple[int, Any]:
        """The agent run in a process of its own (killed after the refund if `crash`):
        its exit code and the JSON it printed last (or its standard error)."""
        if self.name == "pydantic_ai":
            from tests.sdk import pydantic_ai_agent

            assert declared == "docs", "pydantic-ai's agent process declares as the docs do"
            args = ("--crash",) if crash else ()
            call = call_id or self.call
            return pydantic_ai_agent.run(
                live_server.url, api_key, spool, self.ledger, *args, call=call
            )
        framework = "openai" if self.name == "openai_agents" else "langgraph"
        return agent_process(
            framework,
            live_server,
            api_key,
            spool,
            Provider(self.ledger),
            grant,
            crash=crash,
            call_id=call_id or self.call,
            declared=declared,
        )

    def in_doubt(self, code: int, out: Any) -> list[Any]:
        """The agent process stopped by a refund in doubt: the case each stop names (None
        where its framework does not say it)."""
        if self.name == "pydantic_ai":
            assert (code, out["outcome"]) == (3, "in_doubt"), out
            return [out["case"]]
        assert code == 0, out
        assert out["interrupted"] == ["refund"], "the call in doubt did not stop the agent"
        return list(out.get("cases", [None]))

    def pydantic_agent(self, **refund: Any) -> Any:
        from pydantic_ai import DeferredToolRequests
        from pydantic_ai.capabilities import Instrumentation
        from pydantic_ai.models.instrumented import InstrumentationSettings
        from tallybook.integrations.pydantic_ai import Effects, ToolEffect

        from tests.sdk import pydantic_ai_agent

        declared = cast(ToolEffect, {"kind": "payment", "target": "fakepay", **refund})
        return pydantic_ai_agent.agent(
            self.ledger,
            Effects(self.client, tools={"refund": declared}),
            Instrumentation(settings=InstrumentationSettings(tracer_provider=self.tracer)),
            output_type=[str, DeferredToolRequests],
        )

    def expected_spans(self) -> tuple[str, str] | None:
        """The span ids of the tool call and of the model request that asked for it, where
        this test holds the framework's spans (pydantic-ai's, kept in memory too)."""
        if self.exported is None:
            return None
        finished = self.exported.get_finished_spans()
        tool = next(s for s in finished if s.name == "execute_tool refund")
        asked = next(s for s in finished if s.name.startswith("chat "))  # the first request
        return _hex(tool), _hex(asked)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()

    def _graph(self, graph: Any, state: dict[str, Any]) -> Outcome:
        stops = [i.value for i in state.get("__interrupt__", ())]
        messages = state["messages"]
        return Outcome(
            output=None if stops else messages[-1].text,
            stopped=[value["tool"] for value in stops],
            cases=[value["case"] for value in stops],
            reasons=[value["reason"] for value in stops],
            answer=next((m.content for m in messages if m.type == "tool"), None),
            raw=(graph, state),
        )

    def _openai(self, agent: Any, result: Any) -> Outcome:
        stops = [item.tool_name for item in result.interruptions]
        outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
        return Outcome(
            output=None if stops else result.final_output,
            stopped=stops,
            cases=[None for _ in stops],
            reasons=[],
            answer=outputs[0] if outputs else None,
            raw=(agent, result),
        )

    def _pydantic(self, agent: Any, result: Any) -> Outcome:
        from pydantic_ai import DeferredToolRequests
        from pydantic_ai.messages import ModelRequest, ToolReturnPart

        answers = [
            part.content
            for message in result.all_messages()
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart) and part.outcome == "success"
        ]
        if isinstance(result.output, DeferredToolRequests):
            calls = result.output.approvals
            said = [result.output.metadata[call.tool_call_id]["tallybook"] for call in calls]
            return Outcome(
                output=None,
                stopped=[call.tool_name for call in calls],
                cases=[report["case"] for report in said],
                reasons=[report["reason"] for report in said],
                answer=answers[0] if answers else None,
                raw=(agent, result),
            )
        return Outcome(result.output, [], [], [], answers[0] if answers else None, (agent, result))


def integration(
    name: str, ledger: Path, live_server: Any, api_key: str, client: Any
) -> Integration:
    """The adapter of integration `name`, its agent's provider keeping `ledger`; `client` is
    a Tallybook (an AsyncTallybook for pydantic-ai) of the live server."""
    if name == "langgraph":
        return Integration(
            name,
            order=7,
            call=CALL_ID,
            agent="support",
            keys={"docs": KEY, "default": DEFAULT_KEY},
            external_id="re_7_1",
            receipt_data={"result": '{"id": "re_7_1"}'},
            output="Done.",
            answer='{"id": "re_7_1"}',
            ledger=ledger,
            client=client,
        )
    if name == "openai_agents":
        from agents import set_tracing_disabled

        # The framework's own tracing would export to its vendor: offline, it records nothing.
        set_tracing_disabled(True)
        return Integration(
            name,
            order=7,
            call=CALL_ID,
            agent="support",
            keys={"docs": KEY, "default": DEFAULT_KEY},
            external_id="re_7_1",
            receipt_data={"result": {"id": "re_7_1"}},
            output="Done.",
            answer={"id": "re_7_1"},
            ledger=ledger,
            client=client,
            reports_case=False,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.sdk import pydantic_ai_agent

    # pydantic-ai's spans, sent to the live server as they end, and kept here to compare.
    memory = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(memory))
    exporter = OTLPSpanExporter(
        endpoint=f"{live_server.url}/v1/traces", headers={"Authorization": f"Bearer {api_key}"}
    )
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    refund = {"refund_id": "re_42", "order": 42}
    # The docs' first example declares no key: the run, the tool and the arguments' fingerprint.
    return Integration(
        name,
        order=42,
        call=pydantic_ai_agent.CALL,
        agent="refunds",
        keys={"docs": default_key("refund", RUN_ID, {"order": 42})},
        external_id="re_42",
        receipt_data={"result": refund},
        output="Refunded: re_42",
        answer=refund,
        ledger=ledger,
        client=client,
        tracer=tracer,
        exported=memory,
        closers=[tracer.shutdown],
    )


def _hex(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["openai", "langgraph"])
    for name in ("--url", "--key", "--spool", "--ledger", "--grant", "--call-id", "--declared"):
        parser.add_argument(name, required=True)
    parser.add_argument("--crash", action="store_true")
    args = parser.parse_args(argv)
    provider = Provider(Path(args.ledger), crash=args.crash)
    tb = Tallybook(args.url, args.key, spool=args.spool, retries=2, backoff=0.05)
    try:
        if args.framework == "openai":
            from agents import set_tracing_disabled

            set_tracing_disabled(True)
            result = asyncio.run(
                openai_run(
                    openai_agent(provider, tb, int(args.grant), args.call_id, args.declared), tb
                )
            )
            interrupted = [item.tool_name for item in result.interruptions]
            print(json.dumps({"interrupted": interrupted, "output": result.final_output}))
        else:
            state = langgraph_run(
                langgraph_agent(provider, tb, int(args.grant), args.call_id, args.declared), tb
            )
            stops = [i.value for i in state.get("__interrupt__", ())]
            interrupted = [value["tool"] for value in stops]
            cases = [value["case_url"] for value in stops]
            output = state["messages"][-1].text
            print(json.dumps({"interrupted": interrupted, "cases": cases, "output": output}))
        return 0
    finally:
        tb.close()


if __name__ == "__main__":
    sys.exit(main())
