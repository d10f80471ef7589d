"""Issue 13's table in one run: every figure measured side by side, then printed as
figure | now | goal, with the machine's facts and its load average at the start and the end.

    .venv/bin/python benchmarks/run_all.py [--scale small|full] [--rounds N] [--check-plans]

`small` (about five minutes on two cores) measures the pages at 50,000 effects; `full` at
1,000,000 (the issue's figures; the data sets take minutes to build). --rounds is the number
of alternating rounds of the two comparisons (HTTP against raw psycopg, for the ledger and
for OTLP). --check-plans prints, after the pages' timings and on their data set, EXPLAIN
ANALYZE of the hot lookups: those an intent and its receipt make through the API (the API
key, the effect by project and key, for a new key and for an existing one, the receipt
lookups), and the queue's and the overview's queries. It prints plans, it asserts nothing;
meant with --scale full. Each figure comes from its own script's `measure()` (or `build()`),
which that script's command line runs too. The databases are named --db-prefix and the
benchmark (`tb_run_all_ledger`, ...), dropped and created again, so that a run of one
script beside it keeps its own.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psycopg

# The benchmarks beside this script (its folder is first on sys.path).
server = importlib.import_module("server")
ledger = importlib.import_module("ledger_http_vs_psycopg")
otlp_ingest = importlib.import_module("otlp_ingest")
dbos_anchor = importlib.import_module("dbos_anchor")
queue_page = importlib.import_module("queue_page")
overview_page = importlib.import_module("overview_page")
authority = importlib.import_module("authority")

SCALES: dict[str, dict[str, int]] = {
    "small": {
        "pairs": 800,
        "light": 300,
        "batches": 48,
        "effects": 50_000,
        "open": 1_000,
        "queue_repeat": 10,
        "overview_repeat": 10,
        "report_repeat": 5,
        "rounds": 2,
    },
    "full": {
        "pairs": 4000,
        "light": 2000,
        "batches": 240,
        "effects": 1_000_000,
        "open": 10_000,
        "queue_repeat": 40,
        "overview_repeat": 20,
        "report_repeat": 10,
        "rounds": 4,
    },
}
# The goals, by figure.
GOALS = {
    "ledger": "≥ 0.65",
    "batched": "≥ 0.85",
    "cpu": "≤ 1.5×",
    "intent": "p50 ≤ 2.2 ms, p99 ≤ 5 ms, ahead of DBOS's step",
    "receipt": "p50 ≤ 2 ms",
    "otlp": "≥ 0.6",
    "overview": "≤ 150 ms",
    "report": "≤ 200 ms",
    "queue": "p95 ≤ 60 ms",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _load() -> str:
    return " ".join(f"{n:.2f}" for n in os.getloadavg())


def _machine() -> str:
    with psycopg.connect(f"{queue_page.PG}/postgres") as conn:
        version, fsync, commit = (
            conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit")
        )
    return (
        f"cores: {os.cpu_count()}, PostgreSQL {version} (fsync {fsync}, synchronous_commit "
        f"{commit}), Python {sys.version.split()[0]}"
    )


def _in_child(function: Callable[..., Any], **kwargs: Any) -> Any:
    """`function(**kwargs)` in a fresh process: Django is set up once per process, on one
    database, and each data set has its own."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(function, **kwargs).result()


def _check_plans(client: Any, pages: list[str]) -> None:
    """Print the plans of the hot lookups, and of the queries of `pages`, on the data set
    Django is set up on (its keys are bench:<n>)."""
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    out = io.StringIO()
    call_command("createapikey", "bench", stdout=out)
    headers = {"Authorization": f"Bearer {out.getvalue().strip().splitlines()[-1]}"}
    bodies = {
        "/api/v1/intents": {"key": "plans:1", "kind": "payment", "target": "stripe"},
        "/api/v1/receipts": {"key": "plans:1", "system": "stripe", "external_id": "re_plans"},
    }
    durability = tuple(
        f"durability_{table}"
        for table in ("apikey", "effect", "receipt", "case", "attempt", "auditentry")
    )
    for path, body in bodies.items():
        with CaptureQueriesContext(connection) as captured:
            response = client.post(
                path, json.dumps(body), content_type="application/json", headers=headers
            )
        assert response.status_code == 201, (path, response.status_code, response.content)
        print(f"\n== POST {path} (a new key): {len(captured)} statements")
        queue_page.explain_captured(captured.captured_queries, durability)
        for label, key in [("exists", "bench:1"), ("was never recorded", "absent:1")]:
            same = [
                {"sql": q["sql"].replace("'plans:1'", f"'{key}'")}
                for q in captured.captured_queries
                if "'plans:1'" in q["sql"]
            ]
            print(f"\n== the same lookups for a key that {label} ({len(same)})")
            queue_page.explain_captured(same, durability)
    for path in pages:
        queue_page.explain(client, path, durability)


