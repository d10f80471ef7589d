"""An agent process for the SDK tests: refunds one order through a fake payment provider.

The provider's ledger is a file: one line per refund it performed. `--crash` kills the
process with SIGKILL at a chosen point. Prints one JSON line saying what happened.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tallybook import EffectInDoubt, Tallybook
from tallybook.spool import Spool


def refund(ledger: Path, order: str) -> str:
    """The fake provider: performs the refund (appends to its ledger) and returns its id."""
    number = len(ledger.read_text().splitlines()) + 1
    with ledger.open("a") as f:
        f.write(f"{order}\n")
    return f"re_{order}_{number}"


def die_after_spooling_a_receipt() -> None:
    put = Spool.put

    def put_then_die(self: Spool, endpoint: str, body: dict[str, Any]) -> Any:
        entry = put(self, endpoint, body)
        if endpoint == "receipts":
            os.kill(os.getpid(), signal.SIGKILL)
        return entry

    Spool.put = put_then_die  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--key", "--spool", "--ledger", "--order"):
        parser.add_argument(name, required=True)
    parser.add_argument("--run", default="ticket-1")
    parser.add_argument("--crash", choices=["after-effect", "after-spool"])
    args = parser.parse_args()
    if args.crash == "after-spool":
        die_after_spooling_a_receipt()
    ledger = Path(args.ledger)
    ledger.touch()
    tb = Tallybook(args.url, args.key, spool=args.spool, retries=2, backoff=0.05)
    try:
        with tb.run("refund-bot", version="1.0", run_id=args.run):
            key = f"refund:{args.order}"
            with tb.effect(
                key, kind="payment", target="fakepay", request={"order": args.order, "amount": 1250}
            ) as fx:
                if fx.completed:
                    print(
                        json.dumps({"outcome": "completed", "external_id": fx.receipt.external_id})
                    )
                    return 0
                external_id = refund(ledger, args.order)
                if args.crash == "after-effect":
                    os.kill(os.getpid(), signal.SIGKILL)
                fx.receipt(system="fakepay", external_id=external_id)
        print(json.dumps({"outcome": "refunded", "external_id": external_id}))
        return 0
    except EffectInDoubt as report:
        print(json.dumps({"outcome": "in_doubt", "case": report.case_url, "reason": report.reason}))
        return 3
    finally:
        tb.close()
        # The SDK needs nothing but the standard library.
        assert "django" not in sys.modules


if __name__ == "__main__":
    sys.exit(main())
