"""Links between effects and trajectories, whatever order intents, receipts and spans come in.

An effect links to its tool span by (trace_id, span_id) — the span it was recorded in,
or the nearest tool span above it (the outer of two of the same tool: a framework's tool span
around an MCP client's) — or by tool_call_id; and to the model span that asked
for the tool: the one whose output holds a tool_call part with that id, else the nearest
model span before the tool call in the same trace.

Ordering: the effect side commits the effect's keys into its EffectLink and then reads
spans; the span side commits spans and then reads EffectLinks. Whichever commits last
sees the other's rows, and resolving locks the links first and reads the spans after, in a
statement of its own (LINKS_LOCK, then LINKS_RESOLVE), so the last resolution reads
everything committed before it. Either side resolves any number of links in one round trip
(`links_resolve`, `links_refresh`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from durability import rows
from durability.models import EFFECT_NAMES_TRAJECTORY, Effect
from durability.pipeline import Statement
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


def effect_link_record(*, effect_id: int) -> bool:
    """Copy the effect's keys into its link, commit, then resolve the link; whether the
    effect exists."""
    effect = Effect.objects.filter(pk=effect_id).first()
    if effect is None:
        return False
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
    links_resolve(effect_ids=[effect_id])
    return True


# -- resolving: one statement for any number of links ------------------------------------

# The links to resolve, locked in key order, their ids kept for LINKS_RESOLVE in a setting of
# the transaction: those of `effect_ids`, and those a span batch may complete (through
# link_trace_idx, link_tool_call_idx and link_run_key_idx). Locked first, read after: the
# resolution that follows, a statement of its own, reads everything committed before it
# holds the locks (a statement's snapshot is taken when it starts), so the last resolution of
# a link is complete (the module's docstring).
LINKS_LOCK = (
    "WITH locked AS (SELECT effect_id FROM trajectories_effectlink "
    "WHERE effect_id = ANY(%s::bigint[]) OR (project_id = %s::bigint "
    "AND (trace_id = ANY(%s::text[]) OR tool_call_id = ANY(%s::text[]) "
    "OR run_key = ANY(%s::text[]))) ORDER BY effect_id FOR UPDATE) "
    "SELECT set_config('tallybook.links', COALESCE(string_agg(effect_id::text, ','), ''), true) "
    "FROM locked"
)
# What a resolution reads of a span.
_SPAN = (
    "id",
    "project_id",
    "trace_id",
    "span_id",
    "parent_span_id",
    "kind",
    "tool_name",
    "tool_call_id",
    "start",
    "day",
    "run_id",
)


def _span(alias: str) -> str:
    return ", ".join(f'{alias}."{c}"' for c in _SPAN)


def _same_trace(alias: str, of: str) -> str:
    """Span `alias` in the trace and partition of span `of`."""
    return (
        f"{alias}.project_id = {of}.project_id AND {alias}.trace_id = {of}.trace_id "
        f"AND {alias}.day = {of}.day"
    )


# The links LINKS_LOCK locked, each resolved from the spans stored now, in one statement, as
# the module's docstring says: `up`, the span the effect was recorded in and the spans above
# it up to the nearest tool span (MAX_ANCESTORS at most; the trace's spans are in one
# partition, its RunTrace.day); `anchor`, the outer of two tool spans of one tool, else that
# tool span, else the span recorded in; `tool`, the anchor if a tool span, else the latest tool
# span running the link's tool call id (span_tool_call_idx); `place`, the anchor else the tool
# span; `model`, the latest span asking for the tool call (requested_call_id_idx; those of
# the place's trace first), else the latest model span started before the place in its trace
# (span_model_by_trace_idx); the run, of the tool span, the place or the model span, else the
# run the link's run key names. Parameter: the time resolved.
LINKS_RESOLVE = f"""WITH RECURSIVE due AS (
    SELECT * FROM trajectories_effectlink WHERE effect_id = ANY(
        string_to_array(current_setting('tallybook.links'), ',')::bigint[])
), up AS (
    SELECT due.effect_id, 0 AS depth, {_span("span")} FROM due
    JOIN trajectories_runtrace trace
        ON trace.project_id = due.project_id AND trace.trace_id = due.trace_id
    JOIN trajectories_span span ON span.project_id = due.project_id
        AND span.trace_id = due.trace_id AND span.day = trace.day AND span.span_id = due.span_id
    WHERE due.trace_id <> '' AND due.span_id <> ''
    UNION ALL
    SELECT up.effect_id, up.depth + 1, {_span("span")} FROM up
    JOIN trajectories_span span ON {_same_trace("span", "up")}
        AND span.span_id = up.parent_span_id
    WHERE up.depth < {MAX_ANCESTORS} AND up.kind <> 'tool' AND up.parent_span_id <> ''
), found AS (
    SELECT due.effect_id, due.project_id, due.tool_call_id, due.run_key,
        tool.trace_id AS tool_trace_id, tool.span_id AS tool_span_id,
        tool.tool_call_id AS tool_tool_call_id, tool.run_id AS tool_run_id,
        place.id AS place_id, place.trace_id AS place_trace_id, place.day AS place_day,
        place.start AS place_start, place.run_id AS place_run_id
    FROM due
    LEFT JOIN LATERAL (
        SELECT * FROM (
            SELECT 0 AS rank, {_span("wrapping")} FROM up below
            JOIN trajectories_span wrapping ON {_same_trace("wrapping", "below")}
                AND wrapping.span_id = below.parent_span_id
            WHERE below.effect_id = due.effect_id AND below.kind = 'tool'
                AND below.parent_span_id <> '' AND wrapping.kind = 'tool'
                AND wrapping.tool_name = below.tool_name
            UNION ALL
            SELECT 1, {_span("up")} FROM up WHERE up.effect_id = due.effect_id AND up.kind = 'tool'
            UNION ALL
            SELECT 2, {_span("up")} FROM up WHERE up.effect_id = due.effect_id AND up.depth = 0
        ) AS candidate ORDER BY rank LIMIT 1
    ) AS anchor ON true
    LEFT JOIN LATERAL (
        SELECT * FROM (
            SELECT 0 AS rank, {_span("anchor")} WHERE anchor.kind = 'tool'
            UNION ALL (
                SELECT 1, {_span("span")} FROM trajectories_span span
                WHERE span.project_id = due.project_id AND span.tool_call_id = due.tool_call_id
                    AND span.tool_call_id <> '' AND span.kind = 'tool'
                ORDER BY span.start DESC, span.id DESC LIMIT 1
            )
        ) AS candidate ORDER BY rank LIMIT 1
    ) AS tool ON true
    LEFT JOIN LATERAL (
        SELECT * FROM (
            SELECT 0 AS rank, {_span("anchor")} WHERE anchor.id IS NOT NULL
            UNION ALL
            SELECT 1, {_span("tool")} WHERE tool.id IS NOT NULL
        ) AS candidate ORDER BY rank LIMIT 1
    ) AS place ON true
), resolved AS (
    SELECT found.effect_id,
        COALESCE(
            (SELECT run.id FROM trajectories_run run
                WHERE run.id = COALESCE(found.tool_run_id, found.place_run_id, model.run_id)),
            (SELECT run.id FROM trajectories_run run WHERE found.run_key <> ''
                AND run.project_id = found.project_id AND run.run_id = found.run_key)
        ) AS run_id,
        found.tool_trace_id, found.tool_span_id,
        model.trace_id AS model_trace_id, model.span_id AS model_span_id
    FROM found
    LEFT JOIN LATERAL (
        SELECT * FROM (
            (
                SELECT 0 AS rank, {_span("span")} FROM trajectories_requestedtoolcall asked
                JOIN trajectories_runtrace trace
                    ON trace.project_id = asked.project_id AND trace.trace_id = asked.trace_id
                JOIN trajectories_span span ON span.project_id = asked.project_id
                    AND span.trace_id = asked.trace_id AND span.day = trace.day
                    AND span.span_id = asked.span_id
                WHERE asked.project_id = found.project_id AND asked.tool_call_id
                    = COALESCE(NULLIF(found.tool_call_id, ''), found.tool_tool_call_id, '')
                    AND asked.tool_call_id <> ''
                ORDER BY (span.trace_id = found.place_trace_id) IS TRUE DESC,
                    span.start DESC, span.id DESC
                LIMIT 1
            )
            UNION ALL (
                SELECT 1, {_span("span")} FROM trajectories_span span
                WHERE found.place_id IS NOT NULL AND span.project_id = found.project_id
                    AND span.trace_id = found.place_trace_id AND span.day = found.place_day
                    AND span.kind = 'model' AND span.start <= found.place_start
                    AND span.id <> found.place_id
                ORDER BY span.start DESC, span.id DESC LIMIT 1
            )
        ) AS candidate ORDER BY rank LIMIT 1
    ) AS model ON true
)
UPDATE trajectories_effectlink link SET
    run_id = resolved.run_id,
    tool_trace_id = COALESCE(resolved.tool_trace_id, ''),
    tool_span_id = COALESCE(resolved.tool_span_id, ''),
    model_trace_id = COALESCE(resolved.model_trace_id, ''),
    model_span_id = COALESCE(resolved.model_span_id, ''),
    resolved = CASE WHEN resolved.run_id IS NOT NULL OR resolved.tool_span_id IS NOT NULL
        OR resolved.model_span_id IS NOT NULL THEN %s::timestamptz END