def _pages(
    db: str,
    effects: int,
    open_cases: int,
    queue_repeat: int,
    overview_repeat: int,
    check_plans: bool,
) -> dict[str, Any]:
    """The queue's and the overview's figures on the queue benchmark's data set."""
    data = queue_page.build(db, effects, open_cases)
    from django.test import Client

    client = Client()
    client.force_login(data["operator"])
    queue = queue_page.measure(client, queue_repeat)
    overview = overview_page.measure(client, overview_repeat)
    if check_plans:
        print(f"\n==== on the queue's data set ({effects:,} effects, {open_cases:,} open cases)")
        _check_plans(client, ["/queue/", "/queue/?workflow=refund-bot", "/"])
    everything = [t for times in queue.values() for t in times]
    medians = [statistics.median(times) for _, times in overview.values()]
    return {
        "queue_p95": queue_page._p95(everything),
        "workflow_median": statistics.median(queue["workflow=refund-bot"]),
        "worst_filter": max(queue, key=lambda label: queue_page._p95(queue[label])),
        "worst_p95": max(queue_page._p95(times) for times in queue.values()),
        "overview_min": min(medians),
        "overview_max": max(medians),
        "overview_queries": sorted({queries for queries, _ in overview.values()}),
    }


def _report(db: str, effects: int, repeat: int, check_plans: bool) -> dict[str, Any]:
    """The authority report's figures on the authority benchmark's data set (the one with
    receipts: 60% of its effects have one)."""
    data = authority.build(db, effects)
    times = authority.report_measure(data, repeat)
    if check_plans:
        from django.test import Client

        client = Client()
        client.force_login(data["operator"])
        print(f"\n==== on the authority report's data set ({effects:,} effects, with receipts)")
        _check_plans(client, ["/authority/audit/"])
    return {label: statistics.median(t) for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--rounds", type=int, help="alternating rounds (small 2, full 4)")
    parser.add_argument("--clients", type=int, default=8, help="ledger client processes")
    parser.add_argument(
        "--workers", type=int, default=server.deployed("--workers"), help="granian workers"
    )
    parser.add_argument("--check-plans", action="store_true", help="print the hot plans")
    parser.add_argument("--db-prefix", default="tb_run_all_", help="of the databases' names")
    options = parser.parse_args()
    scale = SCALES[options.scale]
    rounds = options.rounds or scale["rounds"]

    started, load_start = datetime.now(UTC), _load()
    print(f"issue 28's figures, scale {options.scale}, {rounds} alternating rounds")
    print(_machine())
    print(f"load average at the start (1, 5, 15 min): {load_start}", flush=True)

    clock = time.perf_counter()
    pairs = ledger.measure(
        pairs=scale["pairs"],
        clients=options.clients,
        workers=options.workers,
        rounds=rounds,
        light=scale["light"],
        db=f"{options.db_prefix}ledger",
    )
    print(f"ledger measured in {time.perf_counter() - clock:.0f}s", flush=True)
    # In a child: DBOS's threads and its engine end with it.
    anchor = _in_child(dbos_anchor.measure, steps=scale["light"], db=f"{options.db_prefix}dbos")
    clock = time.perf_counter()
    spans = otlp_ingest.measure(
        batches=scale["batches"],
        clients=6,
        workers=options.workers,
        rounds=rounds,
        db=f"{options.db_prefix}otlp",
    )
    print(f"OTLP measured in {time.perf_counter() - clock:.0f}s", flush=True)
    clock = time.perf_counter()
    pages = _in_child(
        _pages,
        db=f"{options.db_prefix}queue",
        effects=scale["effects"],
        open_cases=scale["open"],
        queue_repeat=scale["queue_repeat"],
        overview_repeat=scale["overview_repeat"],
        check_plans=options.check_plans,
    )
    print(f"queue and overview measured in {time.perf_counter() - clock:.0f}s", flush=True)
    clock = time.perf_counter()
    report = _in_child(
        _report,
        db=f"{options.db_prefix}authority",
        effects=scale["effects"],
        repeat=scale["report_repeat"],
        check_plans=options.check_plans,
    )
    print(f"authority report measured in {time.perf_counter() - clock:.0f}s", flush=True)

    effects = f"{scale['effects']:,}"
    rows = [
        (
            f"intent+receipt pairs over HTTP, {options.clients} clients, granian "
            f"{options.workers} workers, vs raw psycopg ({pairs['pairs']} pairs each)",
            f"{pairs['http_rate']:.0f} vs {pairs['raw_rate']:.0f} effects/s: "
            f"{pairs['http_rate'] / pairs['raw_rate']:.2f}",
            GOALS["ledger"],
        ),
        (
            f"the same, receipts in batches of {pairs['batch']} (as the SDK sends a spool), "
            "vs raw one transaction per write",
            f"{pairs['batched_rate']:.0f} vs {pairs['raw_rate']:.0f} effects/s: "
            f"{pairs['batched_rate'] / pairs['raw_rate']:.2f}",
            GOALS["batched"],
        ),
        (
            "core ms per effect, server + PostgreSQL + clients, HTTP (batched) vs raw",
            f"{ledger._all(pairs['http_cpu']):.2f} ({ledger._all(pairs['batched_cpu']):.2f}) vs "
            f"{ledger._all(pairs['raw_cpu']):.2f}: "
            f"{ledger._all(pairs['http_cpu']) / ledger._all(pairs['raw_cpu']):.2f}× "
            f"({ledger._all(pairs['batched_cpu']) / ledger._all(pairs['raw_cpu']):.2f}×)",
            GOALS["cpu"],
        ),
        (
            f"POST /intents at light load (one client, keep-alive, {pairs['light']}); "
            "DBOS step checkpoint in process, same PostgreSQL",
            f"p50 {_ms(pairs['intent_p50'])}, p99 {_ms(pairs['intent_p99'])}; DBOS p50 "
            f"{_ms(anchor['step_p50'])}, p99 {_ms(anchor['step_p99'])}",
            GOALS["intent"],
        ),
        (
            "POST /receipts at light load",
            f"p50 {_ms(pairs['receipt_p50'])} (p99 {_ms(pairs['receipt_p99'])})",
            GOALS["receipt"],
        ),
        (
            f"OTLP/protobuf spans, batches of 512, vs raw executemany ({spans['spans']:,} "
            "spans each; raw's row preparation timed, and not)",
            f"{spans['http_rate']:.0f} vs {spans['timed_rate']:.0f} spans/s: "
            f"{spans['http_rate'] / spans['timed_rate']:.2f} (vs {spans['raw_rate']:.0f}: "
            f"{spans['http_rate'] / spans['raw_rate']:.2f})",
            GOALS["otlp"],
        ),
        (
            f"overview at {effects} effects (4 chart ranges)",
            f"median {_ms(pages['overview_min'])}–{_ms(pages['overview_max'])}, "
            f"{'/'.join(map(str, pages['overview_queries']))} queries",
            GOALS["overview"],
        ),
        (
            f"authority report at {effects} effects over 7 days",
            f"median {_ms(report['report, last 7 days'])}",
            GOALS["report"],
        ),
        (
            f"queue page, {scale['open']:,} open cases over {effects} effects, every filter",
            f"p95 {_ms(pages['queue_p95'])} (workflow filter {_ms(pages['workflow_median'])} "
            f"median; worst p95 {_ms(pages['worst_p95'])}, {pages['worst_filter']})",
            GOALS["queue"],
        ),
    ]
    wide = [max(len(row[i]) for row in rows) for i in range(2)]
    print(f"\n| {'figure':<{wide[0]}} | {'now':<{wide[1]}} | goal |")
    print(f"|{'-' * (wide[0] + 2)}|{'-' * (wide[1] + 2)}|---|")
    for figure, now, goal in rows:
        print(f"| {figure:<{wide[0]}} | {now:<{wide[1]}} | {goal} |")
    print(f"\nverifyaudit after the ledger benchmark: {pairs['verifyaudit']}")
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {(datetime.now(UTC) - started).seconds / 60:.1f} min; "
        f"load average (1, 5, 15 min) at the start {load_start}, at the end {_load()}"
    )
    if not pairs["verifyaudit_ok"]:
        raise SystemExit("the HTTP project's audit chain does not hold")


if __name__ == "__main__":
    main()
