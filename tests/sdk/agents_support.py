"""Agents of the framework integration tests: a support bot that refunds an order through a
fake payment provider, asked by each framework's test model to call its `refund` tool.

The provider's ledger is a file, one line per refund performed. Run as a script
(`python -m tests.sdk.agents_support FRAMEWORK ...`) it is an agent process: `--crash` kills it
with SIGKILL right after the refund, before the receipt; it prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tallybook import Tallybook
from tallybook.integrations._tool_calls import ToolEffect, default_key

from tests.sdk.support import ROOT

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
    the call `call_id`: its exit code, and the JSON it printed last (or its standard error)."""
    command = [sys.executable, "-m", "tests.sdk.agents_support", framework]
    command += ["--url", live_server.url, "--key", api_key, "--spool", str(spool)]
    command += ["--ledger", str(provider.ledger), "--grant", str(grant), "--call-id", call_id]
    command += ["--declared", declared]
    command += ["--crash"] if crash else []
    done = subprocess.run(
        command, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else done.stderr


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["openai", "langgraph"])
    for name in ("--url", "--key", "--spool", "--ledger", "--grant", "--call-id", "--declared"):
        parser.add_argument(name, required=True)
    parser.add_argument("--crash", action="store_true")
    args = parser.parse_args()
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
            interrupted = [i.value["tool"] for i in state.get("__interrupt__", ())]
            print(json.dumps({"interrupted": interrupted, "output": state["messages"][-1].text}))
        return 0
    finally:
        tb.close()


if __name__ == "__main__":
    sys.exit(main())
