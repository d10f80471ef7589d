"""Links between effects and trajectories, whatever order intents, receipts and spans come in.

An effect links to its tool span by (trace_id, span_id) — the span it was recorded in,
or the nearest tool span above it (the outer of two of the same tool: a framework's tool span
around an MCP client's) — or by tool_call_id; and to the model span that asked
for the tool: the one whose output holds a tool_call part with that id, else the nearest
model span before the tool call in the same trace.

Ordering: the effect side commits the effect's keys into its EffectLink and then reads
spans; the span side commits spans and then reads EffectLinks. Whichever commits last
sees the other's rows, and resolving holds the link's row lock, so the last resolution
reads everything committed before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from durability.models import EFFECT_NAMES_TRAJECTORY, Effect
from trajectories.models import (
    EffectLink,
    RequestedToolCall,
    Run,
    RunTrace,
    Span,
    SpanKind,
    spans_named,
)
from trajectories.semconv import SpanData

# How far up the span tree an effect recorded inside a tool call's child span looks.
MAX_ANCESTORS = 32
# The repair pass looks at effects created this recently, and links at most this many.
REPAIR_WINDOW = timedelta(days=1)
REPAIR_BATCH = 200


@dataclass
class Touched:
    """What a batch stored that effect links may be waiting for."""

    trace_ids: set[str] = field(default_factory=set)
    tool_call_ids: set[str] = field(default_factory=set)
    run_keys: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.trace_ids or self.tool_call_ids or self.run_keys)


def effect_link_record(*, effect_id: int) -> EffectLink | None:
    """Copy the effect's keys into its link, commit, then resolve the link."""
    effect = Effect.objects.filter(pk=effect_id).first()
    if effect is None:
        return None
    trace_id, span_id = effect.trace_id, effect.span_id
    if not trace_id:
        # An effect whose intent carried no trace context: its receipt may have.
        receipt = (
            effect.receipts.filter(project_id=effect.project_id)
            .exclude(trace_id="")
            .order_by("-received", "-id")
            .first()
        )
        if receipt is not None:
            trace_id, span_id = receipt.trace_id, receipt.span_id
    EffectLink.objects.update_or_create(
        effect=effect,
        defaults={
            "project_id": effect.project_id,
            "run_key": effect.run_id,
            "trace_id": trace_id,
            "span_id": span_id,
            "tool_call_id": effect.tool_call_id,
        },
    )
    return link_resolve(effect_id=effect_id)


def link_resolve(*, effect_id: int) -> EffectLink | None:
    """Find the link's run, tool span and model span from the spans stored now."""
    with transaction.atomic():
        link = EffectLink.objects.select_for_update().filter(pk=effect_id).first()
        if link is None:
            return None
        anchor = _anchor(link)
        tool = anchor if anchor is not None and anchor.kind == SpanKind.TOOL else None
        if tool is None and link.tool_call_id:
            tool = (
                Span.objects.filter(
                    project_id=link.project_id, tool_call_id=link.tool_call_id, kind=SpanKind.TOOL
                )
                # Spelled out so that the partial index on tool_call_id <> '' applies.
                .exclude(tool_call_id="")
                .order_by("-start", "-id")
                .first()
            )
            anchor = anchor or tool
        model = _model_span(link, tool, anchor)
        # The run of the span EffectLink.run_span names, which ingest moves the link with.
        gives_run = tool or anchor or model
        run = gives_run.run if gives_run else None
        if run is None and link.run_key:
            run = Run.objects.filter(project_id=link.project_id, run_id=link.run_key).first()
        link.run = run
        link.tool_trace_id, link.tool_span_id = (tool.trace_id, tool.span_id) if tool else ("", "")
        link.model_trace_id, link.model_span_id = (
            (model.trace_id, model.span_id) if model else ("", "")
        )
        link.resolved = timezone.now() if (run or tool or model) else None
        link.save(update_fields=[*LINK_FIELDS, "resolved"])
        # What the pages read through tool_span and model_span: found already.
        link._spans = {(s.trace_id, s.span_id): s for s in (tool, model) if s is not None}
    return link


# What a resolution writes, apart from when.
LINK_FIELDS = ["run", "tool_trace_id", "tool_span_id", "model_trace_id", "model_span_id"]


