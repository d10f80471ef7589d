"""Run pages: the runs list, and a run's span tree beside its waterfall timeline.

Every page needs a login and shows only the runs of the user's current project (the
header's project switcher, as on the desk's pages); another project's run is a 404.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from durability.accounts.access import AuthedRequest, object_access, project_access
from durability.accounts.roles import Perm
from durability.inbound import EARLIEST, decimal_digits, number_param
from durability.models import Receipt
from durability.paging import Keyset, micros, moment
from trajectories import people
from trajectories.models import EffectLink, Run, RunStatus, Span

PAGE_SIZE = 50
# A run page renders at most about this many spans; deeper ones load when opened.
NODE_BUDGET = 250
# Children of one span shown at a time; the rest load on demand.
CHILD_PAGE = 100
# Waterfall bars are drawn on a 0..TIMELINE viewBox; CSS stretches it to the column.
TIMELINE = 1000
TREE_FIELDS = [
    "id",
    "run_id",
    "trace_id",
    "span_id",
    "parent_span_id",
    "kind",
    "operation",
    "name",
    "start",
    "end",
    "status",
    "request_model",
    "tool_name",
    "tool_call_id",
    "input_tokens",
    "output_tokens",
]
FILTERS = ["agent", "workflow", "version", "status"]


# The latest moment a filter may name: far ahead, and still a date in every time zone.
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _when(value: str, default: datetime | None) -> tuple[datetime | None, str | None]:
    """A datetime-local field (in the operator's time zone) as an aware datetime, or the
    default and an error."""
    if not value:
        return default, None
    try:
        parsed = datetime.fromisoformat(value)
        aware = parsed if parsed.tzinfo else timezone.make_aware(parsed)
        # In UTC, and shown again in the operator's zone: both must exist.
        utc = aware.astimezone(UTC)
    except (ValueError, OverflowError):
        return default, f"{value!r} is not a date and time"
    if not EARLIEST <= utc <= LATEST:
        return default, f"{value!r} is not between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}"
    return utc, None


# Runs newest first; the cursor (`?before=`) is the last run shown's `<started, µs since the
# epoch>-<id>`.
NEWEST = Keyset("-started", "-pk")


def _cursor(value: str) -> tuple[datetime, int] | None:
    """The keyset position `<started, µs since epoch>-<id>` of the last run shown."""
    at, _, pk = value.partition("-")
    try:
        return moment(decimal_digits(at)), decimal_digits(pk)
    except (ValueError, OverflowError):  # edited by hand, or past year 9999
        return None


def _cursor_of(run: Run) -> str:
    return f"{micros(run.started)}-{run.pk}"


@login_required
def runs(request: AuthedRequest) -> HttpResponse:
    """Runs in a time range (the last 24 hours unless given), newest first, keyset-paginated."""
    project = project_access(request, Perm.VIEW).project
    now = timezone.now()
    errors = {}
    since, errors["since"] = _when(request.GET.get("since", ""), now - timedelta(hours=24))
    until, errors["until"] = _when(request.GET.get("until", ""), None)
    chosen = {name: request.GET.get(name, "").strip() for name in FILTERS}
    qs = Run.objects.filter(project=project, started__gte=since)
    if until is not None:
        qs = qs.filter(started__lt=until)
    if chosen["agent"]:
        qs = qs.filter(agent=chosen["agent"])
    if chosen["workflow"]:
        qs = qs.filter(workflow=chosen["workflow"])
    if chosen["version"]:
        qs = qs.filter(workflow_version=chosen["version"])
    by_status = dict(qs.values_list("status").annotate(n=Count("id")).order_by())
    if chosen["status"] in RunStatus.values:
        qs = qs.filter(status=chosen["status"])
        total = by_status.get(chosen["status"], 0)
    else:
        total = sum(by_status.values())
    position = _cursor(request.GET.get("before", ""))
    found = NEWEST.page(qs, position, PAGE_SIZE)
    page = found.rows
    effects = dict(
        EffectLink.objects.filter(project=project, run__in=page)
        .values_list("run")
        .annotate(n=Count("effect"))
        .order_by()
    )
    waits = people.waits_of(project.pk, page)
    for run in page:
        run.effect_count = effects.get(run.pk, 0)  # type: ignore[attr-defined]
        run.waiting = waits.get(run.pk)  # type: ignore[attr-defined]
    query = request.GET.copy()
    query.pop("before", None)
    query["since"] = timezone.localtime(since).strftime("%Y-%m-%dT%H:%M") if since else ""
    context = {
        "runs": page,
        "chosen": chosen,
        "statuses": RunStatus.values,
        "since": query["since"],
        "until": request.GET.get("until", ""),
        "errors": {k: v for k, v in errors.items() if v},
        "total": total,
        "by_status": [(s, by_status.get(s, 0)) for s in RunStatus.values],
        "next_query": found.next(lambda run: f"{query.urlencode()}&before={_cursor_of(run)}"),
    }
    template = "trajectories/runs.html"
    if request.htmx and position is not None:
        template += "#rows"
    return render(request, template, context)


# An idle stretch of a run (no leaf span open, no event) longer than this many seconds, and
# than this share of the time spent working, is drawn as a break of BREAK_WIDTH, so that the
# work stays readable beside a wait of minutes.
BREAK_MIN_S = 5
BREAK_SHARE = 0.5
BREAK_WIDTH = 30
# At most this many breaks are drawn; shorter gaps beyond them are drawn to scale.
MAX_BREAKS = 8


@dataclass(frozen=True)
class Break:
    """An idle gap in the waterfall, compressed: where it is drawn and how long it was."""

    x: float
    seconds: float

    @property
    def ms(self) -> float:
        return self.seconds * 1000


@dataclass
class Scale:
    """Time to waterfall x (0..TIMELINE), linear but for the long idle gaps, each a break."""

    start: datetime
    end: datetime
    # (from, to, x at from, x per second) for each stretch drawn to scale.
    pieces: list[tuple[datetime, datetime, float, float]]
    breaks: list[Break]

    def x(self, at: datetime) -> float:
        for begin, end, x0, per in self.pieces:
            if at <= end:
                return x0 + max((at - begin).total_seconds(), 0) * per
        begin, end, x0, per = self.pieces[-1]
        return x0 + (end - begin).total_seconds() * per


def scale_of(busy: list[tuple[datetime, datetime]]) -> Scale:
    """The waterfall's scale for these busy stretches (spans, events): idle gaps longer than
    BREAK_MIN_S and than BREAK_SHARE of the time busy become breaks (the longest first)."""
    merged: list[list[datetime]] = []
    for begin, end in sorted(busy):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    start, end = merged[0][0], merged[-1][1]
    total = (end - start).total_seconds()
    working = sum((b - a).total_seconds() for a, b in merged)
    gaps = sorted(
        (
            ((b[0] - a[1]).total_seconds(), i)
            for i, (a, b) in enumerate(zip(merged, merged[1:], strict=False))
        ),
        reverse=True,
    )
    long = {
        i
        for seconds, i in gaps[:MAX_BREAKS]
        if seconds > BREAK_MIN_S and seconds > BREAK_SHARE * working
    }
    skipped = sum((merged[i + 1][0] - merged[i][1]).total_seconds() for i in long)
    drawn = max(total - skipped, 1e-6)
    per = (TIMELINE - BREAK_WIDTH * len(long)) / drawn
    pieces, breaks, x, begin = [], [], 0.0, start
    for i, (_, stop) in enumerate(merged):
        if i in long:
            pieces.append((begin, stop, x, per))
            x += (stop - begin).total_seconds() * per
            after = merged[i + 1][0]
            breaks.append(Break(round(x, 2), (after - stop).total_seconds()))
            x += BREAK_WIDTH
            begin = after
    pieces.append((begin, end, x, per))
    return Scale(start, end, pieces, breaks)


@dataclass
class Node:
    """A span in the rendered tree, with its bar on the waterfall."""

    span: Span
    x: float = 0
    width: float = 0
    children: list[Node] = field(default_factory=list)
    child_count: int = 0
    # Children not rendered yet: open the node to load them (offset of the next ones).
    lazy: bool = False
    more_offset: int | None = None
    effects: list[EffectLink] = field(default_factory=list)


@dataclass
class Tree:
    spans: list[Span]
    children: dict[tuple[str, str], list[Span]]
    roots: list[Span]
    start: datetime
    scale: Scale
    # Effects by the (trace_id, span_id) of their tool span, else of their model span.
    effects: dict[tuple[str, str], list[EffectLink]]
    loose_effects: list[EffectLink]

    def node(self, span: Span) -> Node:
        x = self.scale.x(span.start)
        return Node(
            span,
            x=round(x, 2),
            # A span not ended yet (an agent waiting on a person) reaches the run's latest
            # moment: its bar shows how long it has been open.
            width=max(round(self.scale.x(span.end or self.scale.end) - x, 2), 1),
            child_count=len(self.children.get((span.trace_id, span.span_id), [])),
            effects=self.effects.get((span.trace_id, span.span_id), []),
        )

    def kids(self, span: Span) -> list[Span]:
        return self.children.get((span.trace_id, span.span_id), [])

    def ancestors(self, span: Span) -> set[int]:
        by_id = {(s.trace_id, s.span_id): s for s in self.spans}
        seen: set[int] = set()
        parent = by_id.get((span.trace_id, span.parent_span_id))
        while parent is not None and parent.pk not in seen:
            seen.add(parent.pk)
            parent = by_id.get((parent.trace_id, parent.parent_span_id))
        return seen

    def render(
        self, top: list[Span], offset: int, opened: set[int]
    ) -> tuple[list[Node], int | None]:
        """Nodes for top[offset:], breadth first until the budget is spent.

        Spans in `opened` (the ancestors of a deep-linked span) open regardless.
        """
        page = top[offset : offset + CHILD_PAGE]
        more = offset + CHILD_PAGE if len(top) > offset + CHILD_PAGE else None
        nodes = [self.node(s) for s in page]
        budget = NODE_BUDGET - len(nodes)
        queue = deque(nodes)
        while queue:
            node = queue.popleft()
            kids = self.kids(node.span)
            if not kids:
                continue
            if budget <= 0 and node.span.pk not in opened:
                node.lazy = True
                continue
            node.children = [self.node(s) for s in kids[:CHILD_PAGE]]
            node.more_offset = CHILD_PAGE if len(kids) > CHILD_PAGE else None
            budget -= len(node.children)
            queue.extend(node.children)
        return nodes, more


def run_spans(run: Run) -> QuerySet[Span]:
    """The run's spans, read from the partitions of its first to its last day only."""
    if run.first_day is None or run.last_day is None:
        return Span.objects.none()
    return Span.objects.filter(
        project_id=run.project_id, run=run, day__range=(run.first_day, run.last_day)
    )


def _receipts_of(project_id: int) -> Prefetch[Any]:
    """The linked effects' receipts, read by their project as well as their effects."""
    return Prefetch("effect__receipts", Receipt.objects.filter(project_id=project_id))


def _tree(run: Run, events: list[people.Event]) -> Tree:
    """All spans of the run in one query, arranged as a forest; effects by their span."""
    spans = list(run_spans(run).only(*TREE_FIELDS).order_by("start", "id"))
    present = {(s.trace_id, s.span_id) for s in spans}
    children: dict[tuple[str, str], list[Span]] = defaultdict(list)
    roots = []
    for s in spans:
        if s.parent_span_id and (s.trace_id, s.parent_span_id) in present:
            children[(s.trace_id, s.parent_span_id)].append(s)
        else:
            roots.append(s)
    start = min((s.start for s in spans), default=run.started)
    # Idle is when no leaf span works and nothing happens to the run's effects: an agent's
    # own span stays open while it waits on a person.
    busy = [(s.start, s.end or s.start) for s in spans if (s.trace_id, s.span_id) not in children]
    busy += [(e.at, e.at) for e in events] or [(start, start)]
    effects: dict[tuple[str, str], list[EffectLink]] = defaultdict(list)
    loose = []
    links = (
        EffectLink.objects.filter(project_id=run.project_id, run=run)
        .select_related("effect")
        .prefetch_related(_receipts_of(run.project_id))
        .order_by("effect_id")
    )
    for link in links:
        if link.tool_span_id:
            effects[(link.tool_trace_id, link.tool_span_id)].append(link)
        elif link.model_span_id:
            effects[(link.model_trace_id, link.model_span_id)].append(link)
        else:
            loose.append(link)
    # A link whose span is not among the run's (dropped by retention) is shown on its own.
    loose += [link for key, kept in effects.items() if key not in present for link in kept]
    return Tree(spans, children, roots, start, scale_of(busy), effects, loose)


@login_required
def run(request: AuthedRequest, run_pk: int, span_pk: int | None = None) -> HttpResponse:
    """The run page; `?root=<span>` (and `offset`) shows one span's children.

    htmx asks for those children as a fragment, to open a collapsed span or show more.
    With `span_pk`, the page opens with that span's detail and the tree down to it.
    """
    found, _ = object_access(
        request, Perm.VIEW, Run.objects.select_related("project"), run_pk, current=True
    )
    selected = None
    if span_pk is not None:
        selected = run_spans(found).filter(pk=span_pk).first()
        if selected is None:
            raise Http404("No such span in this run")
        if request.htmx:
            detail = {"run": found, **_span_context(selected)}
            return render(request, "trajectories/run.html#span", detail)
    events = people.events_of(found)
    tree = _tree(found, events)
    waiting = people.waits_of(found.project_id, [found]).get(found.pk)
    root_pk = number_param(request.GET.get("root"))
    offset = number_param(request.GET.get("offset")) or 0
    root = next((s for s in tree.spans if s.pk == root_pk), None)
    if root_pk is not None and root is None:
        raise Http404("No such span in this run")
    top = tree.kids(root) if root else tree.roots
    opened = tree.ancestors(selected) if selected else set()
    nodes, more = tree.render(top, offset, opened)
    context: dict[str, Any] = {
        "run": found,
        "nodes": nodes,
        "more_offset": more,
        "root": root,
        "tree": tree,
        "selected": selected,
        "loose_effects": tree.loose_effects,
        "timeline": TIMELINE,
        "waiting": waiting,
        "events": [(e, round(tree.scale.x(e.at), 2)) for e in events],
        "breaks": tree.scale.breaks,
        "break_width": BREAK_WIDTH,
    }
    if selected is not None:
        context.update(_span_context(selected))
    if request.htmx and (root is not None or offset):
        return render(request, "trajectories/_nodes.html", context)
    return render(request, "trajectories/run.html", context)


def _span_context(span: Span) -> dict[str, Any]:
    # Through the run's links (link.run is the run of the tool span, else the model span's).
    named = Q(tool_trace_id=span.trace_id, tool_span_id=span.span_id) | Q(
        model_trace_id=span.trace_id, model_span_id=span.span_id
    )
    links = (
        EffectLink.objects.filter(named, project_id=span.project_id, run_id=span.run_id)
        .select_related("effect")
        .prefetch_related(_receipts_of(span.project_id))
        .order_by("effect_id")
    )
    parent = (
        Span.objects.filter(
            project_id=span.project_id,
            trace_id=span.trace_id,
            span_id=span.parent_span_id,
            day=span.day,
        )
        .only("id", "run_id", "name")
        .first()
        if span.parent_span_id
        else None
    )
    return {
        "span": span,
        "span_effects": list(links),
        "parent": parent,
        "shown": {
            name: json.dumps(getattr(span, name), indent=2, ensure_ascii=False)
            for name in ("input", "output", "attributes", "resource")
            if getattr(span, name) not in (None, {}, "")
        },
    }
