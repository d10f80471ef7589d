"""Dropping a day of spans at scale: partitions dropped whole, against a row-by-row DELETE.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/span_retention.py [--spans N] [--days D]

Creates (dropping it first) the PostgreSQL database named by --db, migrates it, and fills it
with --spans spans over --days days (runs of 100 spans, one trace each, a run a day apart
in turn), a partition a day. Then times `trajectories.retention.drop_expired` with the
horizon one day past the oldest day (one day's partitions dropped, its traces and runs
deleted), and, for comparison, a DELETE of the next day's spans row by row. Prints the times
and the table's size before and after; drops the database at the end unless --keep.

2026-12-01 17:10 UTC, a shared 2-core machine under other helpers' tests, PostgreSQL 15:
1,000,000 spans over 30 days (367 MB in 39 partitions) filled in 39 s; `drop_expired` for one
day 533 ms, all told: its two partitions detached and dropped, and 334 traces and 334 runs
deleted in batches; 33,400 spans gone, 355 MB left. The DELETE of the next day's 33,400 rows
took 45 ms, but only because the partitioning prunes it to one partition: it leaves 33,400
dead rows for vacuum, and on one unpartitioned table it would walk an index on day (or the
whole table) and bloat the hot table's indexes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://root@127.0.0.1:5432"
SPANS_PER_RUN = 100


def fill(project_id: int, *, spans: int, days: int) -> float:
    """`spans` spans of the project over the `days` days up to today (runs of SPANS_PER_RUN
    spans, one trace each, a run a day apart in turn), a partition a day created first, in
    three INSERT … SELECT over generate_series, then ANALYZE; the seconds it took."""
    from django.db import connection

    from trajectories import retention

    first = datetime.now(UTC).date() - timedelta(days=days - 1)
    retention.partitions_create(
        now=datetime.combine(first, datetime.min.time(), tzinfo=UTC), ahead=days + 7
    )
    runs = spans // SPANS_PER_RUN
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO trajectories_run (project_id, run_id, inferred, agent, workflow, "
            "workflow_version, conversation_id, status, started, attributes, span_count, "
            "error_count, input_tokens, output_tokens, updated, first_day, last_day) "
            "SELECT %s, 'run-' || g, true, 'bench', 'bench', '1', '', 'ok', "
            "d + interval '1 hour', '{}', %s, 0, 0, 0, d, d::date, d::date "
            "FROM generate_series(0, %s - 1) g, "
            "LATERAL (SELECT %s::date + (g %% %s) AS d) AS day",
            [project_id, SPANS_PER_RUN, runs, first, days],
        )
        cursor.execute(
            "INSERT INTO trajectories_runtrace (project_id, trace_id, run_id, day) "
            "SELECT project_id, lpad(to_hex(id), 32, '0'), id, first_day "
            "FROM trajectories_run WHERE project_id = %s",
            [project_id],
        )
        cursor.execute(
            "INSERT INTO trajectories_span (project_id, run_id, trace_id, span_id, "
            "parent_span_id, kind, operation, name, start, status, status_message, provider, "
            "request_model, response_model, tool_call_id, tool_name, attributes, resource, "
            "capped, received, day) "
            "SELECT r.project_id, r.id, lpad(to_hex(r.id), 32, '0'), lpad(to_hex(s), 16, '0'), "
            "'', 'other', '', 'step', r.started + s * interval '1 second', 'ok', '', '', '', "
            "'', '', '', '{\"step\": 1}', '{}', '{}', r.started, r.first_day "
            "FROM trajectories_run r, generate_series(1, %s) s WHERE r.project_id = %s",
            [SPANS_PER_RUN, project_id],
        )
        cursor.execute("ANALYZE")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--db", default="bench_parts")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    os.environ.update(
        {"DATABASE_URL": f"{PG}/{args.db}", "DJANGO_SETTINGS_MODULE": "durability.settings"}
    )
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from durability.models import Project
    from trajectories import retention

    try:
        call_command("migrate", verbosity=0)
        project = Project.objects.create(name="bench-retention")
        first = datetime.now(UTC).date() - timedelta(days=args.days - 1)
        filled = fill(project.pk, spans=args.spans, days=args.days)

        def size() -> tuple[int, str]:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*), pg_size_pretty(sum(pg_total_relation_size(inhrelid))) "
                    "FROM pg_inherits WHERE inhparent = 'trajectories_span'::regclass"
                )
                partitions, total = cursor.fetchone()
                cursor.execute("SELECT count(*) FROM trajectories_span")
                return cursor.fetchone()[0], f"{total} in {partitions} partitions"

        spans, before = size()
        print(f"filled {spans:,} spans over {args.days} days in {filled:.1f} s: {before}")
        horizon_now = datetime.combine(first + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        started = time.perf_counter()
        report = retention.drop_expired(now=horizon_now, days=0)
        dropped = time.perf_counter() - started
        left, after = size()
        print(
            f"drop_expired, one day: {dropped * 1000:.0f} ms; partitions dropped "
            f"{report.dropped}, {report.traces_deleted:,} traces and {report.runs_deleted:,} "
            f"runs deleted; {spans - left:,} spans gone, {left:,} left: {after}"
        )
        next_day = first + timedelta(days=1)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM trajectories_span WHERE day = %s", [next_day])
            deleted = cursor.rowcount
        print(
            f"for comparison, DELETE of the next day's {deleted:,} spans row by row (pruned to "
            f"its partition): {(time.perf_counter() - started) * 1000:.0f} ms, "
            "and the dead rows left to vacuum"
        )
    finally:
        connection.close()
        if not args.keep:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
