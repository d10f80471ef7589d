"""The pruning rate of payload retention at 1,000,000 effects, and verifyaudit's time.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/payload_retention.py \
        [--effects 1000000] [--prune 200000] [--batch 1000] [--db bench_prune] [--keep]

Builds the queue benchmark's data set (benchmarks/queue_page.py: effects one second apart,
requests and attempts, 10,000 open cases) in the database named by --db, and gives every
effect a receipt with data and an audit chain of two entries (intent, failure with the
agent's error), hashed as the ledger hashes them, the chain's head on the effect.
Then it sets the project's policy to --days and runs `payloads_prune` as the hourly job
would, at the moment when the oldest --prune effects are due (200,000: of the 1,000,000, the
oldest settled ones without an open case), and prints
the effects, receipts and entries pruned per second, the plan of one batch's selection, and
verifyaudit's time over every chain after it. The database is dropped at the end
unless --keep.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

# The queue benchmark beside this script (the script's folder is first on sys.path).
queue_page = importlib.import_module("queue_page")

ERROR = "HTTP 502 from the provider after 30 s: upstream connect error or disconnect"


CHUNK = 50_000


def _entry_columns() -> list[str]:
    """The audit entry's columns the archive writes, but the id the COPY leaves to the table."""
    from durability.retention.archive import ENTRY_FIELDS

    return [name for name in ENTRY_FIELDS if name != "id"]


def retried[T](step: Callable[[], T], tries: int = 5) -> T:
    """`step` in a transaction of its own, again on a new connection should the server end
    this one (on a shared machine, other runs' tests terminate connections)."""
    from django.db import OperationalError, connection, transaction

    for attempt in range(tries):
        try:
            with transaction.atomic():
                return step()
        except OperationalError as exc:
            print(f"connection lost ({exc}); again", file=sys.stderr)
            connection.close()
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _chunk_chains(project: Any, effects: list[tuple[int, datetime]]) -> int:
    from django.db import connection

    from durability.audit import GENESIS, data_digest, entry_hash
    from durability.models import AuditEntry

    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE heads (id bigint, head char(64)) ON COMMIT DROP")
        raw = connection.connection
        heads: list[tuple[int, str]] = []
        n = 0
        with raw.cursor().copy(
            f"COPY durability_auditentry ({', '.join(_entry_columns())}) FROM STDIN"
        ) as copy:
            for effect_id, updated in effects:
                prev = GENESIS
                steps = [
                    ("intent", {"attempt": 1, "fingerprint": f"fp-{effect_id}"}),
                    ("failure", {"error": ERROR}),
                ]
                for seq, (action, data) in enumerate(steps, start=1):
                    entry = AuditEntry(
                        project_id=project.pk,
                        seq=seq,
                        at=updated,
                        actor="bench:agent",
                        action=action,
                        effect_id=effect_id,
                        from_state="",
                        to_state="",
                        data=data,
                        data_digest=data_digest(data),
                        prev_hash=prev,
                    )
                    entry.hash = prev = entry_hash(entry)
                    copy.write_row(
                        [project.pk, seq, updated, entry.actor, action, effect_id, None, "", ""]
                        + [Jsonb(data), entry.data_digest, None, entry.prev_hash, entry.hash]
                    )
                    n += 1
                heads.append((effect_id, prev))
        # One COPY at a time on a connection: the heads after the entries.
        with raw.cursor().copy("COPY heads (id, head) FROM STDIN") as copy:
            for head in heads:
                copy.write_row(head)
        cursor.execute(
            "UPDATE durability_effect e SET audit_seq = 2, audit_head = h.head "
            "FROM heads h WHERE h.id = e.id"
        )
    return n


