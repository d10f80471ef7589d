"""Storing runs and spans: one transaction per batch, bulk writes, redaction before storage.

Every ingest request takes one of a few ingest slots of its project (`slot`, a PostgreSQL
advisory lock held until the answer), so that one project cannot take every web thread or
database connection; a request that finds none free, or a database too slow to answer, is
told to come back later. A large batch also takes the web process's large-batch gate
(`large_batch`): one process works on one at a time, so that another request it accepts is
not left to share its interpreter with several batches of seconds of CPU each.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import CharField
from django.utils import timezone
from pydantic import ValidationError

from durability.api.decorators import DATABASE_AWAY, DATABASE_RETRY_AFTER, field_errors
from durability.inbound import unstorable_at
from durability.models import Project
from durability.redaction import (
    ATTRIBUTE_CAP,
    IO_CAP,
    NONE,
    Extras,
    attributes_text,
    distinct,
    extras_of,
    json_text,
    redact,
    scrub_text,
    suspect,
)
from trajectories.models import (
    EffectLink,
    RequestedToolCall,
    Run,
    RunTrace,
    SeenEvent,
    Span,
    SpanKind,
)
from trajectories.schemas import (
    EVENT_SCHEMAS,
    EventBatchOut,
    EventResultName,
    EventResultOut,
    EventStatus,
    RunEventIn,
    SpanEventIn,
)
from trajectories.semconv import SpanData, requested_tool_calls

# Concurrent ingest requests per project, over every web process; more are answered 429.
# A quarter of one machine's request threads (README: 4 workers x 4 threads): however hard
# one project sends, the threads it cannot have are left to the others.
SLOTS_PER_PROJECT = 4
# An ingest statement or lock wait longer than this means overload: answered 503.
STATEMENT_TIMEOUT = "20s"
LOCK_TIMEOUT = "10s"
# Advisory lock namespace of the ingest slots ("traj").
SLOT_LOCK_CLASS = 0x7472616A


# This process's large-batch gate (None: no gate): TALLYBOOK_INGEST_LARGE_PER_PROCESS places.
LARGE_BATCHES = (
    threading.BoundedSemaphore(settings.TALLYBOOK_INGEST_LARGE_PER_PROCESS)
    if settings.TALLYBOOK_INGEST_LARGE_PER_PROCESS > 0
    else None
)


class Overloaded(Exception):
    """The batch was not stored; the client should retry after `retry_after` seconds."""

    def __init__(self, message: str, *, status: int, retry_after: int) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class Touched:
    """What a batch stored that effect links may be waiting for."""

    trace_ids: set[str] = field(default_factory=set)
    tool_call_ids: set[str] = field(default_factory=set)
    run_keys: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.trace_ids or self.tool_call_ids or self.run_keys)


def _slot_key(project: Project, slot: int) -> int:
    return (project.pk * SLOTS_PER_PROJECT + slot) % 2147483647


@contextmanager
def slot(project: Project) -> Iterator[None]:
    """One of the project's ingest slots, held from before a request's body is inflated and
    decoded until its answer: a flood is turned away at the door, not served by a thread.

    A PostgreSQL session advisory lock: shared by every web process, let go by a process
    that dies with its connection, and no Redis on the write path (it needs a session of
    its own: no transaction-pooling proxy in between). Raises Overloaded: 429 when every
    slot is taken, 503 when the database does not answer.
    """
    if connection.vendor != "postgresql":
        yield
        return
    taken = None
    try:
        with connection.cursor() as cursor:
            for n in range(SLOTS_PER_PROJECT):
                cursor.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", [SLOT_LOCK_CLASS, _slot_key(project, n)]
                )
                row = cursor.fetchone()
                if row is not None and row[0]:
                    taken = n
                    break
    except OperationalError as exc:
        raise Overloaded(DATABASE_AWAY, status=503, retry_after=DATABASE_RETRY_AFTER) from exc
    if taken is None:
        raise Overloaded(
            f"{SLOTS_PER_PROJECT} batches of this project are being stored; retry shortly",
            status=429,
            retry_after=1,
        )
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s, %s)",
                    [SLOT_LOCK_CLASS, _slot_key(project, taken)],
                )
        except (OperationalError, InterfaceError):
            pass  # the connection is gone, and its locks with it


@contextmanager
def large_batch(large: bool) -> Iterator[None]:
    """A place at this process's large-batch gate for a large batch (small ones pass), held
    until its answer; Overloaded (429) at once, never a wait, when every place is taken.

    Per process, not per project: what a heavy batch takes from the others is this process's
    interpreter (inflating, parsing and building rows hold the GIL), and gunicorn may give
    one worker every heavy request there is. Refused, the batch goes back to the client's
    retry and likely to another, idle, process; the project's slots (`slot`) stay the bound
    over every process.
    """
    gate = LARGE_BATCHES
    if not large or gate is None:
        yield
        return
    if not gate.acquire(blocking=False):
        raise Overloaded(
            "This server process is storing another large batch; retry shortly",
            status=429,
            retry_after=1,
        )
    try:
        yield
    finally:
        gate.release()


@contextmanager
def _ingest_transaction() -> Iterator[None]:
    """A transaction with bounded waits; Overloaded (503) when the database is too slow."""
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('statement_timeout', %s, true),"
                        " set_config('lock_timeout', %s, true)",
                        [STATEMENT_TIMEOUT, LOCK_TIMEOUT],
                    )
            yield
    except OperationalError as exc:
        raise Overloaded(DATABASE_AWAY, status=503, retry_after=DATABASE_RETRY_AFTER) from exc


# -- spans -------------------------------------------------------------------------------

# The span columns written by ingest, in COPY order.
SPAN_COLUMNS = (
    "project_id",
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
    "status_message",
    "provider",
    "request_model",
    "response_model",
    "input_tokens",
    "output_tokens",
    "tool_call_id",
    "tool_name",
    "attributes",
    "resource",
    "input",
    "output",
    "capped",
    "received",
)
JSON_COLUMNS = frozenset({"attributes", "resource", "input", "output", "capped"})
# Identity columns are not updated when a span is re-sent.
SPAN_UPDATED = [c for c in SPAN_COLUMNS if c not in ("project_id", "trace_id", "span_id")]
RUN_HINTS = ["agent", "workflow", "workflow_version", "conversation_id"]
# The columns of a span's names and ids that `distinct` keeps within, in `_span_values` order.
_ID_LIMITS = [
    column.max_length
    for name in (
        "operation",
        "provider",
        "request_model",
        "response_model",
        "tool_call_id",
        "tool_name",
    )
    if isinstance(column := Span._meta.get_field(name), CharField)
]


def _span_values(
    project_id: int,
    run_pk: int,
    s: SpanData,
    now: datetime,
    resource: tuple[str, dict[str, int]],
    extras: Extras,
) -> tuple[Any, ...]:
    """A span's row in SPAN_COLUMNS order: secrets redacted, long values cut and recorded.

    JSON columns are JSON text, ready for COPY; `resource` is the span's resource as
    `attributes_text` returns it, computed once for all the spans that share it.
    """
    attributes_json = json.dumps(s.attributes)
    io_json = [
        None if value is None else json.dumps(value) if text is None else text
        for value, text in ((s.input, s.input_text), (s.output, s.output_text))
    ]
    texts = [
        s.name,
        s.status_message,
        s.operation,
        s.provider,
        s.request_model,
        s.response_model,
        s.tool_call_id,
        s.tool_name,
    ]
    # One search over all of the span's text: most spans hold nothing to redact or clean.
    checked = not suspect(
        "\n".join([*texts, attributes_json, io_json[0] or "", io_json[1] or ""]), extras
    )
    if not checked:
        # The rest are names and ids: a secret in one is replaced by its digest, so that a
        # tool call id still matches its effect's.
        texts = [
            scrub_text(texts[0], extras),
            scrub_text(texts[1], extras),
            *(distinct(t, extras, limit) for t, limit in zip(texts[2:], _ID_LIMITS, strict=True)),
        ]
    capped: dict[str, Any] = {}
    attributes, cut = attributes_text(
        s.attributes, ATTRIBUTE_CAP, attributes_json, checked=checked, extras=extras
    )
    for prefix, sizes in (("attributes", cut), ("resource", resource[1])):
        for key, size in sizes.items():
            capped[f"{prefix}.{key}"] = {"size": size, "cap": ATTRIBUTE_CAP}
    io: list[str | None] = []
    for name, value, given in (("input", s.input, io_json[0]), ("output", s.output, io_json[1])):
        if value is None:
            io.append(None)
            continue
        text, cut_size = json_text(value, IO_CAP, given, checked=checked, extras=extras)
        if cut_size is not None:
            capped[name] = {"size": cut_size, "cap": IO_CAP}
        io.append(text)
    name, status_message, operation, provider, request_model, response_model, call, tool = texts
    return (
        project_id,
        run_pk,
        s.trace_id,
        s.span_id,
        s.parent_span_id,
        s.kind,
        operation,
        name,
        s.start,
        s.end,
        s.status,
        status_message,
        provider,
        request_model,
        response_model,
        s.input_tokens,
        s.output_tokens,
        call,
        tool,
        attributes,
        resource[0],
        io[0],
        io[1],
        json.dumps(capped) if capped else "{}",
        now,
    )


STAGING = "trajectories_span_staging"
# A per-connection scratch table for COPY; emptied at every commit.
STAGING_DDL = (
    f"CREATE TEMP TABLE IF NOT EXISTS {STAGING} ON COMMIT DELETE ROWS AS "
    f"SELECT {', '.join(f'"{c}"' for c in SPAN_COLUMNS)}, NULL::jsonb AS requested "
    "FROM trajectories_span WITH NO DATA"
)
# The spans, new or re-sent, and then the tool calls the model spans asked for, joined to
# the ids the upsert returns: one statement, no second look-up of the spans just written.
SPAN_UPSERT = (
    "WITH stored AS ("
    f"INSERT INTO trajectories_span ({', '.join(f'"{c}"' for c in SPAN_COLUMNS)}) "
    f"SELECT {', '.join(f'"{c}"' for c in SPAN_COLUMNS)} FROM {STAGING} "
    "ON CONFLICT (project_id, trace_id, span_id) DO UPDATE SET "
    + ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in SPAN_UPDATED)
    + " RETURNING id, trace_id, span_id) "
    "INSERT INTO trajectories_requestedtoolcall (project_id, tool_call_id, span_id) "
    "SELECT staged.project_id, call.id, stored.id "
    f"FROM {STAGING} staged "
    "JOIN stored ON stored.trace_id = staged.trace_id AND stored.span_id = staged.span_id "
    "CROSS JOIN LATERAL jsonb_array_elements_text(staged.requested) AS call(id) "
    "WHERE staged.requested IS NOT NULL "
    "ON CONFLICT (span_id, tool_call_id) DO NOTHING"
)


def _spans_upsert(rows: list[tuple[Any, ...]], requested: list[list[str]]) -> None:
    """Insert spans, or update them in place (same id) when re-sent, with the calls asked for.

    PostgreSQL: COPY into a scratch table, then one statement (SPAN_UPSERT); the ORM's
    bulk_create elsewhere (SQLite, for the demo).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Empty already, unless an enclosing transaction stored a batch before.
            cursor.execute(f"{STAGING_DDL}; DELETE FROM {STAGING}")
            columns = ", ".join(f'"{c}"' for c in (*SPAN_COLUMNS, "requested"))
            with cursor.cursor.copy(f"COPY {STAGING} ({columns}) FROM STDIN") as copy:
                for row, calls in zip(rows, requested, strict=True):
                    copy.write_row((*row, json.dumps(calls) if calls else None))
            cursor.execute(SPAN_UPSERT)
        return
    spans = []
    for row in rows:
        values = dict(zip(SPAN_COLUMNS, row, strict=True))
        for name in JSON_COLUMNS:
            values[name] = None if values[name] is None else json.loads(values[name])
        spans.append(Span(**values))
    Span.objects.bulk_create(
        spans,
        update_conflicts=True,
        unique_fields=["project", "trace_id", "span_id"],
        update_fields=[c.removesuffix("_id") if c == "run_id" else c for c in SPAN_UPDATED],
    )
    RequestedToolCall.objects.bulk_create(
        [
            RequestedToolCall(project_id=span.project_id, tool_call_id=call_id, span=span)
            for span, calls in zip(spans, requested, strict=True)
            for call_id in calls
        ],
        ignore_conflicts=True,
    )


