"""A pydantic-ai refund agent on FunctionModel, for tests/sdk/test_integrations.py:
the model asks for `refund(order=42)` as tool call CALL, and says what came of it.

As an agent process (run(), or this file run as a script) it can be killed mid-effect
(--crash) and run again, plainly or inside a DBOS workflow (--dbos SYSTEM_DATABASE_URL); it
prints one JSON line and exits 0 (done), 3 (in doubt).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

# The model's id for the call; a restarted agent's model gives the same call a new one.
CALL = "call_refund_42"  # run() names another for a process of its own
CONVERSATION = "ticket-7"


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answers = [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_call_id == CALL
    ]
    if not answers:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": 42}, tool_call_id=CALL)])
    answer = answers[-1]
    if answer.outcome != "success":
        return ModelResponse(parts=[TextPart(f"Could not refund: {answer.content}")])
    content: Any = answer.content
    refund_id = content["refund_id"] if isinstance(content, dict) else content
    return ModelResponse(parts=[TextPart(f"Refunded: {refund_id}")])


def agent(
    ledger: Path, *capabilities: AbstractCapability[Any], output_type: Any, crash: bool = False
) -> Agent[None, Any]:
    """The refund agent; its fakepay provider appends each refunded order to `ledger`."""
    refunds: Agent[None, Any] = Agent(
        FunctionModel(_model),
        name="refunds",
        capabilities=list(capabilities),
        output_type=output_type,
    )

    @refunds.tool_plain
    def refund(order: int) -> dict[str, Any]:
        """Refund an order."""
        with ledger.open("a") as f:
            f.write(f"{order}\n")
            f.flush()
            os.fsync(f.fileno())
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before its receipt
        return {"refund_id": f"re_{order}", "order": order}

    return refunds


def run(
    url: str, key: str, spool: Path, ledger: Path, *args: str, call: str = CALL
) -> tuple[int, Any]:
    """This file's main() in an agent process of its own whose model names the call `call`:
    its exit code and the JSON line it printed. The process is forked from the forkserver that
    has imported pydantic-ai and DBOS once per test process (tests/sdk/agents_support.py's
    agent processes'), not started from scratch: each import takes a second."""
    from tests.sdk.agents_support import forked

    return forked(_called, [call, url, key, str(spool), str(ledger), *args])


def _called(argv: list[str]) -> int:
    """main(argv[1:]), the model naming the call argv[0]."""
    global CALL
    CALL = argv[0]
    return main(argv[1:])


def main(argv: list[str] | None = None) -> int:
    from tallybook import AsyncTallybook, EffectInDoubt
    from tallybook.integrations.pydantic_ai import Effects

    parser = argparse.ArgumentParser()
    for name in ("url", "key", "spool", "ledger"):
        parser.add_argument(name)
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--dbos", metavar="SYSTEM_DATABASE_URL")
    options = parser.parse_args(argv)
    tb = AsyncTallybook(options.url, options.key, spool=options.spool, retries=2, backoff=0.05)
    effects = Effects(
        tb, tools={"refund": {"kind": "payment", "target": "fakepay", "receipt": "refund_id"}}
    )
    capabilities: list[AbstractCapability[Any]] = [effects]
    if options.dbos:
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        capabilities.append(DBOSDurability())
    refunds = agent(Path(options.ledger), *capabilities, output_type=str, crash=options.crash)

    async def ticket() -> str:
        result = await refunds.run("Refund order 42", conversation_id=CONVERSATION)
        return str(result.output)

    try:
        output = _in_dbos(ticket, options.dbos) if options.dbos else asyncio.run(ticket())
    except EffectInDoubt as report:
        print(json.dumps({"outcome": "in_doubt", "case": report.case_url}))
        return 3
    print(json.dumps({"outcome": "done", "output": output}))
    return 0


def _in_dbos(ticket: Any, system_database_url: str) -> str:
    """Run the ticket as DBOS workflow CONVERSATION: launched again after a crash, DBOS
    recovers it from its last completed step."""
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "refunds", "system_database_url": system_database_url})

    @DBOS.workflow(name="refund_ticket")
    async def refund_ticket() -> str:
        return str(await ticket())

    async def launched() -> str:
        DBOS.launch()
        with SetWorkflowID(CONVERSATION):
            handle = await DBOS.start_workflow_async(refund_ticket)
        return str(await handle.get_result())

    try:
        return asyncio.run(launched())
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    sys.exit(main())