def _anchor(link: EffectLink) -> Span | None:
    """The span the effect was recorded in, or the nearest tool span above it."""
    if not (link.trace_id and link.span_id):
        return None
    spans = Span.objects.select_related("run").filter(
        project_id=link.project_id, trace_id=link.trace_id, day__in=_days(link, link.trace_id)
    )
    found = spans.filter(span_id=link.span_id).first()
    span = found
    for _ in range(MAX_ANCESTORS):
        if span is None or span.kind == SpanKind.TOOL or not span.parent_span_id:
            break
        span = spans.filter(span_id=span.parent_span_id).first()
    if span is None or span.kind != SpanKind.TOOL:
        return found
    # One call seen at two layers: a framework's tool span around an MCP client's tools/call
    # span of the same tool. The outer one carries the model's tool call id.
    outer = spans.filter(span_id=span.parent_span_id).first() if span.parent_span_id else None
    if outer is not None and outer.kind == SpanKind.TOOL and outer.tool_name == span.tool_name:
        return outer
    return span


def _days(link: EffectLink, trace_id: str) -> QuerySet[RunTrace, Any]:
    """The partition day of a trace, as a subquery: the spans' query reads one partition."""
    return RunTrace.objects.filter(project_id=link.project_id, trace_id=trace_id).values("day")


def _model_span(link: EffectLink, tool: Span | None, anchor: Span | None) -> Span | None:
    call_id = link.tool_call_id or (tool.tool_call_id if tool else "")
    if call_id:
        asking = RequestedToolCall.objects.filter(project_id=link.project_id, tool_call_id=call_id)
        asked = list(
            spans_named(link.project_id, asking.values_list("trace_id", "span_id")).values()
        )
        # Tool call ids are unique within a conversation, not across all of them.
        same_trace = [s for s in asked if anchor is not None and s.trace_id == anchor.trace_id]
        candidates = same_trace or asked
        if candidates:
            return max(candidates, key=lambda s: (s.start, s.pk))
    if anchor is None:
        return None
    return (
        Span.objects.select_related("run")
        .filter(
            project_id=link.project_id,
            trace_id=anchor.trace_id,
            day=anchor.day,
            kind=SpanKind.MODEL,
            start__lte=anchor.start,
        )
        .exclude(pk=anchor.pk)
        .order_by("-start", "-id")
        .first()
    )


# The links a span batch may complete, through link_trace_idx, link_tool_call_idx and
# link_run_key_idx.
LINKS_WAITING = (
    f"SELECT effect_id FROM {EffectLink._meta.db_table} WHERE project_id = %s "
    "AND (trace_id = ANY(%s) OR tool_call_id = ANY(%s) OR run_key = ANY(%s))"
)


def links_waiting(*, project_id: int, touched: Touched) -> list[int]:
    """The effects whose links the spans or runs just stored may complete: one statement,
    whatever their number. Call after the spans' transaction has committed."""
    if not touched:
        return []
    keys = [list(touched.trace_ids), list(touched.tool_call_ids), list(touched.run_keys)]
    if connection.vendor == "postgresql":
        # A batch touches hundreds of ids: three array parameters, not one per id.
        with connection.cursor() as cursor:
            cursor.execute(LINKS_WAITING, [project_id, *keys])
            return [row[0] for row in cursor.fetchall()]
    return list(
        EffectLink.objects.filter(project_id=project_id)
        .filter(Q(trace_id__in=keys[0]) | Q(tool_call_id__in=keys[1]) | Q(run_key__in=keys[2]))
        .values_list("pk", flat=True)
    )


def links_resolve(*, effect_ids: list[int]) -> int:
    """Resolve the links of `effect_ids` again (each in its own short transaction, holding
    only its own row's lock); returns how many still exist."""
    return sum(link_resolve(effect_id=effect_id) is not None for effect_id in effect_ids)


# What a span batch sending spans again adds to its upsert (ingest.SPAN_UPSERT_FOLLOWED, after
# the CTE `stored` of the spans it wrote: trace_id, span_id, run_id): the effect links taking
# their run from a span it writes (EffectLink.run_span: the tool span, else the span the
# effect was recorded in, else the model span) take the run the span is in now, so that a
# link follows its span to another run in the batch's transaction, and in its round trip (a
# data-modifying CTE). Such a link names one of the batch's traces or tool call ids (its own
# span and tool span are in its trace, or its tool span runs its tool call id, or its model
# span asked for it), found as LINKS_WAITING finds them: link_trace_idx, link_tool_call_idx.
# Parameters: `links_follow_params`.
LINKS_FOLLOW = (
    ", followed AS (UPDATE trajectories_effectlink link SET run_id = stored.run_id FROM stored "
    "WHERE link.project_id = %s "
    "AND (link.trace_id = ANY(%s::text[]) OR link.tool_call_id = ANY(%s::text[])) "
    "AND CASE WHEN link.tool_span_id <> '' THEN link.tool_trace_id "
    "WHEN link.span_id <> '' THEN link.trace_id ELSE link.model_trace_id END = stored.trace_id "
    "AND CASE WHEN link.tool_span_id <> '' THEN link.tool_span_id "
    "WHEN link.span_id <> '' THEN link.span_id ELSE link.model_span_id END = stored.span_id "
    "AND link.run_id IS DISTINCT FROM stored.run_id) "
)