def _runs_of(project: Project, spans: list[SpanData], touched: Touched) -> dict[str, Run]:
    """The (locked) run of every span by its run key, creating runs inferred from traces.

    A span names its run, or joins the run its trace belongs to, or starts a run named
    after its trace. A trace first inferred as its own run and later named by a span
    of a named run is merged into that run.
    """
    traces = {s.trace_id for s in spans}
    owners = {
        trace_id: (run_id, inferred)
        for trace_id, run_id, inferred in RunTrace.objects.filter(
            project=project, trace_id__in=traces
        ).values_list("trace_id", "run__run_id", "run__inferred")
    }
    named = {s.trace_id: s.run_key for s in spans if s.run_key}
    first_start: dict[str, Any] = {}
    for s in spans:
        if not s.run_key:
            owner = owners.get(s.trace_id)
            s.run_key = owner[0] if owner else named.get(s.trace_id, s.trace_id)
        if s.run_key not in first_start or s.start < first_start[s.run_key]:
            first_start[s.run_key] = s.start
    inferred_keys = {s.trace_id for s in spans if s.run_key == s.trace_id}
    keys = sorted(first_start)
    Run.objects.bulk_create(
        [
            Run(project=project, run_id=k, inferred=k in inferred_keys, started=first_start[k])
            for k in keys
        ],
        ignore_conflicts=True,
    )
    runs = {
        r.run_id: r
        for r in Run.objects.select_for_update()
        .filter(project=project, run_id__in=keys)
        .order_by("pk")
    }
    claims = {s.trace_id: runs[s.run_key] for s in spans if s.trace_id not in owners}
    _traces_claim(project, claims)
    for s in spans:
        owner = owners.get(s.trace_id)
        if owner and owner[1] and owner[0] != s.run_key:
            _run_merge(project, trace_id=s.trace_id, source_key=owner[0], target=runs[s.run_key])
            owners[s.trace_id] = (s.run_key, False)
            touched.run_keys.add(owner[0])
    touched.run_keys.update(keys)
    return runs


