"""The overview, the landing page: what needs a person, and what the agents have been doing.

Scoped to the user's current project. Each panel is one aggregate query (GROUP BY in
the database, never a loop of queries), or for effects two: the whole hours the tallies
hold, and the rest live (`durability.tallies`); every number links to the list it counts:
the queue for open cases, the effects list for effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Min, Q
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from durability.accounts.access import AuthedRequest, project_access
from durability.accounts.roles import Perm
from durability.desk.effect_filter import effects_url
from durability.desk.queue import QueueQuery, awake, snoozed
from durability.models import Case, Effect, Project, Reason, Severity, State
from durability.tallies import (
    PROBLEM_CASES,
    STRENGTHS,
    CaseCounts,
    case_hours,
    settle_quantile,
    tallied_until,
    tally,
)

DAY = timedelta(days=1)
BUSIEST = 5
# The chart's ranges: (span, bar width, what the database truncates to before bucketing).
RANGES = {
    "1h": (timedelta(hours=1), timedelta(minutes=5), "minute"),
    "24h": (DAY, timedelta(hours=1), "hour"),
    "7d": (7 * DAY, timedelta(hours=6), "hour"),
}
# Stacking order, bottom up: settled outcomes first, what still needs attention on top.
CHART_STATES = [
    State.SUCCEEDED,
    State.FAILED,
    State.NOT_HAPPENED,
    State.COMPENSATED,
    State.ABANDONED,
    State.DENIED,
    State.PENDING,
    State.AWAITING_APPROVAL,
    State.TIMED_OUT,
]
# What "problems only" keeps (`?show=problems`): the effects that did not simply succeed or
# are not simply under way, so that a few failures are not slivers under a tall green bar.
PROBLEM_STATES = [
    State.FAILED,
    State.NOT_HAPPENED,
    State.COMPENSATED,
    State.ABANDONED,
    State.DENIED,
    State.TIMED_OUT,
]
# Columns of the cases table: at least this severity, as the queue's filter means it.
SEVERITY_COLUMNS = [
    (Severity.CRITICAL, "critical"),
    (Severity.HIGH, "high or worse"),
    (Severity.MEDIUM, "medium or worse"),
    (Severity.LOW, "all"),
]
# The SVG's geometry, in its own units (it scales to the page's width).
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 200, 34, 22, 8


@dataclass(frozen=True)
class Number:
    """A count and the list it counts."""

    n: int
    url: str
    label: str = ""


def queue_url(**values: Any) -> str:
    query = QueueQuery({k: v for k, v in values.items() if v is not None}, {})
    qs = query.query_string()
    return f"{reverse('queue')}?{qs}" if qs else reverse("queue")


# -- open cases --------------------------------------------------------------------------


@dataclass
class ReasonRow:
    reason: str
    # The open cases of this reason at least as severe as each column's severity.
    cells: list[Number]


def open_cases_table(
    project: Project, now: datetime
) -> tuple[list[ReasonRow], list[Number], Number, int]:
    """Open cases by reason and severity (one GROUP BY), the column totals, the snoozed ones
    and every open case. The table counts the cases awake at `now`, as the queue each cell
    links to shows them; the snoozed ones are counted beside it (with the queue's snoozed
    view), and the backlog's line starts from every open case."""
    found = (
        Case.objects.filter(project=project, closed=None)
        .values_list("reason", "severity")
        .annotate(n=Count("id"), asleep=Count("id", filter=snoozed(now)))
        .order_by()
    )
    counts: dict[tuple[str, int], int] = {}
    asleep = every = 0
    for reason, severity, n, snoozed_n in found:
        counts[(reason, severity)] = n - snoozed_n
        asleep += snoozed_n
        every += n

    def at_least(severity: int, reason: str | None = None) -> int:
        return sum(n for (r, s), n in counts.items() if s >= severity and reason in (None, r))

    def cell(severity: int, reason: str | None = None) -> Number:
        least = None if severity == Severity.LOW else severity
        return Number(at_least(severity, reason), queue_url(reason=reason, severity=least))

    rows = [
        ReasonRow(reason, [cell(s, reason) for s, _ in SEVERITY_COLUMNS])
        for reason in Reason.values
        if at_least(Severity.LOW, reason)
    ]
    rows.sort(key=lambda row: [-c.n for c in row.cells])
    totals = [cell(s) for s, _ in SEVERITY_COLUMNS]
    return rows, totals, Number(asleep, queue_url(snoozed=True)), every


def oldest_open_case(project: Project, now: datetime) -> Case | None:
    """The oldest case awake at `now` (a snoozed one waits by an operator's choice); walks
    case_queue_open_idx."""
    return (
        Case.objects.filter(awake(now), project=project, closed=None)
        .select_related("effect")
        .order_by("opened", "id")
        .first()
    )


