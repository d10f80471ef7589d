"""One agent of benchmarks/faults.py: refunds through a fake provider, one key after another,
through the SDK alone (run with `python -S`, the SDK on PYTHONPATH).

The provider is the world: each refund it performs is a line `key external_id` appended
(and fsynced) to the world log, and it is the only record of what happened. Every 2xx (and
5xx) the server gave to an intent or a receipt is a line in this agent's ack log. Both are
written with os.write on O_APPEND descriptors: a crash (os._exit) loses neither.

The agent crashes on purpose now and then (after the intent, or after the refund and
before its receipt); its supervisor starts it again and it resumes the key it was on
(its progress file), asking the provider when the server says the effect is in doubt.
It stops, after finishing its key, once the stop file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from tallybook import (
    EffectInDoubt,
    IntentNotRecorded,
    Receipt,
    Tallybook,
    TallybookError,
)
from tallybook import transport as tb_transport

CRASHED = 70  # the exit code of a planned crash: the supervisor starts the agent again


class Log:
    """Lines appended with one write(2) each: whole lines, whatever kills the process."""

    def __init__(self, path: Path, *, durable: bool = False) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.durable = durable

    def line(self, text: str) -> None:
        os.write(self.fd, (text + "\n").encode())
        if self.durable:
            os.fsync(self.fd)


def world_has(world: Path, key: str) -> str | None:
    """The provider's answer: the external id of the refund made for `key`, if any."""
    for line in world.read_text().splitlines():
        done_key, _, external_id = line.partition(" ")
        if done_key == key:
            return external_id
    return None


def acks_logged(ack_log: Log) -> None:
    """Log each 2xx and 5xx the server gives an intent or a receipt: the SDK's transport,
    wrapped beneath its retries, so every answer is seen."""
    exchange = tb_transport.Transport._exchange

    def logged(self: Any, method: str, path: str, payload: bytes | None, timeout: float) -> Any:
        answer = exchange(self, method, path, payload, timeout)
        status, endpoint = answer[0], path.rsplit("/", 1)[-1]
        answered = 200 <= status < 300 or status >= 500
        if method == "POST" and endpoint in ("intents", "receipts") and answered and payload:
            body = json.loads(payload)
            entry = {"endpoint": endpoint, "key": body["key"], "status": status}
            if endpoint == "receipts":
                entry["external_id"] = body["external_id"]
            ack_log.line(json.dumps(entry))
        return answer

    tb_transport.Transport._exchange = logged  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--key", "--grant", "--name", "--dir", "--world", "--stop"):
        parser.add_argument(name, required=True)
    parser.add_argument("--crash", type=float, default=0.05, help="chance of each crash point")
    args = parser.parse_args()
    home = Path(args.dir)
    progress = home / "progress"
    world, stop = Path(args.world), Path(args.stop)
    world_log = Log(world, durable=True)
    acks_logged(Log(home / "acks.jsonl"))
    outcomes = Log(home / "outcomes")
    rng = random.Random()
    tb = Tallybook(args.url, args.key, spool=home / "spool", timeout=5, retries=3, intent_budget=10)

    def ask_provider(report: EffectInDoubt) -> Receipt | None:
        external_id = world_has(world, report.key)
        return Receipt(system="fakepay", external_id=external_id) if external_id else None

    n = int(progress.read_text()) if progress.exists() else 0
    while not (stop.exists() and not progress.exists()):
        progress.write_text(str(n))
        key = f"{args.name}:{n}"
        try:
            with (
                tb.run("fault-agent", version="1", run_id=key),
                tb.effect(
                    key,
                    kind="payment",
                    target="fakepay",
                    request={"order": key, "amount": 1250},
                    replay="reconcile",
                    timeout_s=60,
                    authority={"grant": int(args.grant)},
                    on_in_doubt=ask_provider,
                ) as fx,
            ):
                if fx.completed:
                    outcomes.line(f"{key} completed")
                else:
                    if rng.random() < args.crash:
                        os._exit(CRASHED)  # after the intent, before the refund
                    external_id = f"re_{key}_{os.getpid()}"
                    world_log.line(f"{key} {external_id}")
                    if rng.random() < args.crash:
                        os._exit(CRASHED)  # after the refund, before its receipt
                    fx.receipt(system="fakepay", external_id=external_id)
                    outcomes.line(f"{key} refunded")
        except IntentNotRecorded:
            time.sleep(0.5)  # the server is away: nothing was done; the same key again
            continue
        except EffectInDoubt as report:
            # The provider has no refund for it: it did not happen; a person would release it.
            outcomes.line(f"{key} in_doubt {report.reason}")
        except TallybookError as error:
            outcomes.line(f"{key} error {error!r}")
        n += 1
        if stop.exists():
            progress.unlink()
        else:
            time.sleep(rng.uniform(0, 0.1))
    # Every receipt spooled while the server was away must reach it before we go.
    delivered = tb.flush(timeout=120)
    tb.close()
    assert "django" not in sys.modules
    return 0 if delivered else 1


if __name__ == "__main__":
    sys.exit(main())