def _traces_claim(project: Project, claims: dict[str, Run]) -> None:
    RunTrace.objects.bulk_create(
        [RunTrace(project=project, trace_id=t, run=run) for t, run in sorted(claims.items())],
        ignore_conflicts=True,
    )


def _run_merge(project: Project, *, trace_id: str, source_key: str, target: Run) -> None:
    """Move a trace from the run inferred for it into the run that named it."""
    source = Run.objects.select_for_update().filter(project=project, run_id=source_key).first()
    if source is None:
        return
    Span.objects.filter(run=source, trace_id=trace_id).update(run=target)
    RunTrace.objects.filter(project=project, trace_id=trace_id).update(run=target)
    EffectLink.objects.filter(run=source).update(run=target)
    if not Span.objects.filter(run=source).exists():
        source.delete()
    else:
        _runs_refresh([source], {})


# Aggregates of runs over their spans. A run inferred from spans takes its end and status
# from its root spans; a named run keeps what its run events said. Blank names are filled
# from what the spans just stored say about their run (the `hint` rows).
RUNS_REFRESH = """
UPDATE trajectories_run SET
    span_count = agg.n,
    error_count = agg.errors,
    input_tokens = agg.tokens_in,
    output_tokens = agg.tokens_out,
    started = CASE WHEN agg.first < trajectories_run.started
        THEN agg.first ELSE trajectories_run.started END,
    ended = CASE WHEN NOT trajectories_run.inferred THEN trajectories_run.ended
        WHEN agg.roots_ended > 0 THEN agg.last END,
    status = CASE WHEN NOT trajectories_run.inferred THEN trajectories_run.status
        WHEN agg.root_errors > 0 THEN 'error' WHEN agg.roots_ended > 0 THEN 'ok'
        ELSE 'running' END,
    {fills},
    updated = %s
FROM (
    SELECT run_id,
        count(*) AS n,
        sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS errors,
        coalesce(sum(input_tokens), 0) AS tokens_in,
        coalesce(sum(output_tokens), 0) AS tokens_out,
        min(start) AS first,
        max("end") AS last,
        sum(CASE WHEN parent_span_id = '' AND "end" IS NOT NULL THEN 1 ELSE 0 END) AS roots_ended,
        sum(CASE WHEN parent_span_id = '' AND status = 'error' THEN 1 ELSE 0 END) AS root_errors
    FROM trajectories_span WHERE run_id IN ({runs}) GROUP BY run_id
) AS agg JOIN ({hints}) AS hint ON hint.run = agg.run_id
WHERE trajectories_run.id = agg.run_id
"""
_FILLS = ",\n    ".join(
    f"{name} = CASE WHEN trajectories_run.{name} = '' THEN hint.{name} "
    f"ELSE trajectories_run.{name} END"
    for name in RUN_HINTS
)
_HINT_ROW = "SELECT %s AS run, " + ", ".join(f"%s AS {name}" for name in RUN_HINTS)