# -- effects by state over time ------------------------------------------------------------


@dataclass
class Segment:
    state: str
    n: int
    y: float
    height: float


@dataclass
class Bar:
    x: float
    width: float
    start: datetime
    end: datetime
    total: int
    segments: list[Segment] = field(default_factory=list)
    label: str = ""


@dataclass
class Chart:
    range: str
    start: datetime
    bars: list[Bar]
    # Effects created in the range, per state, linked to the list of them.
    legend: list[tuple[str, Number]]
    ticks: list[tuple[float, int]]
    ranges: list[str]
    problems: bool = False
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    baseline: int = HEIGHT - BOTTOM

    @property
    def total(self) -> int:
        return sum(number.n for _, number in self.legend)


def default_range(project: Project, now: datetime) -> str:
    """The last hour for a project younger than an hour (a fresh demo), else the last day."""
    first = Effect.objects.filter(project=project).aggregate(first=Min("created"))["first"]
    return "1h" if first is not None and now - first < timedelta(hours=1) else "24h"


def _floor(moment: datetime, step: timedelta) -> datetime:
    epoch = datetime(2000, 1, 1, tzinfo=moment.tzinfo)
    return moment - (moment - epoch) % step


def _nice_ceiling(n: int) -> int:
    """The smallest of 1, 2 or 5 × 10^k that is at least n (the y axis' top)."""
    magnitude = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * magnitude >= n:
                return mantissa * magnitude
        magnitude *= 10


