"""A tool-calling agent whose tools are made durable by a decorator.

    TALLYBOOK_URL=http://127.0.0.1:8000 TALLYBOOK_API_KEY=tb_... python examples/tool_agent.py

No model is needed: a scripted "model" answers with the tool calls a real one would
make. Each tool records its effect under a key made from its arguments; run the agent
again and every call answers from its stored receipt instead of sending twice.
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from tallybook import EffectInDoubt, Receipt, Tallybook

tb = Tallybook()  # TALLYBOOK_URL and TALLYBOOK_API_KEY from the environment

# What the model asked for, as (tool_call_id, tool, arguments).
PLAN: list[tuple[str, str, dict[str, Any]]] = [
    ("call_1", "create_invoice", {"customer": "acme", "cents": 48000}),
    ("call_2", "send_email", {"to": "billing@acme.example", "subject": "Your invoice"}),
]


class Outbox:
    """The fake provider behind both tools: a file with one line per message it sent."""

    path = Path(".tallybook-example") / "outbox.jsonl"

    @classmethod
    def send(cls, kind: str, message: dict[str, object]) -> str:
        message_id = f"{kind}_{secrets.token_hex(4)}"
        cls.path.parent.mkdir(parents=True, exist_ok=True)
        with cls.path.open("a") as outbox:
            outbox.write(json.dumps({"id": message_id, **message}) + "\n")
        return message_id


@tb.tool("email:{to}:{subject}", kind="email", target="fakesmtp", replay="never")
def send_email(to: str, subject: str) -> Receipt:
    message_id = Outbox.send("msg", {"to": to, "subject": subject})
    return Receipt(system="fakesmtp", external_id=message_id, data={"to": to})


# One invoice per customer and month: the key is a function of the arguments.
@tb.tool(
    lambda customer, cents: f"invoice:{customer}:{date.today():%Y-%m}",
    kind="invoice",
    target="fakebill",
)
def create_invoice(customer: str, cents: int) -> Receipt:
    invoice_id = Outbox.send("inv", {"customer": customer, "cents": cents})
    return Receipt(system="fakebill", external_id=invoice_id, data={"cents": cents})


TOOLS: dict[str, Callable[..., Receipt]] = {
    "send_email": send_email,
    "create_invoice": create_invoice,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="A durable tool-calling agent")
    parser.add_argument("--conversation", default="conv-1")
    parser.add_argument("--provider-dir", type=Path, default=Outbox.path.parent)
    args = parser.parse_args()
    Outbox.path = args.provider_dir / "outbox.jsonl"
    with (
        tb.run("billing-agent", version="1.4.0", run_id=args.conversation),
        tb.context(model="scripted-model-1", tools={"send_email": "1", "create_invoice": "1"}),
    ):
        for call_id, name, arguments in PLAN:
            try:
                with tb.context(tool_call_id=call_id):
                    receipt = TOOLS[name](**arguments)
            except EffectInDoubt as report:
                print(f"{call_id} {name}: stopped. {report}")
                break
            # What goes back to the model as the tool's result.
            print(f"{call_id} {name}: {receipt.system} {receipt.external_id}")
    tb.close()


if __name__ == "__main__":
    main()