def _runs_refresh(
    runs: Iterable[Run], hints: dict[int, list[SpanData]], extras: Extras = NONE
) -> None:
    """Recompute the runs' aggregates from their spans; fill blank names from span hints.

    One statement. Rescans each run's spans (one index range per run), so counts stay
    right however often a span is re-sent.
    """
    runs = list(runs)
    if not runs:
        return
    hint_values: list[Any] = []
    for run in runs:
        # Roots and agent spans speak for the run before the spans below them.
        ordered = sorted(
            hints.get(run.pk, []),
            key=lambda s: (bool(s.parent_span_id), s.kind != SpanKind.AGENT, s.start),
        )
        hint_values += [
            run.pk,
            *(distinct(_hint(ordered, name), extras)[:255] for name in RUN_HINTS),
        ]
    sql = RUNS_REFRESH.format(
        fills=_FILLS,
        runs=", ".join(["%s"] * len(runs)),
        hints=" UNION ALL ".join([_HINT_ROW] * len(runs)),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [timezone.now(), *(run.pk for run in runs), *hint_values])


def _hint(spans: list[SpanData], name: str) -> str:
    value = next((getattr(s, name) for s in spans if getattr(s, name)), "")
    if not value and name == "workflow":
        # A workflow no span names is named after the trace's root span.
        value = next((s.name for s in spans if not s.parent_span_id), "")
    return str(value)


