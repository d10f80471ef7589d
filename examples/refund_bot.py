"""A refund bot made durable with Tallybook: run it twice and nothing is refunded twice.

    TALLYBOOK_URL=http://127.0.0.1:8000 TALLYBOOK_API_KEY=tb_... python examples/refund_bot.py

The payment provider is a fake that keeps its refunds in a JSON file (--provider-dir),
so you can see that a second run, or a run after a crash, repeats none of them.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tallybook import EffectDenied, EffectInDoubt, Tallybook

TICKETS = [("T-1001", "42", 1250), ("T-1002", "43", 990), ("T-1003", "44", 15000)]


class CardDeclined(Exception):
    """The provider refused: no money moved."""


@dataclass
class Refund:
    id: str
    order: str
    amount: int
    created: int


class FakePay:
    """A payment provider with a refund API and a ledger of what it did."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ledger = folder / "fakepay-refunds.json"

    def refunds(self) -> list[Refund]:
        rows = json.loads(self.ledger.read_text()) if self.ledger.exists() else []
        return [Refund(**row) for row in rows]

    def refund(self, order: str, amount: int) -> Refund:
        if amount > 10000:
            raise CardDeclined(f"refunds over 100.00 need a manager (order {order})")
        refund = Refund("re_" + secrets.token_hex(6), order, amount, int(time.time()))
        self.ledger.write_text(json.dumps([asdict(r) for r in [*self.refunds(), refund]]))
        return refund


def refund_order(tb: Tallybook, pay: FakePay, order: str, amount: int) -> str:
    """Refund an order once, whatever happens to this process; returns the refund's id."""
    with tb.effect(
        f"refund:{order}",
        kind="payment",
        target="fakepay",
        request={"order": order, "amount": amount},
        replay="never",
        timeout_s=30,
        definitive_on=(CardDeclined,),
    ) as fx:
        if fx.completed:
            return str(fx.receipt.external_id)  # refunded before, maybe by a crashed run
        refund = pay.refund(order, amount)
        fx.receipt(system="fakepay", external_id=refund.id, observed_at=refund.created)
        return refund.id


def main() -> None:
    parser = argparse.ArgumentParser(description="A durable refund bot")
    parser.add_argument("--provider-dir", type=Path, default=Path(".tallybook-example"))
    pay = FakePay(parser.parse_args().provider_dir)
    with Tallybook() as tb:
        for ticket, order, amount in TICKETS:
            # One run per ticket: a restarted bot resumes the same run.
            with tb.run("refund-bot", version="2.3.0", run_id=ticket):
                try:
                    print(f"{ticket}: refunded, receipt {refund_order(tb, pay, order, amount)}")
                except CardDeclined as declined:
                    print(f"{ticket}: declined, nothing refunded: {declined}")
                except (EffectInDoubt, EffectDenied) as report:
                    # The interruption report: a person settles the case, then the bot resumes.
                    print(f"{ticket}: stopped. {report}")
    print(f"fakepay has made {len(pay.refunds())} refund(s) in all")


if __name__ == "__main__":
    main()