def _follow_keys(spans: list[SpanData]) -> tuple[list[str], list[str]]:
    """The batch's trace ids and tool call ids (those run and those asked for): where the
    links its spans gave their runs are looked for."""
    calls = {s.tool_call_id for s in spans if s.tool_call_id}
    calls.update(c for s in spans for c in s.requested_calls)
    return sorted({s.trace_id for s in spans}), sorted(calls)


def links_follow_params(project_id: int, spans: list[SpanData]) -> list[Any]:
    """LINKS_FOLLOW's parameters, for a batch of `spans` of project `project_id`."""
    return [project_id, *_follow_keys(spans)]


def links_follow(
    project_id: int, stored: dict[tuple[str, str], int | None], spans: list[SpanData]
) -> None:
    """LINKS_FOLLOW with the ORM (SQLite, the demo), after the batch's `spans` were written:
    `stored` {(trace_id, span_id): run id} of the spans written."""
    traces, calls = _follow_keys(spans)
    waiting = EffectLink.objects.filter(project_id=project_id).filter(
        Q(trace_id__in=traces) | Q(tool_call_id__in=calls)
    )
    for link in waiting:
        run = stored.get(link.run_span)
        if run is not None and run != link.run_id:
            link.run_id = run
            link.save(update_fields=["run"])


def links_move(*, source: Run, target: Run) -> None:
    """The links of run `source`, merged into `target`, go with it."""
    EffectLink.objects.filter(run=source).update(run=target)


def links_repair(*, limit: int = REPAIR_BATCH) -> list[int]:
    """Link the recent effects whose linking was lost; returns their ids, newest first.

    Redis carries the link jobs and a crash can come between a span batch's commit and
    its links_refresh (trajectories.jobs), or the job it enqueued can be lost: an effect
    that names a run, trace or tool call then has no link yet, or an unresolved one
    although what it waits for is stored. One query walks effect_link_repair_idx over the
    last REPAIR_WINDOW; links still waiting for their spans are not taken again, so they
    cannot crowd out the lost ones.
    """
    since = timezone.now() - REPAIR_WINDOW
    link = EffectLink.objects.filter(pk=OuterRef("pk"))
    # What an unresolved link waits for, found through the indexes its resolution uses.
    keys = {"project_id": OuterRef("project_id")}
    stored = (
        Exists(
            Span.objects.filter(**keys, trace_id=OuterRef("trace_id"), span_id=OuterRef("span_id"))
        )
        | Exists(
            Span.objects.filter(
                **keys, tool_call_id=OuterRef("tool_call_id"), kind=SpanKind.TOOL
            ).exclude(tool_call_id="")
        )
        | Exists(RequestedToolCall.objects.filter(**keys, tool_call_id=OuterRef("tool_call_id")))
        | Exists(Run.objects.filter(**keys, run_id=OuterRef("run_key")))
    )
    due = list(
        Effect.objects.filter(EFFECT_NAMES_TRAJECTORY, created__gte=since)
        .filter(~Exists(link) | Exists(link.filter(resolved=None).filter(stored)))
        .order_by("-created")
        .values_list("pk", flat=True)[:limit]
    )
    for effect_id in due:
        effect_link_record(effect_id=effect_id)
    return due


def effect_trajectory(sender: object, *, effect: Effect, **_: object) -> dict[str, str | None]:
    """The run id and the tool and model span ids (hex) of a linked effect, for the API's
    effect detail (durability.api.signals.effect_detail)."""
    link = EffectLink.objects.filter(pk=effect.pk).select_related("run").first()
    return {
        "run_id": link.run.run_id if link and link.run else None,
        "tool_span_id": (link.tool_span_id or None) if link else None,
        "model_span_id": (link.model_span_id or None) if link else None,
    }