def _spans_store(project: Project, spans: list[SpanData], touched: Touched) -> None:
    if not spans:
        return
    # The last copy of a span re-sent within one batch wins.
    spans = list({(s.trace_id, s.span_id): s for s in spans}.values())
    extras = extras_of(project)
    for s in spans:
        # Identities, stored as the ledger stores its own: a secret in one becomes its
        # digest, the same for the same secret, so links still find their effects.
        s.run_key = distinct(s.run_key, extras)
        s.tool_call_id = distinct(s.tool_call_id, extras)
        s.requested_calls = [distinct(c, extras) for c in s.requested_calls]
    runs = _runs_of(project, spans, touched)
    now = timezone.now()
    # Spans of one OTLP resource share its attributes dict: encode it once.
    resources: dict[int, tuple[str, dict[str, int]]] = {}
    for s in spans:
        if id(s.resource) not in resources:
            resources[id(s.resource)] = attributes_text(s.resource, ATTRIBUTE_CAP, extras=extras)
    # Model.pk is a property: looked up once per run, not once per span.
    project_pk, run_pks = project.pk, {key: run.pk for key, run in runs.items()}
    rows = [
        _span_values(project_pk, run_pks[s.run_key], s, now, resources[id(s.resource)], extras)
        for s in spans
    ]
    # distinct() above has dropped any NUL from the requested calls' ids.
    _spans_upsert(rows, [s.requested_calls for s in spans])
    hints: dict[int, list[SpanData]] = defaultdict(list)
    for s in spans:
        hints[run_pks[s.run_key]].append(s)
        touched.trace_ids.add(s.trace_id)
        if s.tool_call_id:
            touched.tool_call_ids.add(s.tool_call_id)
        touched.tool_call_ids.update(s.requested_calls)
    _runs_refresh(runs.values(), hints, extras)


