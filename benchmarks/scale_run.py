"""A scale run: spans and effects over 90 days, retention, and what it costs while it runs.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/scale_run.py \
        [--spans 10000000] [--effects 1000000] [--days 90] [--db bench_scale] [--small]

Fills the database named by --db (dropped first) with the other benchmarks' fills, all
generate_series SQL but the audit chains (hashed in Python, sent by COPY): the queue
benchmark's effects with attempts and cases (benchmarks/queue_page.py), spread over --days
days; the payload benchmark's receipts and two audit entries per effect
(benchmarks/payload_retention.py); the span benchmark's spans, runs of 100, a partition a
day (benchmarks/span_retention.py). Then, and printed as it goes:

- the size of each table with its partitions and its indexes;
- OTLP ingest over HTTP (benchmarks/otlp_ingest.py's clients against granian on this
  database) and the server times of the queue and the overview (their benchmarks' requests)
  once before retention and once while `partitions_upkeep` runs in a thread, dropping the
  days past a 30-day retention;
- the upkeep's time, all told and per day dropped;
- payload retention (`payloads_prune`) of the effects older than --payload-days, its rate;
- the sizes again, and `verifyaudit`'s time over every chain.

--small is a preset (200,000 spans, 50,000 effects) to check the run end to end. The
database is dropped at the end unless --keep.
"""

from __future__ import annotations

import argparse
import importlib
import io
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

# The benchmarks beside this script (its folder is first on sys.path).
queue_page = importlib.import_module("queue_page")
overview_page = importlib.import_module("overview_page")
payload_retention = importlib.import_module("payload_retention")
span_retention = importlib.import_module("span_retention")
otlp_ingest = importlib.import_module("otlp_ingest")
server = importlib.import_module("server")

SPAN_DAYS = 30
SIZES = """
SELECT c.relname, sum(pg_table_size(t.oid)), sum(pg_indexes_size(t.oid)), count(*) - 1
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
    -- A plain table has no partition tree: itself.
    LATERAL (SELECT c.oid UNION SELECT relid FROM pg_partition_tree(c.oid)) t (oid)
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
GROUP BY c.relname
"""


