"""Server time of the search page at 1,000,000 effects and 10,000 open cases.

    .venv/bin/python benchmarks/search_page.py [--effects 1000000] [--open 10000] [--repeat 30]

Builds the queue benchmark's data set (benchmarks/queue_page.py: `build`, with requests that
name a customer and a ticket) in the database named by --db, adds a receipt to every
effect that succeeded (an external id like `re_<14 hex>`) and 50,000 runs (the effects'
run ids) with a trace each, vacuumed and analyzed as autovacuum leaves them; then requests
`/search/?q=` through Django's test client with a logged-in operator, for each kind of
text an operator types, and prints the median and p95 of the server time (view, queries
and template; no network) and the queries of one request. --explain prints the plans.
--keep keeps the database (dropped by default).

2026-12-01 16:47 UTC, the defaults, a shared 2-core machine (load average 2.9 at the start,
0.1 at the end): median 5.9-25.6 ms per text, p95 at most 28.9 ms (the customer's, whose 50
effects have cases to find); all requests median 10.8 ms, p95 25.2 ms. 10-13 queries each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.queue_page import (  # noqa: E402
    AGENTS,
    PG,
    WORKFLOWS,
    _insert_select,
    _p95,
    _time,
    build,
    bulk,
    explain,
)

RUNS = 50_000
# Every effect's request names one of 20,000 customers and one of 90,000 tickets.
REQUEST = (
    "jsonb_build_object('order', g, 'amount', 1250 + g %% 500, "
    "'customer', 'customer' || (g %% 20000) || '@example.com', "
    "'note', 'refund for ticket T-' || (g %% 90000))"
)


def _fill_search(project: Any) -> None:
    """Receipts of the succeeded effects, the runs their run ids name, a trace per run."""
    from django.db import connection, transaction

    from durability.models import Effect, Receipt
    from trajectories.models import Run, RunTrace

    effects = f"{Effect._meta.db_table} e WHERE e.project_id = {project.pk} "
    receipt_sql, receipt_params = _insert_select(
        Receipt,
        effects + "AND e.state = 'succeeded'",
        {
            "project_id": "e.project_id",
            "effect_id": "e.id",
            "key": "e.key",
            "system": "e.target",
            "external_id": "'re_' || substr(md5(e.id::text), 1, 14)",
            "observed_at": "e.created",
            "received": "e.created",
        },
    )
    run_sql, run_params = _insert_select(
        Run,
        "generate_series(0, %s) AS g",
        {
            "project_id": str(project.pk),
            "run_id": "'run-' || g",
            "agent": f"(ARRAY{AGENTS!r})[1 + g %% {len(AGENTS)}]",
            "workflow": f"(ARRAY{WORKFLOWS!r})[1 + g %% {len(WORKFLOWS)}]",
            "status": "'ok'",
            "started": "now() - make_interval(secs => g * 20)",
            "updated": "now()",
        },
    )
    trace_sql, trace_params = _insert_select(
        RunTrace,
        f"{Run._meta.db_table} r WHERE r.project_id = {project.pk}",
        {"project_id": "r.project_id", "trace_id": "md5('trace' || r.run_id)", "run_id": "r.id"},
    )
    tables = [model._meta.db_table for model in (Receipt, Run, RunTrace)]
    with transaction.atomic(), bulk(tables), connection.cursor() as cursor:
        cursor.execute(receipt_sql, receipt_params)
        cursor.execute(run_sql, [*run_params, RUNS - 1])
        cursor.execute(trace_sql, trace_params)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _texts(project: Any, effects: int) -> dict[str, str]:
    """What an operator types, by kind, with values the data set holds."""
    from durability.models import Receipt
    from trajectories.models import RunTrace

    n = max(int(effects * 0.424242), 100)
    receipt = Receipt.objects.get(project=project, key=f"bench:{n - 1}")
    trace = RunTrace.objects.get(project=project, run__run_id="run-4242")
    return {
        "whole key": f"bench:{n}",
        "part of a key (11 keys)": f"bench:{n // 10}",
        "whole external id": receipt.external_id,
        "part of an external id": receipt.external_id[3:11],
        "a customer (1 in 20,000)": "customer4242@",
        "a ticket (1 in 90,000)": "T-42424",
        "text in every request": "example.com",
        "a target (1 in 5)": "k8s",
        "an agent (1 in 4)": "refunder",
        "a reason": "uncertain",
        "whole run id": "run-4242",
        "part of a trace id": trace.trace_id[:12],
        "two characters": "zz",
        "nothing matches": "qqqzzzxxx",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=10_000, help="open cases")
    parser.add_argument("--repeat", type=int, default=30, help="requests per text")
    parser.add_argument("--db", default="bench_search")
    parser.add_argument("--explain", action="store_true", help="print the query plans")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    data = build(args.db, args.effects, args.open, {"request": REQUEST})
    try:
        _measure(data, args)
    finally:
        if not args.keep:
            _drop(args.db)


def _measure(data: dict[str, Any], args: argparse.Namespace) -> None:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    _fill_search(data["project"])
    client = Client()
    client.force_login(data["operator"])
    print(
        f"{args.effects:,} effects, {args.open:,} open cases, {RUNS:,} runs, "
        f"{args.repeat} requests each"
    )
    print(f"{'text':<28} {'median ms':>10} {'p95 ms':>8} {'queries':>8}  found")
    everything = []
    for label, q in _texts(data["project"], args.effects).items():
        path = f"/search/?{urlencode({'q': q})}"
        times = _time(client, path, args.repeat)
        everything += times
        with CaptureQueriesContext(connection) as queries:
            html = client.get(path).content.decode()
        counts = [_count(html, kind) for kind in ("effects", "cases", "runs")]
        print(
            f"{label:<28} {statistics.median(times) * 1000:>10.1f} {_p95(times) * 1000:>8.1f} "
            f"{len(queries):>8}  {'/'.join(counts)}"
        )
    print(
        f"{'all requests':<28} {statistics.median(everything) * 1000:>10.1f} "
        f"{_p95(everything) * 1000:>8.1f}"
    )
    if args.explain:
        tables = ("durability_effect", "durability_receipt", "trajectories_run")
        for q in ("customer4242@", "example.com", "k8s", "T-42424"):
            explain(client, f"/search/?{urlencode({'q': q})}", tables)


def _count(html: str, kind: str) -> str:
    """The count a group's heading shows (`10+` when there are more)."""
    import re

    found = re.search(rf'id="found-{kind}-title">\w+ <span class="muted">([^<]*)</span>', html)
    return found[1] if found else "?"


def _drop(db: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
