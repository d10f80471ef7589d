"""What authenticating an API key costs: a key this process has cached (the keys version's
primary-key read) against one it has not (the key, its project and the version by digest,
the lookup every request made before keys were cached), side by side in alternating rounds.

    .venv/bin/python benchmarks/api_keys.py [--rounds 7] [--calls 2000] [--db tb_bench_keys]

Creates (dropping it first) the PostgreSQL database named by --db and migrates it. Each round
times --calls authentications of each kind, in process, and --calls authenticated requests
(`GET /api/v1/effects?key=…`, a 404, through Django's test client) with the key cached and
not; it prints the medians over the rounds, their ratio and the statements each makes.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.queue_page import PG, _fresh_database  # noqa: E402


def _per_call(act: Callable[[], object], calls: int) -> float:
    """Microseconds per call of `act`."""
    start = time.perf_counter()
    for _ in range(calls):
        act()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--db", default="tb_bench_keys")
    args = parser.parse_args()

    _fresh_database(args.db)
    os.environ["DATABASE_URL"] = f"{PG}/{args.db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durability.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from durability.models import ApiKey, Project, keys

    call_command("migrate", verbosity=0)
    logging.getLogger("django.request").setLevel(logging.ERROR)  # each request is a 404
    _, raw = ApiKey.issue(Project.objects.create(name="bench"))
    client = Client(headers={"Authorization": f"Bearer {raw}"})

    def cached() -> object:
        return ApiKey.authenticate(raw)

    def looked_up() -> object:
        keys._authenticated.clear()
        return ApiKey.authenticate(raw)

    def request_cached() -> object:
        return client.get("/api/v1/effects", {"key": "nope"}, secure=True)

    def request_looked_up() -> object:
        keys._authenticated.clear()
        return request_cached()

    kinds = {
        "authenticate, cached": cached,
        "authenticate, looked up": looked_up,
        "request, key cached": request_cached,
        "request, key looked up": request_looked_up,
    }
    assert request_cached().status_code == 404  # type: ignore[attr-defined]
    for act in kinds.values():  # warm up, and last_used_at written
        _per_call(act, 50)
    statements = {}
    for name, act in kinds.items():
        with CaptureQueriesContext(connection) as captured:
            act()
        statements[name] = len(captured.captured_queries)
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, act in kinds.items():
            times[name].append(_per_call(act, args.calls))

    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'':26} {'median µs':>10} {'statements':>10}")
    for name in kinds:
        print(f"{name:26} {statistics.median(times[name]):10.0f} {statements[name]:10}")
    for cached_name, looked_up_name in zip(list(kinds)[::2], list(kinds)[1::2], strict=True):
        ratio = statistics.median(times[looked_up_name]) / statistics.median(times[cached_name])
        print(f"{looked_up_name} / {cached_name.split(', ')[1]}: {ratio:.2f}")


if __name__ == "__main__":
    main()