def chains(project: Any) -> int:
    """Two audit entries per effect (its intent, a failure with the agent's error), at its
    `updated`, hashed by durability.audit; the receipts, one per effect; the heads on the
    effects. Entries go in by COPY, a transaction per 50,000 effects."""
    from django.db import connection

    from durability.models import Effect, Receipt

    started = time.perf_counter()
    receipt_sql, receipt_params = queue_page._insert_select(
        Receipt,
        f"{Effect._meta.db_table} e",
        {
            "project_id": "e.project_id",
            "effect_id": "e.id",
            "key": "e.key",
            "system": "'fakepay'",
            "external_id": "'re_' || e.id",
            "data": "jsonb_build_object('amount', 1250, 'card', '4242', 'id', 're_' || e.id)",
            "received": "e.updated",
        },
    )

    def receipts() -> None:
        with connection.cursor() as cursor:
            cursor.execute(receipt_sql + " WHERE e.project_id = %s", [*receipt_params, project.pk])

    retried(receipts)
    effects = list(
        Effect.objects.filter(project=project).order_by("id").values_list("id", "updated")
    )
    n = 0
    for at in range(0, len(effects), CHUNK):
        chunk = effects[at : at + CHUNK]
        n += retried(lambda chunk=chunk: _chunk_chains(project, chunk))  # type: ignore[misc]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE durability_auditentry")
        cursor.execute("VACUUM ANALYZE durability_effect")
        cursor.execute("VACUUM ANALYZE durability_receipt")
    print(f"chains: {n:,} entries in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return n


def verify(project: Any, label: str) -> float:
    from durability.audit import first_broken_entry
    from durability.models import AuditEntry

    started = time.perf_counter()
    broken = first_broken_entry(project)
    took = time.perf_counter() - started
    count = AuditEntry.objects.filter(project=project).count()
    assert broken is None, f"the chain broke at {broken}"
    print(f"verifyaudit {label}: {count:,} entries in {took:.1f}s ({count / took:,.0f}/s)")
    return took


def explain(project: Any, before: datetime) -> None:
    """The plan of one batch's selection."""
    from django.db import connection

    from durability.retention.services import _due

    rows = _due(project, before).values_list("id", "updated")
    sql, params = rows[:1000].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        print("\n".join(row[0] for row in cursor.fetchall()))


def prune(project: Any, *, batch: int, now: datetime) -> float:
    """`payloads_prune` of the project as the hourly job runs it at `now`, carried on by a new
    pass should the server end its connection; the seconds it took."""
    from django.db import OperationalError, connection

    from durability.retention.services import payloads_prune

    started = time.perf_counter()
    for _attempt in range(5):
        try:
            payloads_prune(project=project, batch=batch, now=now)
            break
        except OperationalError as exc:
            # Each batch is its own transaction: the next pass carries on after it.
            print(f"connection lost ({exc}); again", file=sys.stderr)
            connection.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=10_000, help="open cases")
    parser.add_argument("--days", type=int, default=30, help="the policy's payload days")
    parser.add_argument(
        "--prune", type=int, default=200_000, help="effects due (the oldest ones, settled)"
    )
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--db", default="bench_prune")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()

    data = queue_page.build(args.db, args.effects, args.open)
    project = data["project"]
    try:
        chains(project)
        from django.utils import timezone

        from durability.accounts.members import project_retention_set
        from durability.models import AuditEntry, Effect, Receipt

        project_retention_set(
            project=project,
            actor="bench:admin",
            span_days=30,
            payload_days=args.days,
            require_archive=False,
        )
        # Effect g changed g seconds ago: retention runs when the oldest --prune are due.
        now = timezone.now() + timedelta(days=args.days, seconds=args.prune - args.effects)
        explain(project, now - timedelta(days=args.days))
        took = prune(project, batch=args.batch, now=now)
        effects = Effect.objects.filter(project=project).exclude(payload_pruned=None).count()
        receipts = Receipt.objects.filter(project=project).exclude(data_pruned=None).count()
        entries = AuditEntry.objects.filter(project=project).exclude(pruned=None).count()
        print(
            f"{args.effects:,} effects, batches of {args.batch}: pruned {effects:,} effects,"
            f" {receipts:,} receipts, {entries:,} audit entries in {took:.1f}s:"
            f" {effects / took:,.0f} effects/s"
        )
        verify(project, "after pruning")
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(f"{queue_page.PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
