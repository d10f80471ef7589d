"""What the API's front door costs to read a body: `authorize(schema=...)`'s parse and
validation of an intent, a receipt and a failure, in process (no database, no HTTP).

    .venv/bin/python benchmarks/api_parse.py [--rounds 7] [--calls 5000]

Times, in alternating rounds, the decorator's `_parse` of each body (what a request pays
between reading its body and calling its view) and, beside it, its parts: inbound's
`json_loads` alone and pydantic's `model_validate_json` alone. Prints the median µs per
call over the rounds. The intent carries what an agent's SDK sends (request arguments,
context, authority, amount, trace ids); two more have a non-ASCII target as the SDK's
`json.dumps` escapes it: an é (`\\u00e9`), and an emoji (a surrogate pair, `\\ud83d...`), the
case where each field is also checked for what PostgreSQL cannot store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.api_keys import _per_call  # noqa: E402

INTENT = {
    "key": "order-1234:refund",
    "kind": "payment",
    "target": "stripe",
    "request": {
        "order": 1234,
        "amount": "12.50",
        "lines": [{"sku": "a-1", "n": 1}, {"sku": "b-2", "n": 2}],
    },
    "replay": "idempotent",
    "timeout_s": 30,
    "run_id": "run-42",
    "tool_call_id": "call_abc123",
    "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "span_id": "b7ad6b7169203331",
    "worker": "worker-1",
    "context": {
        "workflow": "refund-bot",
        "workflow_version": "2.3",
        "model": "gpt-5",
        "agent": "refunder",
    },
    "authority": {"grant": 12},
    "amount": {"value": "12.50", "currency": "EUR"},
}
RECEIPT = {
    "key": "order-1234:refund",
    "system": "stripe",
    "external_id": "re_1234",
    "observed_at": "2026-12-01T12:00:00+00:00",
    "data": {"id": "re_1234", "status": "succeeded"},
    "amount": {"value": "12.50", "currency": "EUR"},
    "attempt": 1,
}
FAILURE = {"key": "order-1234:refund", "error": "card_declined", "definitive": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durability.settings")
    import django

    django.setup()
    from django.test import RequestFactory
    from pydantic import BaseModel

    from durability.api import decorators
    from durability.api.schemas import FailureIn, IntentIn, ReceiptIn
    from durability.inbound import json_loads

    bodies: dict[str, tuple[type[BaseModel], bytes]] = {
        "intent": (IntentIn, json.dumps(INTENT).encode()),
        "intent, an é": (IntentIn, json.dumps({**INTENT, "target": "stripé"}).encode()),
        "intent, an emoji": (IntentIn, json.dumps({**INTENT, "target": "stripe 💳"}).encode()),
        "receipt": (ReceiptIn, json.dumps(RECEIPT).encode()),
        "failure": (FailureIn, json.dumps(FAILURE).encode()),
    }
    factory = RequestFactory()
    kinds: dict[str, Callable[[], object]] = {}
    for name, (schema, body) in bodies.items():
        request = factory.post("/", body, content_type="application/json")
        assert decorators._parse(request, body, schema) == schema.model_validate_json(body)

        def parse(request: object = request, body: bytes = body, schema: type = schema) -> object:
            return decorators._parse(request, body, schema)  # type: ignore[arg-type]

        def loads(body: bytes = body) -> object:
            return json_loads(body)

        def validate_json(body: bytes = body, schema: type[BaseModel] = schema) -> object:
            return schema.model_validate_json(body)

        kinds[f"{name}: _parse"] = parse
        kinds[f"{name}: json_loads alone"] = loads
        kinds[f"{name}: model_validate_json alone"] = validate_json
    for act in kinds.values():  # warm up
        _per_call(act, 200)
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, act in kinds.items():
            times[name].append(_per_call(act, args.calls))

    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sizes = ", ".join(f"{name} {len(body)}" for name, (_, body) in bodies.items())
    print(f"bodies (bytes): {sizes}; {args.rounds} rounds of {args.calls} calls")
    print(f"{'':48} {'median µs':>10}")
    for name in kinds:
        print(f"{name:48} {statistics.median(times[name]):10.1f}")


if __name__ == "__main__":
    main()
