"""Selectors of the queue page: its filter, its keyset pages and its counts.

The filter lives in the URL (so a view can be bookmarked) and is validated like a
form; an invalid field is reported and ignored, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.models import User
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import TruncHour
from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from durability.models import Attempt, Case, Project, Reason, Severity
from durability.paging import Keyset, micros, moment

PAGE_SIZE = 50
# The filter's fields, in the order a query string names them.
FILTER_FIELDS = (
    "reason",
    "severity",
    "kind",
    "target",
    "workflow",
    "assignee",
    "group",
    "grouped",
    "snoozed",
    "sort",
)
# How a view is shown rather than what it shows: not a filter.
VIEW_FIELDS = ("sort", "grouped")
# A group's trend: its open cases opened in each of the last TREND_HOURS hours.
TREND_HOURS = 24


class Sort:
    AGE = "age"
    SEVERITY = "severity"


class QueueFilter(forms.Form):
    reason = forms.ChoiceField(choices=[("", "any reason"), *Reason.choices], required=False)
    severity = forms.TypedChoiceField(
        choices=[
            ("", "any severity"),
            *((v, f"{label} and above") for v, label in Severity.choices),
        ],
        coerce=int,
        empty_value=None,
        required=False,
    )
    kind = forms.CharField(max_length=100, required=False)
    target = forms.CharField(max_length=255, required=False)
    workflow = forms.CharField(max_length=255, required=False, label="Agent / workflow")
    assignee = forms.CharField(max_length=150, required=False, help_text="me, none, or a username")
    group = forms.RegexField(
        r"^[0-9a-f]{32}$",
        required=False,
        error_messages={"invalid": "Not a group of this queue."},
    )
    grouped = forms.BooleanField(required=False, label="Group similar")
    snoozed = forms.BooleanField(required=False, label="Snoozed")
    sort = forms.ChoiceField(
        choices=[(Sort.AGE, "oldest first"), (Sort.SEVERITY, "most severe first")],
        required=False,
    )
    after = forms.CharField(max_length=100, required=False)

    def clean_after(self) -> tuple[int, ...] | None:
        value: str = self.cleaned_data["after"]
        if not value:
            return None
        try:
            parts = tuple(int(part) for part in value.split("."))
            # The moment (last but one) one a datetime can hold; the last, a case's id (a
            # bigint) or a group's key (128 bits).
            if len(parts) not in (2, 3) or not 0 <= parts[-1] < 2**128 or abs(parts[0]) > 2**63:
                raise ValueError(value)
            moment(parts[-2])
        except (ValueError, OverflowError, OSError):
            raise forms.ValidationError("Not a page of this queue.") from None
        return parts


@dataclass
class QueueQuery:
    """A validated filter: what the page shows, and how to link to it again."""

    values: dict[str, Any]
    errors: dict[str, str]

    @classmethod
    def from_params(cls, params: Any) -> QueueQuery:
        form = QueueFilter(params)
        form.is_valid()
        values = {k: v for k, v in form.cleaned_data.items() if v not in ("", None, False)}
        errors = {k: " ".join(str(m) for m in v) for k, v in form.errors.items()}
        return cls(values, errors)

    @classmethod
    def came_from(cls, params: Any) -> QueueQuery:
        """The queue a case page was opened from: its `from`, read again as a queue's filter
        (only the filter's own fields count, so the way back leads to the queue, nowhere else)."""
        return cls.from_params(QueryDict(params.get("from", "")))

    @property
    def sort(self) -> str:
        return str(self.values.get("sort", Sort.AGE))

    @property
    def grouped(self) -> bool:
        """Whether the queue shows one row per group of similar cases ("group similar")."""
        return bool(self.values.get("grouped"))

    def query_string(self, **override: Any) -> str:
        """The filter (without the page cursor) as a query string; `override` replaces fields."""
        merged = {k: self.values.get(k) for k in FILTER_FIELDS} | override
        return urlencode(
            {k: "1" if v is True else v for k, v in merged.items() if v not in ("", None, False)}
        )

    def group_query_string(self, key: str) -> str:
        """The cases of one group under this filter, one row each."""
        return self.query_string(group=key, grouped=None)

    def url(self) -> str:
        """The queue's first page under this filter."""
        qs = self.query_string()
        return reverse("queue") + (f"?{qs}" if qs else "")

    @property
    def origin(self) -> str:
        """What a link from this queue to a case (or a case's action) carries, `?from=` and the
        filter, for the case to lead back here; nothing for the unfiltered queue."""
        qs = self.query_string()
        return f"?{urlencode({'from': qs})}" if qs else ""

    def is_filtered(self) -> bool:
        return any(k in self.values for k in FILTER_FIELDS if k not in VIEW_FIELDS)


def _recurred() -> Exists:
    """Whether a newer open case joined the outer case's group since it was snoozed (a probe
    of case_queue_group_idx: project, group key, opened)."""
    return Exists(
        Case.objects.filter(
            project_id=OuterRef("project_id"),
            group_key=OuterRef("group_key"),
            closed=None,
            opened__gt=OuterRef("snoozed_at"),
        )
    )


def snoozed(now: datetime) -> Q:
    """A case still snoozed at `now`: its time not yet come, or (snoozed with no end) no
    newer case in its group yet. Read at query time: a case comes back on its own."""
    return Q(snoozed_at__isnull=False) & (
        Q(snoozed_until__gt=now) | (Q(snoozed_until=None) & ~Q(_recurred()))
    )


def awake(now: datetime) -> Q:
    """A case not snoozed at `now`: never snoozed, or back (its time came, or it recurred)."""
    return Q(snoozed_at=None) | Q(snoozed_until__lte=now) | (Q(snoozed_until=None) & Q(_recurred()))


def is_snoozed(case: Case, *, now: datetime | None = None) -> bool:
    """Whether this case is snoozed now (one query when its snooze waits for a recurrence)."""
    now = now or timezone.now()
    if case.snoozed_at is None:
        return False
    if case.snoozed_until is not None:
        return case.snoozed_until > now
    return not Case.objects.filter(
        project_id=case.project_id,
        group_key=case.group_key,
        closed=None,
        opened__gt=case.snoozed_at,
    ).exists()


def open_cases(
    project: Project,
    query: QueueQuery,
    user: User,
    *,
    reason: bool = True,
    snooze: Literal["query", "any"] = "query",
) -> QuerySet[Case]:
    """The project's open cases matching the filter (without the reason, if `reason` is False):
    those awake, or under `snoozed` those still snoozed (either, with `snooze="any"`)."""
    v = query.values
    qs = Case.objects.filter(project=project, closed=None)
    if snooze == "query":
        # The snoozed view walks case_snoozed_idx; the default queue its usual index, leaving
        # the snoozed cases out as it goes.
        now = timezone.now()
        qs = qs.filter(snoozed(now) if v.get("snoozed") else awake(now))
    if reason and "reason" in v:
        qs = qs.filter(reason=v["reason"])
    if "severity" in v:
        qs = qs.filter(severity__gte=v["severity"])
    # The effect's kind, target and who made its latest intent, as copied onto the case:
    # the open cases are filtered and counted without reading an effect.
    if "kind" in v:
        qs = qs.filter(kind=v["kind"])
    if "target" in v:
        qs = qs.filter(target=v["target"])
    if "workflow" in v:
        name = v["workflow"]
        qs = qs.filter(Q(workflow=name) | Q(agent=name) | Q(run_id=name))
    if "group" in v:
        qs = qs.filter(group_key=v["group"])
    if "assignee" in v:
        who = v["assignee"]
        if who == "me":
            qs = qs.filter(assignee=user)
        elif who == "none":
            qs = qs.filter(assignee=None)
        else:
            qs = qs.filter(assignee__username=who)
    return qs


def _latest_attempt() -> QuerySet[Attempt]:
    """The current attempt of the outer case's effect (a correlated subquery that walks
    attempt_of_effect_uniq backwards; it needs no join to the effect)."""
    return Attempt.objects.filter(
        project_id=OuterRef("project_id"), effect_id=OuterRef("effect_id")
    ).order_by("-number")


# A cursor's id past any a case can have (bigint) means after them all.
BIGGEST_ID = 2**63 - 1
# The queue's orders (oldest first walks case_queue_open_idx, or case_queue_reason_idx when
# filtered by reason; most severe first walks case_queue_severity_idx), and its groups'.
CASES = {
    Sort.AGE: Keyset("opened", "id"),
    Sort.SEVERITY: Keyset("-severity", "opened", "id"),
}
GROUPS = {
    Sort.AGE: Keyset("first", "group_key"),
    Sort.SEVERITY: Keyset("-top", "first", "group_key"),
}


def _spelt(value: Any) -> str:
    """One value of a place in the queue as its cursor spells it: a moment as µs since the
    epoch, a group's key (32 hex digits; a row written around the ledger may have none) as
    its number, a severity or an id as it is."""
    if isinstance(value, datetime):
        return str(micros(value))
    if isinstance(value, str):
        return str(int(value or "0", 16))
    return str(value)


def _cursor(order: Keyset, row: Any) -> str:
    """`[<severity>.]<opened or first seen>.<id or group key>`: a row's place in `order`."""
    return ".".join(_spelt(value) for value in order.position(row))


def _position(
    order: Keyset, after: tuple[int, ...] | None, tie: Callable[[int], Any]
) -> tuple[Any, ...] | None:
    """The place in `order` the cursor `after` names (`tie` reads its last part), if it
    names one of that order."""
    if not after or len(after) != len(order.order):
        return None
    *severity, at, last = after
    return (*severity, moment(at), tie(last))


def page_of(qs: QuerySet[Case], query: QueueQuery) -> tuple[list[Case], str | None]:
    """One keyset page of the queue and the cursor of the next, if there is one."""
    order = CASES[query.sort]
    position = _position(order, query.values.get("after"), lambda pk: min(pk, BIGGEST_ID))
    page = order.page(_with_row_facts(qs), position, PAGE_SIZE)
    return page.rows, page.next(lambda case: _cursor(order, case))


def next_case(project: Project, query: QueueQuery, user: User, case: Case) -> Case | None:
    """The open case that follows `case` in the queue `query` shows, in its order (`case`
    itself may be closed by now, or never have matched: its place in the order is enough)."""
    order = CASES[query.sort]
    return order.after(open_cases(project, query, user), order.position(case)).first()


def counts_by_reason(qs: QuerySet[Case], query: QueueQuery) -> tuple[dict[str, int], int]:
    """Open cases per reason of the view `query` shows (awake, or snoozed), every reason
    listed, and how many the other view holds: one statement over the open cases of `qs`
    (the filter's other fields applied, snoozed or not)."""
    now = timezone.now()
    shown, other = (
        (snoozed(now), awake(now)) if query.values.get("snoozed") else (awake(now), snoozed(now))
    )
    found = {
        reason: (n, m)
        for reason, n, m in qs.order_by()
        .values_list("reason")
        .annotate(n=Count("id", filter=shown), m=Count("id", filter=other))
    }
    counts = {reason: found.get(reason, (0, 0))[0] for reason in Reason.values}
    return counts, sum(m for _, m in found.values())


def _with_row_facts(qs: QuerySet[Case]) -> QuerySet[Case]:
    """What a queue row shows: the effect, the assignee, and the current attempt's workflow
    version (evaluated only for the rows returned; the workflow and agent are the case's)."""
    latest = _latest_attempt()
    return qs.select_related("effect", "assignee").annotate(
        workflow_version=Subquery(latest.values(v=KT("context__workflow_version"))[:1]),
    )


def rows_of(project: Project, ids: list[int]) -> list[Case]:
    """Cases by id, as queue rows (for rows changed elsewhere)."""
    qs = Case.objects.filter(project=project, pk__in=ids).select_related("resolution")
    return list(_with_row_facts(qs))


# -- groups of similar cases -----------------------------------------------------------------


@dataclass
class Group:
    """One row of the grouped queue: open cases that share a fingerprint (Case.group_key)."""

    key: str
    count: int
    first_seen: datetime
    last_seen: datetime
    severity: int
    # The group's first case: what the row says of them all (reason, kind, target, cause).
    sample: Case
    # Open cases of the group opened in each of the last TREND_HOURS hours, oldest first.
    trend: list[int]
    # The queue of the group's cases under the same filter, one row each (a query string).
    cases_qs: str

    @property
    def severity_label(self) -> str:
        return str(Severity(self.severity).label)

    @property
    def trend_svg(self) -> SafeString:
        """The trend as an inline SVG: a bar per hour, the busiest hour full height, an hour
        with any case visible (made here, not in the template: 24 bars a row, 50 rows)."""
        top = max(self.trend) or 1
        bars = format_html_join(
            "",
            '<rect x="{}" y="{}" width="2" height="{}"><title>{}</title></rect>',
            (
                (i * 3, 16 - h, h, n)
                for i, n in enumerate(self.trend)
                if n and (h := max(1, round(n * 16 / top)))
            ),
        )
        return format_html(
            '<svg class="trend" width="72" height="16" viewBox="0 0 72 16" role="img" '
            'aria-label="Opened per hour, the last {} hours: {}">{}'
            '<line x1="0" y1="15.5" x2="72" y2="15.5"></line></svg>',
            TREND_HOURS,
            " ".join(map(str, self.trend)),
            bars,
        )


def _key_of(n: int) -> str:
    return f"{n:032x}"


def groups_page(
    qs: QuerySet[Case], query: QueueQuery, *, now: datetime | None = None
) -> tuple[list[Group], str | None]:
    """One keyset page of the open cases' groups and the cursor of the next, if there is one.

    Oldest first orders groups by first seen, most severe first by their most severe case;
    three queries (the groups, their first cases, their trends), the first an aggregate
    over case_queue_group_idx.
    """
    found = (
        qs.order_by()
        .values("group_key")
        .annotate(
            n=Count("id"),
            first=Min("opened"),
            last=Max("opened"),
            top=Max("severity"),
            sample=Min("id"),
        )
    )
    order = GROUPS[query.sort]
    page = order.page(found, _position(order, query.values.get("after"), _key_of), PAGE_SIZE)
    rows = page.rows
    samples = Case.objects.select_related("effect__grant").in_bulk([r["sample"] for r in rows])
    trends = _trends(qs, [r["group_key"] for r in rows], now or timezone.now())
    groups = [
        Group(
            key=r["group_key"],
            count=r["n"],
            first_seen=r["first"],
            last_seen=r["last"],
            severity=r["top"],
            sample=samples[r["sample"]],
            trend=trends.get(r["group_key"], [0] * TREND_HOURS),
            cases_qs=query.group_query_string(r["group_key"]),
        )
        for r in rows
    ]
    return groups, page.next(lambda row: _cursor(order, row))


def _trends(qs: QuerySet[Case], keys: list[str], now: datetime) -> dict[str, list[int]]:
    """Per group, its cases in `qs` opened in each of the last TREND_HOURS hours."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=TREND_HOURS - 1)
    hourly = (
        qs.order_by()
        .filter(group_key__in=keys, opened__gte=start)
        .values_list("group_key", TruncHour("opened", tzinfo=UTC))
        .annotate(n=Count("id"))
    )
    trends: dict[str, list[int]] = {}
    for key, hour, n in hourly:
        at = int((hour - start).total_seconds() // 3600)
        if 0 <= at < TREND_HOURS:
            trends.setdefault(key, [0] * TREND_HOURS)[at] = n
    return trends


def group_count(qs: QuerySet[Case]) -> int:
    """How many groups the open cases of `qs` fall into."""
    return qs.order_by().values("group_key").distinct().count()