def effects_chart(
    project: Project,
    range_name: str,
    now: datetime,
    tallied: datetime | None = None,
    *,
    problems: bool = False,
) -> Chart:
    """Effects created in the range, per time bucket, stacked by the state they are in now
    (with `problems`, only those in PROBLEM_STATES, the y axis scaled to them).

    Hours from the tallies (and the hours not tallied, live), or for the last hour one
    GROUP BY on (minute created, state) over effect_project_created_idx; the database's
    minutes or hours are folded into the chart's buckets here.
    """
    span, step, trunc = RANGES[range_name]
    end = _floor(now, step) + step
    start = end - span
    measures = ("n", *PROBLEM_CASES) if problems else ("n",)
    if trunc == "hour":
        found = tally(
            project, start, None, by=("hour", "state"), measures=measures, tallied=tallied
        )
        counted = [(hour, state, counts) for (hour, state), counts in found.groups.items()]
    else:
        found = tally(project, start, None, by=("minute", "state"), measures=measures)
        counted = [(at, state, counts) for (at, state), counts in found.groups.items()]
    states: list[str] = list(PROBLEM_STATES if problems else CHART_STATES)
    rows = [(at, state, counts["n"]) for at, state, counts in counted if state in states]
    if problems:
        # Effects that succeeded, but late or twice: problems their state does not show.
        states += PROBLEM_CASES
        rows += [
            (at, reason, counts[reason])
            for at, state, counts in counted
            if state == State.SUCCEEDED
            for reason in PROBLEM_CASES
            if counts[reason]
        ]
    buckets = int(span / step)
    grid: list[dict[str, int]] = [{} for _ in range(buckets)]
    per_state: dict[str, int] = {}
    for at, state, n in rows:
        index = min(int((at - start) / step), buckets - 1)
        grid[index][state] = grid[index].get(state, 0) + n
        per_state[state] = per_state.get(state, 0) + n
    top = _nice_ceiling(max((sum(b.values()) for b in grid), default=0))
    plot_height = HEIGHT - BOTTOM - TOP
    slot = (WIDTH - LEFT) / buckets
    bars = []
    label_every = max(1, buckets // 6)
    for i, counts in enumerate(grid):
        bar_start = start + i * step
        bar = Bar(
            x=round(LEFT + i * slot + slot * 0.1, 2),
            width=round(slot * 0.8, 2),
            start=bar_start,
            end=bar_start + step,
            total=sum(counts.values()),
            label=_tick_label(bar_start, range_name) if i % label_every == 0 else "",
        )
        y = float(HEIGHT - BOTTOM)
        for state in states:
            if n := counts.get(state, 0):
                height = round(n / top * plot_height, 2)
                y = round(y - height, 2)
                bar.segments.append(Segment(state, n, y, height))
        bars.append(bar)
    legend = [
        (
            str(state),
            Number(
                per_state[state],
                effects_url(project=project.pk, state=State.SUCCEEDED, case=state, since=start)
                if state in PROBLEM_CASES
                else effects_url(project=project.pk, state=state, since=start),
            ),
        )
        for state in states
        if per_state.get(state)
    ]
    ticks = [(round(HEIGHT - BOTTOM - plot_height * f, 2), int(top * f)) for f in (0, 0.5, 1)]
    return Chart(range_name, start, bars, legend, ticks, list(RANGES), problems)


def _tick_label(moment: datetime, range_name: str) -> str:
    # In the operator's time zone, as every moment on a page (durability.templatetags.times).
    return timezone.localtime(moment).strftime("%a %H:%M" if range_name == "7d" else "%H:%M")


# -- the last day, evidence, the busiest -----------------------------------------------------


def last_day(project: Project, since: datetime) -> list[tuple[str, Number, Number]]:
    """Late successes and duplicate effects whose cases opened since `since`: how many,
    and how many of those cases are still open."""
    watched = [Reason.LATE_SUCCESS, Reason.DUPLICATE_EFFECT]
    found = {
        reason: (n, still_open)
        for reason, n, still_open in Case.objects.filter(
            project=project, reason__in=watched, opened__gte=since
        )
        .values_list("reason")
        .annotate(n=Count("id"), still_open=Count("id", filter=Q(closed=None)))
        .order_by()
    }
    return [
        (
            reason,
            Number(
                found.get(reason, (0, 0))[0],
                effects_url(project=project.pk, case=reason, since=since),
            ),
            Number(found.get(reason, (0, 0))[1], queue_url(reason=reason)),
        )
        for reason in watched
    ]


@dataclass
class Busy:
    name: str
    effects: Number
    open_cases: Number


@dataclass
class LastDay:
    """The effects created since `since`: by receipt strength, the busiest agents and
    targets (one tally)."""

    strengths: list[tuple[str, Number]]
    agents: list[Busy]
    targets: list[Busy]


def _busiest(counts: dict[str, int]) -> list[tuple[str, int]]:
    ranked = sorted(((name, n) for name, n in counts.items() if name and n), key=_by_count)
    return ranked[:BUSIEST]


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def last_day_effects(project: Project, since: datetime, tallied: datetime | None) -> LastDay:
    """Effects with a receipt of each strength (an effect may count under several), and the
    agents and target systems with the most effects, each with its open cases (as the
    queue filtered by that agent or target counts them)."""
    found = tally(
        project,
        since,
        None,
        by=("agent", "target"),
        measures=("n", *STRENGTHS),
        tallied=tallied,
    )
    strengths = [
        (strength, Number(n, effects_url(project=project.pk, strength=strength, since=since)))
        for strength in sorted(STRENGTHS)
        if (n := found.total(strength))
    ]
    agents = _busiest(found.per("agent"))
    targets = _busiest(found.per("target"))
    # The open cases (their partial index), by the agent and target copied onto them.
    open_cases = Case.objects.filter(project=project, closed=None).order_by()
    agent_cases = dict(
        open_cases.filter(agent__in=[name for name, _ in agents])
        .values_list("agent")
        .annotate(n=Count("id"))
    )
    target_cases = dict(
        open_cases.filter(target__in=[name for name, _ in targets])
        .values_list("target")
        .annotate(n=Count("id"))
    )
    return LastDay(
        strengths,
        [
            Busy(
                name,
                Number(n, effects_url(project=project.pk, agent=name, since=since)),
                Number(agent_cases.get(name, 0), queue_url(workflow=name)),
            )
            for name, n in agents
        ],
        [
            Busy(
                name,
                Number(n, effects_url(project=project.pk, target=name, since=since)),
                Number(target_cases.get(name, 0), queue_url(target=name)),
            )
            for name, n in targets
        ],
    )


# -- the backlog -----------------------------------------------------------------------------

# The backlog's ranges: the overview's 7 days read per day, the others per hour of a day.
BACKLOG_STEPS = {"1h": (DAY, timedelta(hours=1)), "24h": (DAY, timedelta(hours=1))}
BACKLOG_WEEK = (7 * DAY, DAY)
BACKLOG_HEIGHT, BACKLOG_LINE_HEIGHT = 160, 90


@dataclass(frozen=True)
class BacklogBar:
    x: float
    width: float
    start: datetime
    end: datetime
    opened: int
    settled: int
    opened_h: float
    settled_h: float
    still_open: int  # at the bucket's end
    label: str
    baseline: float = BACKLOG_HEIGHT - BOTTOM

    @property
    def opened_y(self) -> float:
        return round(self.baseline - self.opened_h, 2)

    @property
    def settled_y(self) -> float:
        return round(self.baseline - self.settled_h, 2)

    @property
    def settled_x(self) -> float:
        return round(self.x + self.width, 2)


@dataclass(frozen=True)
class SettleTime:
    reason: str
    settled: int
    median_ms: float | None
    p90_ms: float | None
    url: str


@dataclass
class Backlog:
    """Cases opened and settled per bucket, the open cases at each bucket's end, and how
    long cases took to settle by reason: read from the hourly case tallies."""

    start: datetime
    step: timedelta
    bars: list[BacklogBar]
    top: int
    line: str  # the open cases' polyline points
    open_top: int
    settle_times: list[SettleTime]
    width: int = WIDTH
    height: int = BACKLOG_HEIGHT
    line_height: int = BACKLOG_LINE_HEIGHT
    left: int = LEFT
    baseline: int = BACKLOG_HEIGHT - BOTTOM

    @property
    def opened(self) -> int:
        return sum(b.opened for b in self.bars)

    @property
    def settled(self) -> int:
        return sum(b.settled for b in self.bars)


def backlog(
    project: Project, range_name: str, now: datetime, tallied: datetime | None, open_now: int
) -> Backlog:
    """The backlog over the chart's range (a day per hour, or 7 days per day): three
    queries (`tallies.case_hours`), whatever the number of cases or effects."""
    span, step = BACKLOG_STEPS.get(range_name, BACKLOG_WEEK)
    end = _floor(now, timedelta(hours=1)) + timedelta(hours=1)
    start = end - span
    counts = case_hours(project, start, tallied)
    buckets = int(span / step)
    per_bucket = [CaseCounts() for _ in range(buckets)]
    per_reason: dict[str, CaseCounts] = {}
    for (hour, reason), found in counts.items():
        index = min(max(int((hour - start) / step), 0), buckets - 1)
        per_bucket[index].add(found.opened, found.settled, found.took)
        per_reason.setdefault(reason, CaseCounts()).add(0, found.settled, found.took)
    top = _nice_ceiling(max((max(c.opened, c.settled) for c in per_bucket), default=0))
    # The open cases at each bucket's end: today's, less what opened since, plus what settled.
    still_open, after = [], open_now
    for found in reversed(per_bucket):
        still_open.append(max(after, 0))
        after = after - found.opened + found.settled
    still_open.reverse()
    open_top = _nice_ceiling(max(still_open, default=0))
    plot = BACKLOG_HEIGHT - BOTTOM - TOP
    slot = (WIDTH - LEFT) / buckets
    label_every = max(1, buckets // 6)
    bars, points = [], []
    for i, found in enumerate(per_bucket):
        bar_start = start + i * step
        x = LEFT + i * slot
        bars.append(
            BacklogBar(
                x=round(x + slot * 0.1, 2),
                width=round(slot * 0.4, 2),
                start=bar_start,
                end=bar_start + step,
                opened=found.opened,
                settled=found.settled,
                opened_h=round(found.opened / top * plot, 2),
                settled_h=round(found.settled / top * plot, 2),
                still_open=still_open[i],
                label=_tick_label(bar_start, "7d" if step == DAY else "24h")
                if i % label_every == 0
                else "",
            )
        )
        y = BACKLOG_LINE_HEIGHT - 4 - still_open[i] / open_top * (BACKLOG_LINE_HEIGHT - 12)
        points.append(f"{x + slot / 2:.1f},{y:.1f}")
    times = [
        SettleTime(
            reason,
            found.settled,
            _ms(settle_quantile(found.took, 0.5)),
            _ms(settle_quantile(found.took, 0.9)),
            queue_url(reason=reason),
        )
        for reason, found in sorted(per_reason.items())
        if found.settled
    ]
    return Backlog(start, step, bars, top, " ".join(points), open_top, times)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


# -- the page --------------------------------------------------------------------------------


@login_required
@require_GET
def index(request: AuthedRequest) -> HttpResponse:
    """The current project's overview; `?range=1h|24h|7d` picks the chart's range, and
    `?show=problems` keeps only the problems in it."""
    access = project_access(request, Perm.VIEW)
    project = access.project
    now = timezone.now()
    range_name = request.GET.get("range", "")
    if range_name not in RANGES:
        range_name = default_range(project, now)
    day_ago = now - DAY
    tallied = tallied_until(project)
    reasons, severity_totals, asleep, every_open = open_cases_table(project, now)
    effects = last_day_effects(project, day_ago, tallied)
    context = {
        "project": project,
        "reasons": reasons,
        "severity_columns": [label for _, label in SEVERITY_COLUMNS],
        "severity_totals": severity_totals,
        "open_total": severity_totals[-1],
        "snoozed_total": asleep,
        "oldest": oldest_open_case(project, now),
        "chart": effects_chart(
            project, range_name, now, tallied, problems=request.GET.get("show") == "problems"
        ),
        "backlog": backlog(project, range_name, now, tallied, every_open),
        "last_day": last_day(project, day_ago),
        "strengths": effects.strengths,
        "agents": effects.agents,
        "targets": effects.targets,
    }
    return render(request, "durability/desk/overview.html", context)
