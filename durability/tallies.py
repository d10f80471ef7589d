"""Hourly tallies of effects: what the overview and the authority report count, kept by a
job so that a page's cost is the number of hours it shows, not the number of effects.

`hours_tally` (scheduled every minute) replaces whole hours' `EffectHour` rows with counts
from the effects: the hours up to the current one that it has not tallied yet, and the
tallied hours holding an effect that an audit entry since shortly before its previous run
names (a state that changed, a receipt, a retry under another agent: looking back one run
further catches a transaction that committed after that run counted). It is idempotent: a
second run, or two at once (they take the project's advisory lock in turn), leave the same
rows.

`tally` answers a page: the tallied whole hours of its range from `EffectHour`, the rest
(the partial hours at its edges, and the hours not tallied yet) live from the effects over
effect_project_created_idx. A state change to an effect of an hour already tallied shows
once the job has run again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from durability.models import (
    AuditAction,
    AuditEntry,
    Case,
    CaseHour,
    Effect,
    EffectHour,
    EffectHourMark,
    Project,
    Reason,
    Receipt,
)
from durability.models import Strength as StrengthChoice

HOUR = timedelta(hours=1)
# Longer than any ledger transaction: the first run's look back for entries still in flight.
MARGIN = timedelta(minutes=10)
# The columns an hour's rows are grouped by, as named on the effect and on EffectHour.
GROUPS = ("state", "kind", "target", "agent", "grant_id")
STRENGTHS = tuple(StrengthChoice.values)
# Cases that make an effect a problem though its state is not: counted per reason.
PROBLEM_CASES = (Reason.LATE_SUCCESS.value, Reason.DUPLICATE_EFFECT.value)
# What a tally counts: effects, those with any receipt, those with one of each strength,
# those with a case of each of PROBLEM_CASES.
MEASURES = ("n", "evidenced", *STRENGTHS, *PROBLEM_CASES)
# How long cases took to settle is counted in buckets of at most these many seconds (and
# more, the last bucket): wide enough apart that an hour's row stays small, close enough
# that a median read from them is within a bucket of the truth.
SETTLE_BOUNDS = (
    60, 300, 900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 16 * 3600,
    86400, 2 * 86400, 4 * 86400, 7 * 86400, 14 * 86400, 30 * 86400,
)  # fmt: skip
# The advisory lock that serialises one project's tally runs (the key's high half).
LOCK_CLASS = 0x7A11


def _floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _ceil(moment: datetime) -> datetime:
    floor = _floor(moment)
    return floor if floor == moment else floor + HOUR


# -- the job ---------------------------------------------------------------------------------


def _measured(measures: Sequence[str], prefix: str = "") -> dict[str, Any]:
    """The aggregates of `measures` over effects (receipts by semi-join, per effect)."""
    receipts = Receipt.objects.filter(project=OuterRef("project_id"), effect=OuterRef("pk"))
    counts: dict[str, Any] = {}
    for measure in measures:
        if measure == "n":
            counts[prefix + "n"] = Count("pk")
        elif measure == "evidenced":
            counts[prefix + measure] = Count("pk", filter=Q(Exists(receipts)))
        elif measure in PROBLEM_CASES:
            cases = Case.objects.filter(
                project=OuterRef("project_id"), effect=OuterRef("pk"), reason=measure
            )
            counts[prefix + measure] = Count("pk", filter=Q(Exists(cases)))
        else:
            counted = Q(Exists(receipts.filter(strength=measure)))
            counts[prefix + measure] = Count("pk", filter=counted)
    return counts


def _hours_replace(project: Project, hours: Iterable[datetime]) -> int:
    """Replace the rows of `hours` with counts from the effects; returns the rows written."""
    hours = sorted(set(hours))
    if not hours:
        return 0
    EffectHour.objects.filter(project=project, hour__in=hours).delete()
    # Runs of consecutive hours, each one range of effect_project_created_idx.
    runs: list[list[datetime]] = []
    for hour in hours:
        if runs and runs[-1][1] == hour:
            runs[-1][1] = hour + HOUR
        else:
            runs.append([hour, hour + HOUR])
    grouped = (
        Effect.objects.filter(_within(runs, "created"), project=project)
        .annotate(hour=Trunc("created", "hour", tzinfo=UTC))
        .values("hour", *GROUPS)
        .annotate(**_measured(MEASURES))
        .order_by()
    )
    rows = [EffectHour(project=project, **row) for row in grouped]
    EffectHour.objects.bulk_create(rows, batch_size=2000)
    return len(rows) + _case_hours_replace(project, hours, runs)


def _within(runs: list[list[datetime]], column: str) -> Q:
    """`column` in one of the [start, end) ranges of `runs`."""
    within = Q()
    for start, end in runs:
        within |= Q(**{f"{column}__gte": start, f"{column}__lt": end})
    return within


def bucket_of(seconds: float) -> int:
    """The index of the SETTLE_BOUNDS bucket a settling time is counted in."""
    return next(
        (i for i, bound in enumerate(SETTLE_BOUNDS) if seconds <= bound), len(SETTLE_BOUNDS)
    )


def _case_hours_replace(project: Project, hours: list[datetime], runs: list[list[datetime]]) -> int:
    """Replace the CaseHour rows of `hours` (`runs`: the same, as ranges of hours)."""
    CaseHour.objects.filter(project=project, hour__in=hours).delete()
    rows: dict[tuple[datetime, str], CaseHour] = {}

    def row(hour: datetime, reason: str) -> CaseHour:
        if (hour, reason) not in rows:
            took = [0] * (len(SETTLE_BOUNDS) + 1)
            rows[hour, reason] = CaseHour(
                project=project, hour=hour, reason=reason, opened=0, settled=0, took=took
            )
        return rows[hour, reason]

    opened = (
        Case.objects.filter(_within(runs, "opened"), project=project)
        .annotate(hour=Trunc("opened", "hour", tzinfo=UTC))
        .values_list("hour", "reason")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for hour, reason, n in opened:
        row(hour, reason).opened = n
    # One row per case settled in these hours: the job's cost, never a page's.
    settled = Case.objects.filter(_within(runs, "closed"), project=project).values_list(
        "opened", "closed", "reason"
    )
    for began, closed, reason in settled:
        assert closed is not None  # in a range
        counted = row(_floor(closed), reason)
        counted.settled += 1
        counted.took[bucket_of((closed - began).total_seconds())] += 1
    CaseHour.objects.bulk_create(rows.values(), batch_size=2000)
    return len(rows)


def hours_tally(*, project: Project, now: datetime | None = None) -> int:
    """Tally the project's hours before the current one that are new or changed since the
    last run (see the module's docstring); returns the rows written."""
    cut = _floor(now or timezone.now())
    with transaction.atomic():
        if connection.vendor == "postgresql":  # SQLite has one writer at a time anyway
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, project.pk])
        mark = EffectHourMark.objects.filter(project=project).first()
        # Read before the counts: whatever they miss has an entry after this one.
        seen = AuditEntry.objects.filter(project=project).aggregate(last=Max("id"))["last"] or 0
        hours: set[datetime] = set()
        if mark is None:
            first = Effect.objects.filter(project=project).aggregate(first=Min("created"))
            case = Case.objects.filter(project=project).aggregate(first=Min("opened"))
            earliest = min((m for m in (first["first"], case["first"]) if m), default=None)
            start = _floor(earliest) if earliest else cut
            # The next run looks again from entries made a while before this one: any of
            # them may belong to a transaction that commits after these counts.
            looked_from = (
                AuditEntry.objects.filter(project=project, at__lt=timezone.now() - MARGIN)
                .order_by("-id")
                .values_list("id", flat=True)
                .first()
            ) or 0
        else:
            start = mark.until
            looked_from = mark.audit_id
            changed = (
                Effect.objects.filter(
                    project=project,
                    created__lt=start,
                    pk__in=AuditEntry.objects.filter(project=project, id__gt=mark.audit_from)
                    .exclude(effect=None)
                    .values("effect_id"),
                )
                .annotate(hour=Trunc("created", "hour", tzinfo=UTC))
                .values_list("hour", flat=True)
                .distinct()
            )
            hours.update(changed)
            # A case opened or settled in a tallied hour by a transaction that committed
            # after that hour's count (cases of any effect, or of none: an orphan receipt's).
            cases = Case.objects.filter(
                project=project,
                pk__in=AuditEntry.objects.filter(
                    project=project,
                    id__gt=mark.audit_from,
                    action__in=[AuditAction.CASE_OPENED, AuditAction.CASE_CLOSED],
                ).values("case_id"),
            ).values_list("opened", "closed")
            for began, closed in cases:
                hours.update(_floor(m) for m in (began, closed) if m is not None and m < start)
        moment = start
        while moment < cut:
            hours.add(moment)
            moment += HOUR
        written = _hours_replace(project, hours)
        EffectHourMark.objects.update_or_create(
            project=project,
            defaults={
                "until": max(cut, start),
                "audit_from": looked_from,
                "audit_id": seen,
                "tallied": timezone.now(),
            },
        )
    return written