def sizes() -> dict[str, tuple[int, int, int]]:
    """Each table's size and its indexes' (its partitions' summed), and its partitions."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(SIZES)
        return {name: (table, index, parts) for name, table, index, parts in cursor.fetchall()}


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def print_sizes(before: dict[str, tuple[int, int, int]], after: dict[str, Any]) -> None:
    """The tables of 1 MB or more, largest first, before and after retention."""
    print(f"{'table':<44} {'table, before':>14} {'indexes':>10} {'after':>10} {'indexes':>10}")
    total = [0, 0, 0, 0]
    for name, (table, index, parts) in sorted(before.items(), key=lambda t: -sum(t[1][:2])):
        later = after.get(name, (0, 0, 0))
        total = [total[0] + table, total[1] + index, total[2] + later[0], total[3] + later[1]]
        if table + index < 2**20:
            continue
        label = f"{name} ({parts}→{later[2]} parts)" if parts else name
        print(
            f"{label:<44} {_mb(table):>14} {_mb(index):>10} {_mb(later[0]):>10} {_mb(later[1]):>10}"
        )
    print(f"{'all tables':<44} {_mb(total[0]):>14} {_mb(total[1]):>10} ", end="")
    print(f"{_mb(total[2]):>10} {_mb(total[3]):>10}")


def ingest(port: int, key: str, tag: str, batches: int, clients: int) -> str:
    """Spans/s of `batches` OTLP batches sent by `clients` of otlp_ingest's clients (which
    wait out a 429 or a 503: a partition's DETACH holds the span table past ingest's lock
    timeout), the answers they waited out and the batches they gave up on."""
    per_client = max(1, batches // clients)
    elapsed, reports = otlp_ingest._run(
        otlp_ingest._http_worker,
        lambda c: (port, key, tag, list(range(c * per_client, (c + 1) * per_client))),
        clients,
    )
    refused = sum(reports, otlp_ingest.Refusals())
    rate = (per_client * clients - refused.given_up) * otlp_ingest.SPANS_PER_BATCH / elapsed
    return (
        f"{rate:,.0f} spans/s, {refused.again} tries again (429, 503, reset), "
        f"{refused.given_up} batches given up"
    )


def pages(client: Any, repeat: int) -> tuple[list[float], list[float]]:
    """The server times of the queue under each of its benchmark's filters and of the
    overview under each range, `repeat` requests each."""
    queue = [t for times in queue_page.measure(client, repeat).values() for t in times]
    overview = [t for _, times in overview_page.measure(client, repeat).values() for t in times]
    return queue, overview


def _ms(times: list[float]) -> str:
    median = statistics.median(times) * 1000
    return f"median {median:.1f} ms, p95 {queue_page._p95(times) * 1000:.1f} ms ({len(times)})"


class Upkeep(threading.Thread):
    """`partitions_upkeep` in a thread of its own (its own database connection), timed."""

    def __init__(self) -> None:
        super().__init__(name="upkeep")
        self.took = 0.0
        self.report: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import OperationalError, connection

        from trajectories import retention

        started = time.perf_counter()
        try:
            for _attempt in range(5):
                try:
                    # A partition's DDL gives up after its lock timeout: the next pass goes on.
                    self.report = retention.partitions_upkeep()
                    break
                except OperationalError as exc:
                    print(f"upkeep: {exc}; again", file=sys.stderr)
            else:
                raise RuntimeError("partitions_upkeep failed five times")
        except BaseException as exc:
            self.error = exc
        finally:
            self.took = time.perf_counter() - started
            connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90, help="the days the data spans")
    parser.add_argument("--payload-days", type=int, default=60, help="the policy's M")
    parser.add_argument("--db", default="bench_scale")
    parser.add_argument("--batches", type=int, default=24, help="OTLP batches per measure")
    parser.add_argument("--clients", type=int, default=2, help="OTLP client processes, ≤ 4")
    parser.add_argument(
        "--workers", type=int, default=server.deployed("--workers"), help="granian workers"
    )
    parser.add_argument("--repeat", type=int, default=3, help="requests per page and filter")
    parser.add_argument("--small", action="store_true", help="200,000 spans, 50,000 effects")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    if args.small:
        args.spans, args.effects = 200_000, 50_000
    # The OTLP clients start while the upkeep thread runs: no fork of a threaded process.
    mp.set_start_method("spawn")
    os.environ.pop("REDIS_URL", None)  # background work inline, as the other fills run

    started = time.perf_counter()
    # Effect g changed g × step seconds ago: the effects spread over --days days.
    step = args.days * 86400 / args.effects
    ago = f"now() - make_interval(secs => g * {step!r})"
    data = queue_page.build(
        args.db, args.effects, max(1, args.effects // 100), {"created": ago, "updated": ago}
    )
    try:
        _run(args, data, time.perf_counter() - started)
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(f"{queue_page.PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


def _run(args: argparse.Namespace, data: dict[str, Any], effects_took: float) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from durability.accounts.members import project_retention_set
    from durability.models import AuditEntry, Effect, Project
    from trajectories.models import Span

    project = data["project"]
    print(f"effects: {args.effects:,} over {args.days} days in {effects_took:.1f}s")
    started = time.perf_counter()
    entries = payload_retention.chains(project)
    took = time.perf_counter() - started
    print(f"receipts and audit chains: {entries:,} entries in {took:.1f}s")
    spans_project = Project.objects.create(name="bench-spans")
    took = span_retention.fill(spans_project.pk, spans=args.spans, days=args.days)
    print(
        f"spans: {args.spans:,} over {args.days} days in {took:.1f}s ({args.spans / took:,.0f}/s)"
    )
    project_retention_set(
        project=project,
        actor="bench:admin",
        span_days=SPAN_DAYS,
        payload_days=args.payload_days,
        require_archive=False,
    )
    before = sizes()

    # Ingest's own rate, not its gates': no per-process gate on large batches, as many
    # clients as a project's slots at most (a 429 would be waited out and counted all the same).
    env = {**os.environ, "DEBUG": "0", "LOG_LEVEL": "ERROR"}
    env["TALLYBOOK_INGEST_LARGE_PER_PROCESS"] = "0"
    key = server.manage(env, "createapikey", "bench-ingest").strip().splitlines()[-1]
    client = Client()
    client.force_login(data["operator"])
    with server.web(env, args.workers) as port:
        otlp_ingest._run(otlp_ingest._http_worker, lambda c: (port, key, "warm", [c]), args.workers)
        rate = ingest(port, key, "before", args.batches, args.clients)
        queue, overview = pages(client, args.repeat)
        print(f"before retention: OTLP ingest {rate}")
        print(f"  queue {_ms(queue)}; overview {_ms(overview)}")

        upkeep = Upkeep()
        upkeep.start()
        rate = ingest(port, key, "during", args.batches, args.clients)
        ingest_during = upkeep.is_alive()
        queue, overview = pages(client, args.repeat)
        rounds = 1
        while upkeep.is_alive():
            more = pages(client, args.repeat)
            queue, overview, rounds = queue + more[0], overview + more[1], rounds + 1
        pages_during = rounds > 1
        upkeep.join()
    if upkeep.error is not None:
        # It no longer deadlocks with ingest (docs/scaling.md); should it fail, timed alone.
        print(f"partitions_upkeep while ingest ran: {upkeep.error}; again, alone")
        upkeep = Upkeep()
        upkeep.run()
        if upkeep.error is not None:
            raise upkeep.error
    report = upkeep.report
    days = len(report.dropped) // 2  # each day's spans and requested tool calls
    print(
        f"while retention ran: OTLP ingest {rate}"
        f"{'' if ingest_during else ' (retention ended first)'}"
    )
    print(
        f"  queue {_ms(queue)}; overview {_ms(overview)}; {rounds} rounds"
        f"{'' if pages_during else ' (retention ended during the first)'}"
    )
    print(
        f"partitions_upkeep ({SPAN_DAYS}-day retention): {len(report.dropped)} partitions of "
        f"{days} days dropped, {report.traces_deleted:,} traces and {report.runs_deleted:,} runs "
        f"deleted in {upkeep.took:.1f}s, {upkeep.took / max(days, 1) * 1000:.0f} ms a day"
    )

    due = (
        Effect.objects.filter(project=project, payload_pruned=None)
        .filter(updated__lt=timezone.now() - timedelta(days=args.payload_days))
        .count()
    )
    took = payload_retention.prune(project, batch=1000, now=timezone.now())
    pruned = Effect.objects.filter(project=project).exclude(payload_pruned=None).count()
    print(
        f"payloads_prune, {args.payload_days} days: {pruned:,} of {due:,} effects older pruned "
        f"in {took:.1f}s, {pruned / took:,.0f} effects/s"
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print_sizes(before, sizes())
    print(f"spans left: {Span.objects.count():,}")

    entries = AuditEntry.objects.count()
    out = io.StringIO()
    started = time.perf_counter()
    call_command("verifyaudit", stdout=out)
    took = time.perf_counter() - started
    assert "BROKEN" not in out.getvalue(), out.getvalue()
    print(f"verifyaudit: {entries:,} entries in {took:.1f}s ({entries / took:,.0f}/s)")


if __name__ == "__main__":
    main()