FROM resolved WHERE link.effect_id = resolved.effect_id
RETURNING link.effect_id"""


def links_resolve(*, effect_ids: list[int]) -> list[int]:
    """Resolve the links of `effect_ids` again, however many, in one round trip; returns
    those that exist."""
    return _resolved(effect_ids, None, Touched())


def links_refresh(*, project_id: int, touched: Touched) -> list[int]:
    """After a batch of spans or runs committed: resolve the links what it stored may
    complete, however many, in one round trip (none when it stored nothing); returns them.
    A refresh lost (the process died after the batch's commit) is made up for by
    `links_repair`."""
    if not touched:
        return []
    return _resolved([], project_id, touched)


def _resolved(effect_ids: list[int], project_id: int | None, touched: Touched) -> list[int]:
    keys = [sorted(touched.trace_ids), sorted(touched.tool_call_ids), sorted(touched.run_keys)]
    if connection.vendor != "postgresql":
        if project_id is not None:
            effect_ids = list(
                EffectLink.objects.filter(project_id=project_id)
                .filter(
                    Q(trace_id__in=keys[0]) | Q(tool_call_id__in=keys[1]) | Q(run_key__in=keys[2])
                )
                .order_by("pk")
                .values_list("pk", flat=True)
            )
        return [effect_id for effect_id in effect_ids if _link_resolve_orm(effect_id)]
    # One pipeline: in one transaction of its own (or the caller's), the locks, then the
    # resolution reading what was committed before them.
    lock = Statement(LINKS_LOCK, [effect_ids, project_id, *keys])
    resolve = Statement(LINKS_RESOLVE, [timezone.now()])
    rows.send([lock, resolve])
    return sorted(effect_id for (effect_id,) in resolve.rows)


def _link_resolve_orm(effect_id: int) -> bool:
    """LINKS_RESOLVE with the ORM (SQLite, the demo), for one link; whether it exists."""
    with transaction.atomic():
        link = EffectLink.objects.select_for_update().filter(pk=effect_id).first()
        if link is None:
            return False
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
    return True


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


# What a span batch sending spans again adds to its upsert (ingest.SPAN_UPSERT_FOLLOWED, after
# the CTE `stored` of the spans it wrote: trace_id, span_id, run_id): the effect links taking
# their run from a span it writes (EffectLink.run_span: the tool span, else the span the
# effect was recorded in, else the model span) take the run the span is in now, so that a
# link follows its span to another run in the batch's transaction, and in its round trip (a
# data-modifying CTE). Such a link names one of the batch's traces or tool call ids (its own
# span and tool span are in its trace, or its tool span runs its tool call id, or its model
# span asked for it), found as LINKS_LOCK finds them: link_trace_idx, link_tool_call_idx.
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