def projects_tally(now: datetime | None = None) -> int:
    """The scheduled job: tally every project's hours; returns the rows written."""
    # Not a project being deleted: its rows are going, and tallies would name them.
    live = Project.objects.filter(deleting=None).order_by("pk")
    return sum(hours_tally(project=p, now=now) for p in live)


# -- the pages -------------------------------------------------------------------------------


@dataclass
class Tally:
    """Counts of effects per group (a tuple of the `by` columns' values)."""

    by: tuple[str, ...]
    groups: dict[tuple[Any, ...], dict[str, int]] = field(default_factory=dict)

    def add(self, key: tuple[Any, ...], counts: dict[str, Any]) -> None:
        into = self.groups.setdefault(key, dict.fromkeys(MEASURES, 0))
        for measure, n in counts.items():
            into[measure] += n or 0

    def total(self, measure: str = "n", **where: Any) -> int:
        """The sum of `measure` over the groups whose columns have the values in `where`."""
        index = {name: self.by.index(name) for name in where}
        return sum(
            counts[measure]
            for key, counts in self.groups.items()
            if all(key[index[name]] == value for name, value in where.items())
        )

    def per(self, column: str, measure: str = "n") -> dict[Any, int]:
        """`measure` summed per value of one column."""
        at = self.by.index(column)
        found: dict[Any, int] = {}
        for key, counts in self.groups.items():
            found[key[at]] = found.get(key[at], 0) + counts[measure]
        return found


