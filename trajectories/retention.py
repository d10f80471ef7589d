"""Span partitions: created ahead of the days they hold, dropped whole once expired.

On PostgreSQL `trajectories_span` and `trajectories_requestedtoolcall` are partitioned by
range of `day` (a span's trace's first-seen UTC day, RunTrace.day): one partition a day,
named `<table>_pYYYYMMDD`, and a DEFAULT partition for a day with none, so that no span is
ever refused. The scheduler creates the partitions TALLYBOOK_SPAN_PARTITIONS_AHEAD days
ahead, so the DEFAULT one stays empty while it runs; creating a partition moves the rows the
DEFAULT one holds for that day into it. Retention drops the partitions wholly older than
the horizon: no row-by-row DELETE on the hot tables. Elsewhere (SQLite, for the demo) the
tables are plain and retention deletes rows.

Both run under one session advisory lock, each partition's DDL in a transaction of its own
with a bounded lock wait (a DETACH waits for the queries reading the table, and makes every
query after it wait behind it): run twice at once, the second waits and finds nothing to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from durability.models import Project, RetentionPolicy
from trajectories.models import RequestedToolCall, Run, RunTrace, Span

PARTITIONED = (Span._meta.db_table, RequestedToolCall._meta.db_table)
# Advisory lock namespace of partition upkeep ("part").
LOCK_CLASS = 0x70617274
# A partition's DDL waits this long for the locks it needs, then gives up until the next run.
DDL_LOCK_TIMEOUT = "5s"
# Runs and traces deleted per statement once their spans are gone.
BATCH = 1000
_DAY_NAME = re.compile(r"_p(\d{8})$")


@dataclass
class Report:
    """What one upkeep did: partitions created and dropped, rows deleted."""

    horizon: date | None = None
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    # Expired rows deleted from the DEFAULT partitions (or the plain tables, on SQLite).
    rows_deleted: int = 0
    traces_deleted: int = 0
    runs_deleted: int = 0


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def _utc_day(now: datetime | None) -> date:
    return (now or timezone.now()).astimezone(UTC).date()


@contextmanager
def _upkeep_lock() -> Iterator[None]:
    """The session advisory lock of partition upkeep, waited for."""
    if not _postgresql():
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, 0)", [LOCK_CLASS])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, 0)", [LOCK_CLASS])


def partitions(table: str) -> dict[date, str]:
    """The daily partitions of a partitioned table, by day (the DEFAULT one left out)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = inhrelid "
            "WHERE inhparent = %s::regclass",
            [table],
        )
        names = [row[0] for row in cursor.fetchall()]
    found = {}
    for name in names:
        if (matched := _DAY_NAME.search(name)) is not None:
            found[datetime.strptime(matched[1], "%Y%m%d").date()] = name
    return found


def _partition_create(table: str, day: date) -> str:
    """Create the partition of `day`, moving into it what the DEFAULT partition holds of that
    day; one transaction. ATTACH, not CREATE … PARTITION OF: it locks the parent table
    against other DDL only, not against the reads and writes of ingest and the pages. It
    does lock the DEFAULT partition (its rows are checked against the new bounds): a span
    of a day with no partition waits for it, at most DDL_LOCK_TIMEOUT, and the scheduler
    creates partitions days ahead so that none does."""
    name = partition_name(table, day)
    bounds = [day.isoformat(), (day + timedelta(days=1)).isoformat()]
    # DDL takes no parameters: the bounds are dates' ISO texts.
    low, high = (f"'{bound}'::date" for bound in bounds)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [DDL_LOCK_TIMEOUT])
        cursor.execute(
            f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
        )
        # Its own bound as a check first: ATTACH then skips scanning the new table.
        cursor.execute(
            f'ALTER TABLE "{name}" ADD CONSTRAINT "{name}_bound" '
            f"CHECK (day >= {low} AND day < {high})"
        )
        default = f"{table}_default"
        cursor.execute(
            f'WITH moved AS (DELETE FROM "{default}" WHERE day >= %s::date AND day < %s::date '
            f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved',
            bounds,
        )
        cursor.execute(
            f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({low}) TO ({high})'
        )
        cursor.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{name}_bound"')
    return name


def _partition_drop(table: str, name: str) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [DDL_LOCK_TIMEOUT])
        # The partitioned tables hold no foreign keys (Span.run): this locks them alone, and
        # waits for an ingest transaction instead of deadlocking with it.
        cursor.execute(f'ALTER TABLE "{table}" DETACH PARTITION "{name}"')
        cursor.execute(f'DROP TABLE "{name}"')


def partitions_create(*, now: datetime | None = None, ahead: int | None = None) -> list[str]:
    """Create the partitions of today and the `ahead` days after it that are missing (default
    TALLYBOOK_SPAN_PARTITIONS_AHEAD); returns their names. Nothing to do elsewhere than on
    PostgreSQL."""
    if not _postgresql():
        return []
    ahead = settings.TALLYBOOK_SPAN_PARTITIONS_AHEAD if ahead is None else ahead
    first = _utc_day(now)
    created = []
    with _upkeep_lock():
        for table in PARTITIONED:
            have = partitions(table)
            for n in range(ahead + 1):
                day = first + timedelta(days=n)
                if day not in have:
                    created.append(_partition_create(table, day))
    return created