def spans_ingest(*, project: Project, spans: list[SpanData]) -> Touched:
    """Store spans (new or re-sent) and the runs they belong to, in one transaction.

    Raises Overloaded when the database is slow; the caller holds one of the project's slots.
    """
    touched = Touched()
    with _ingest_transaction():
        _spans_store(project, spans, touched)
    return touched


# -- run and span events -----------------------------------------------------------------


EVENT_STATUS: dict[EventResultName, EventStatus] = {
    "stored": 201,
    "duplicate": 200,
    "rejected": 400,
}


def _result(
    index: int,
    event_id: str | None,
    result: EventResultName,
    error: str | None = None,
    fields: dict[str, str] | None = None,
) -> EventResultOut:
    """One event's answer; `error` and `fields` stay unset, so out of the JSON, unless rejected."""
    answer = EventResultOut(index=index, id=event_id, status=EVENT_STATUS[result], result=result)
    if error:
        answer.error, answer.fields = error, fields
    return answer


@dataclass
class EventsOutcome:
    results: list[EventResultOut]
    touched: Touched

    def to_dict(self) -> dict[str, Any]:
        """The answer of POST /api/v1/events, shaped by EventBatchOut."""
        counts = dict.fromkeys(EVENT_STATUS, 0)
        for r in self.results:
            counts[r.result] += 1
        batch = EventBatchOut(
            stored=counts["stored"],
            duplicates=counts["duplicate"],
            rejected=counts["rejected"],
            results=self.results,
        )
        return batch.model_dump(mode="json", exclude_unset=True)


def _event_validate(index: int, raw: Any) -> RunEventIn | SpanEventIn | EventResultOut:
    event_id = raw.get("id") if isinstance(raw, dict) else None
    event_id = event_id if isinstance(event_id, str) else None
    if not isinstance(raw, dict):
        return _result(
            index, None, "rejected", "An event must be an object", {"": "Expected an object"}
        )
    if (found := unstorable_at(raw)) is not None:
        where = ".".join(map(str, found[0]))
        return _result(index, event_id, "rejected", "Invalid event", {where: found[2]})
    event_type = raw.get("type")
    schema = EVENT_SCHEMAS.get(event_type) if isinstance(event_type, str) else None
    if schema is None:
        return _result(
            index, event_id, "rejected", "Unknown event type", {"type": "Expected 'run' or 'span'"}
        )
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        return _result(index, event_id, "rejected", "Invalid event", field_errors(exc))


def _events_claim(project: Project, event_ids: list[str]) -> set[str]:
    """Record event ids as seen; returns those not seen before (in this transaction).

    An id is stored as `distinct` makes it, so that a secret in one is not kept.
    """
    if not event_ids:
        return set()
    extras = extras_of(project)
    stored = {distinct(event_id, extras): event_id for event_id in event_ids}
    table = SeenEvent._meta.db_table
    now = timezone.now()
    values = ", ".join(["(%s, %s, %s)"] * len(stored))
    params: list[Any] = []
    for event_id in stored:
        params += [project.pk, event_id, now]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (project_id, event_id, received) VALUES {values} "
            "ON CONFLICT (project_id, event_id) DO NOTHING RETURNING event_id",
            params,
        )
        return {stored[row[0]] for row in cursor.fetchall()}