def tallied_until(project: Project) -> datetime | None:
    """Where the project's tallied hours end (None before the job's first run)."""
    return EffectHourMark.objects.filter(project=project).values_list("until", flat=True).first()


def tally(
    project: Project,
    since: datetime,
    until: datetime | None,
    *,
    by: Sequence[str],
    measures: Sequence[str] = ("n",),
    tallied: datetime | None = None,
    **filters: Any,
) -> Tally:
    """Effects created in [since, until) (until None: to now) matching `filters` (columns of
    both the effect and EffectHour), counted per the `by` columns ("hour" among them: the
    hour created; "minute", for a range counted live alone).

    Two queries: the whole hours before `tallied` (see `tallied_until`) from EffectHour,
    and the rest from the effects.
    """
    result = Tally(tuple(by))
    lo = _ceil(since)
    hi = (min(_floor(until), tallied) if until else tallied) if tallied else lo
    later = Q(created__lt=until) if until else Q()
    sums = [f"sum_{m}" for m in measures]
    live = Effect.objects.filter(project=project, **filters)
    if tallied and lo < hi:
        hours = EffectHour.objects.filter(project=project, hour__gte=lo, hour__lt=hi, **filters)
        for row in (
            hours.values_list(*by)
            .annotate(**{f"sum_{m}": Sum(m) for m in measures})
            .order_by()
            .values_list(*by, *sums)
        ):
            result.add(tuple(row[: len(by)]), dict(zip(measures, row[len(by) :], strict=True)))
        live = live.filter(Q(created__gte=since, created__lt=lo) | (Q(created__gte=hi) & later))
    else:
        live = live.filter(later, created__gte=since)
    if "hour" in by:
        live = live.annotate(hour=Trunc("created", "hour", tzinfo=UTC))
    if "minute" in by:  # the last hour's chart, counted live (no `tallied`)
        live = live.annotate(minute=Trunc("created", "minute", tzinfo=UTC))
    for row in (
        live.values_list(*by)
        .annotate(**_measured(measures, "sum_"))
        .order_by()
        .values_list(*by, *sums)
    ):
        result.add(tuple(row[: len(by)]), dict(zip(measures, row[len(by) :], strict=True)))
    return result