def drop_expired(*, now: datetime | None = None, days: int | None = None) -> Report:
    """Drop the span partitions wholly older than the horizon, `days` (default
    TALLYBOOK_SPAN_RETENTION_DAYS) before `now`; delete what the DEFAULT partitions hold of
    those days, the traces first seen then and the runs left with no span.

    A run spanning the horizon keeps its newer spans and its aggregates (counted when all
    its spans were there); a run with no span at all goes once it was last updated before
    the horizon.
    """
    days = settings.TALLYBOOK_SPAN_RETENTION_DAYS if days is None else days
    horizon = _utc_day(now) - timedelta(days=days)
    report = Report(horizon=horizon)
    with _upkeep_lock():
        if _postgresql():
            for table in PARTITIONED:
                for day, name in sorted(partitions(table).items()):
                    if day < horizon:
                        _partition_drop(table, name)
                        report.dropped.append(name)
            with transaction.atomic(), connection.cursor() as cursor:
                for table in PARTITIONED:
                    cursor.execute(f'DELETE FROM "{table}_default" WHERE day < %s', [horizon])
                    report.rows_deleted += cursor.rowcount
        else:
            for model in (RequestedToolCall, Span):
                report.rows_deleted += model.objects.filter(day__lt=horizon).delete()[0]
        # Through runtrace_day_idx and run_last_day_idx, a batch at a time.
        report.traces_deleted = _batches(RunTrace, Q(day__lt=horizon))
        since = datetime.combine(horizon, datetime.min.time(), tzinfo=UTC)
        report.runs_deleted = _batches(
            Run, Q(last_day__lt=horizon) | Q(last_day__isnull=True, updated__lt=since)
        )
    return report


def _batches(model: type[Run] | type[RunTrace], expired: Q) -> int:
    """Delete the rows `expired` BATCH at a time, each batch locked and checked again (a run
    a span batch has just written to is locked by it, and no longer expired); returns how
    many."""
    deleted = 0
    while ids := list(model.objects.filter(expired).values_list("pk", flat=True)[:BATCH]):
        with transaction.atomic():
            locked = list(
                model.objects.select_for_update()
                .filter(expired, pk__in=ids)
                .values_list("pk", flat=True)
            )
            model.objects.filter(pk__in=locked).delete()
        deleted += len(locked)
        if len(ids) < BATCH:
            break
    return deleted


def span_days_of_projects() -> tuple[int, dict[int, int]]:
    """The longest span retention of any project (its retention policy's `span_days`, else
    TALLYBOOK_SPAN_RETENTION_DAYS), which whole partitions wait for, and the projects that
    keep their spans for less, with their days."""
    default = settings.TALLYBOOK_SPAN_RETENTION_DAYS
    chosen = dict(RetentionPolicy.objects.values_list("project_id", "span_days"))
    others = Project.objects.exclude(pk__in=list(chosen)).values_list("pk", flat=True)
    days = chosen | dict.fromkeys(others, default)
    longest = max(days.values(), default=default)
    return longest, {project: n for project, n in days.items() if n < longest}


def project_expire(project_id: int, *, now: datetime | None = None, days: int) -> Report:
    """Delete one project's spans, traces and runs older than its own horizon, in the
    partitions the others still keep: one DELETE per table, which PostgreSQL confines to the
    partitions of the days before the horizon (cold: no span batch writes there)."""
    horizon = _utc_day(now) - timedelta(days=days)
    report = Report(horizon=horizon)
    with _upkeep_lock():
        for model in (RequestedToolCall, Span):
            deleted = model.objects.filter(project_id=project_id, day__lt=horizon).delete()
            report.rows_deleted += deleted[0]
        report.traces_deleted = _batches(RunTrace, Q(project_id=project_id, day__lt=horizon))
        since = datetime.combine(horizon, datetime.min.time(), tzinfo=UTC)
        report.runs_deleted = _batches(
            Run,
            Q(project_id=project_id)
            & (Q(last_day__lt=horizon) | Q(last_day__isnull=True, updated__lt=since)),
        )
    return report


def partitions_upkeep(*, now: datetime | None = None) -> Report:
    """The scheduled upkeep: create the partitions ahead, drop those every project's
    retention has passed, then delete the spans of the projects that keep theirs for less."""
    created = partitions_create(now=now)
    longest, shorter = span_days_of_projects()
    report = drop_expired(now=now, days=longest)
    report.created = created
    for project_id, days in sorted(shorter.items()):
        expired = project_expire(project_id, now=now, days=days)
        report.rows_deleted += expired.rows_deleted
        report.traces_deleted += expired.traces_deleted
        report.runs_deleted += expired.runs_deleted
    return report