def _span_of_event(event: SpanEventIn) -> SpanData:
    return SpanData(
        trace_id=event.trace_id,
        span_id=event.span_id,
        parent_span_id=event.parent_span_id or "",
        name=event.name,
        start=event.start,
        end=event.end,
        kind=event.kind,
        status=event.status,
        status_message=event.status_message or "",
        provider=event.provider or "",
        request_model=event.request_model or "",
        response_model=event.response_model or "",
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        tool_call_id=event.tool_call_id or "",
        tool_name=event.tool_name or "",
        attributes=event.attributes or {},
        input=event.input,
        output=event.output,
        requested_calls=requested_tool_calls(event.output) if event.kind == "model" else [],
        run_key=event.run_id or "",
    )


def _run_events_store(project: Project, events: list[RunEventIn], touched: Touched) -> None:
    """Create or update named runs; their traces join them (merging runs inferred for them)."""
    extras = extras_of(project)
    for event in sorted(events, key=lambda e: e.run_id):
        run_id = distinct(event.run_id, extras)
        given = {
            name: getattr(event, name)
            for name in (*RUN_HINTS, "status", "started", "ended")
            if getattr(event, name) is not None
        }
        for name in RUN_HINTS:
            if name in given:
                given[name] = distinct(given[name], extras)
        if event.attributes is not None:
            given["attributes"] = redact(event.attributes, extras)
        run, _ = Run.objects.update_or_create(
            project=project,
            run_id=run_id,
            defaults={**given, "inferred": False, "updated": timezone.now()},
        )
        owners = {
            trace_id: (run_id, inferred)
            for trace_id, run_id, inferred in RunTrace.objects.filter(
                project=project, trace_id__in=event.trace_ids
            ).values_list("trace_id", "run__run_id", "run__inferred")
        }
        _traces_claim(project, {t: run for t in event.trace_ids if t not in owners})
        for trace_id, (owner, inferred) in owners.items():
            if inferred and owner != run.run_id:
                _run_merge(project, trace_id=trace_id, source_key=owner, target=run)
                touched.run_keys.add(owner)
        if owners:
            _runs_refresh([run], {})
        touched.run_keys.add(run.run_id)
        touched.trace_ids.update(event.trace_ids)


def events_ingest(*, project: Project, events: list[Any]) -> EventsOutcome:
    """Validate each event alone; store the new valid ones and their ids in one transaction.

    An id seen before (in an earlier batch or earlier in this one) is acknowledged
    without change. Raises Overloaded as `spans_ingest` does.
    """
    results: list[EventResultOut | None] = [None] * len(events)
    valid: dict[str, tuple[int, RunEventIn | SpanEventIn]] = {}
    for index, raw in enumerate(events):
        checked = _event_validate(index, raw)
        if isinstance(checked, EventResultOut):
            results[index] = checked
        elif checked.id in valid:
            results[index] = _result(index, checked.id, "duplicate")
        else:
            valid[checked.id] = (index, checked)
    touched = Touched()
    with _ingest_transaction():
        new = _events_claim(project, list(valid))
        fresh = [event for event_id, (_, event) in valid.items() if event_id in new]
        _run_events_store(project, [e for e in fresh if isinstance(e, RunEventIn)], touched)
        _spans_store(
            project, [_span_of_event(e) for e in fresh if isinstance(e, SpanEventIn)], touched
        )
    for event_id, (index, _) in valid.items():
        results[index] = _result(index, event_id, "stored" if event_id in new else "duplicate")
    # Each event is answered by its id as stored: no answer shows a secret it was sent.
    extras = extras_of(project)
    answered = [r for r in results if r is not None]
    for result in answered:
        if result.id is not None:
            result.id = distinct(result.id, extras)
    return EventsOutcome(answered, touched)