@dataclass
class CaseCounts:
    """Cases opened and settled (with how long they took, per SETTLE_BOUNDS bucket)."""

    opened: int = 0
    settled: int = 0
    took: list[int] = field(default_factory=lambda: [0] * (len(SETTLE_BOUNDS) + 1))

    def add(self, opened: int, settled: int, took: Sequence[int]) -> None:
        self.opened += opened
        self.settled += settled
        for i, n in enumerate(took[: len(self.took)]):
            self.took[i] += n


def case_hours(
    project: Project, since: datetime, tallied: datetime | None
) -> dict[tuple[datetime, str], CaseCounts]:
    """Cases opened and settled per (hour, reason) from `since` (a whole hour) to now.

    Three queries: the hours before `tallied` from CaseHour; the cases opened since, and
    those settled since, live (over case_project_opened_idx and case_project_closed_idx).
    """
    found: dict[tuple[datetime, str], CaseCounts] = {}
    live_from = max(tallied, since) if tallied else since
    for hour, reason, opened, settled, took in CaseHour.objects.filter(
        project=project, hour__gte=since, hour__lt=live_from
    ).values_list("hour", "reason", "opened", "settled", "took"):
        found.setdefault((hour, reason), CaseCounts()).add(opened, settled, took or [])
    opened_live = (
        Case.objects.filter(project=project, opened__gte=live_from)
        .annotate(hour=Trunc("opened", "hour", tzinfo=UTC))
        .values_list("hour", "reason")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for hour, reason, n in opened_live:
        found.setdefault((hour, reason), CaseCounts()).opened += n
    settled_live = Case.objects.filter(project=project, closed__gte=live_from).values_list(
        "opened", "closed", "reason"
    )
    for began, closed, reason in settled_live:
        assert closed is not None  # at or after live_from
        counts = found.setdefault((_floor(closed), reason), CaseCounts())
        counts.settled += 1
        counts.took[bucket_of((closed - began).total_seconds())] += 1
    return found


def settle_quantile(took: Sequence[int], q: float) -> float | None:
    """The q-quantile of settling times (seconds) counted in SETTLE_BOUNDS buckets, read
    linearly within its bucket (the last, open bucket as if twice its lower bound)."""
    total = sum(took)
    if not total:
        return None
    target, seen = q * total, 0
    for i, n in enumerate(took):
        if n and seen + n >= target:
            lower = SETTLE_BOUNDS[i - 1] if i else 0
            upper = SETTLE_BOUNDS[i] if i < len(SETTLE_BOUNDS) else 2 * SETTLE_BOUNDS[-1]
            return lower + (target - seen) / n * (upper - lower)
        seen += n
    return float(SETTLE_BOUNDS[-1])
