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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import CharField
from django.utils import timezone
from pydantic import ValidationError

from durability import rows
from durability.api.decorators import DATABASE_AWAY, DATABASE_RETRY_AFTER, field_errors
from durability.inbound import unstorable_at
from durability.models import Project
from durability.pipeline import Statement
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
from trajectories import links
from trajectories.links import Touched
from trajectories.models import (
    RequestedToolCall,
    Run,
    RunTrace,
    SeenEvent,
    Span,
    SpanKind,
    today,
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


def _slot_key(project: Project, slot: int) -> int:
    return (project.pk * SLOTS_PER_PROJECT + slot) % 2147483647


@dataclass
class Slot:
    """An ingest slot held: the key of its advisory lock, None once given back."""

    key: int | None = None

    def give_back(self) -> list[Statement]:
        """The unlock, to send with the statements before it (none once given back); `key`
        stays set until the caller knows it ran."""
        if self.key is None:
            return []
        return [_statement(SLOT_UNLOCK, [SLOT_LOCK_CLASS, self.key])]


SLOT_UNLOCK = "SELECT pg_advisory_unlock(%s, %s)"


@contextmanager
def slot(project: Project) -> Iterator[Slot]:
    """One of the project's ingest slots, held from before a request's body is inflated and
    decoded until its answer (a batch of spans gives it back with its last statements,
    before its COMMIT: a round trip less): a flood is turned away at the door, not served by
    a thread.

    A PostgreSQL session advisory lock: shared by every web process, let go by a process
    that dies with its connection, and no Redis on the write path (it needs a session of
    its own: no transaction-pooling proxy in between). Raises Overloaded: 429 when every
    slot is taken, 503 when the database does not answer.
    """
    held = Slot()
    if connection.vendor != "postgresql":
        yield held
        return
    try:
        with connection.cursor() as cursor:
            for n in range(SLOTS_PER_PROJECT):
                cursor.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", [SLOT_LOCK_CLASS, _slot_key(project, n)]
                )
                row = cursor.fetchone()
                if row is not None and row[0]:
                    held.key = _slot_key(project, n)
                    break
    except OperationalError as exc:
        raise Overloaded(DATABASE_AWAY, status=503, retry_after=DATABASE_RETRY_AFTER) from exc
    if held.key is None:
        raise Overloaded(
            f"{SLOTS_PER_PROJECT} batches of this project are being stored; retry shortly",
            status=429,
            retry_after=1,
        )
    try:
        yield held
    finally:
        if held.key is not None:
            # (A connection gone takes its locks with it.)
            with suppress(OperationalError, InterfaceError):
                rows.send(held.give_back())


@contextmanager
def large_batch(large: bool) -> Iterator[None]:
    """A place at this process's large-batch gate for a large batch (small ones pass), held
    until its answer; Overloaded (429) at once, never a wait, when every place is taken.

    Per process, not per project: what a heavy batch takes from the others is this process's
    interpreter (inflating, parsing and building rows hold the GIL), and the web server may
    give one worker every heavy request there is. Refused, the batch goes back to the client's
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


# The first statement of every ingest transaction: its waits bounded.
BOUND_WAITS = (
    "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)"
)


def _statement(sql: str, params: Sequence[Any]) -> Statement:
    """An ingest statement, sent with others by `rows.send` (one pipeline on PostgreSQL).
    Never prepared: most texts vary with the batch, and every plan is best made for the
    batch's own values (its days, its partitions)."""
    return Statement(sql, params, prepare=False)


def _bound_waits() -> list[Statement]:
    if connection.vendor != "postgresql":
        return []
    return [_statement(BOUND_WAITS, [STATEMENT_TIMEOUT, LOCK_TIMEOUT])]


@contextmanager
def _ingest_transaction() -> Iterator[bool]:
    """A transaction, whose first statement must be `_bound_waits`; Overloaded (503) when
    the database is too slow. Yields whether it is the outermost: its last statements then
    carry its COMMIT (`rows.send(commit=True)`), in their round trip."""
    outermost = not connection.in_atomic_block
    try:
        with transaction.atomic():
            yield outermost
    except OperationalError as exc:
        raise Overloaded(DATABASE_AWAY, status=503, retry_after=DATABASE_RETRY_AFTER) from exc


def _in(column: str, values: Iterable[Any]) -> tuple[str, list[Any]]:
    """`column` among `values`: one array parameter on PostgreSQL (one statement text
    whatever their number), a list of parameters elsewhere."""
    values = list(values)
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [values]
    return f"{column} IN ({', '.join(['%s'] * len(values)) or 'NULL'})", values


# -- spans -------------------------------------------------------------------------------

# The span columns of a row, in `_span_values` order (the run is found by its key at the upsert).
SPAN_COLUMNS = (
    "project_id",
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
SPAN_UPDATED = [
    c for c in ("run_id", *SPAN_COLUMNS) if c not in ("project_id", "trace_id", "span_id")
]
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
    s: SpanData,
    now: datetime,
    resource: tuple[str, dict[str, int]],
    extras: Extras,
) -> tuple[Any, ...]:
    """A span's row in SPAN_COLUMNS order: secrets redacted, long values cut and recorded.

    JSON columns are JSON text, ready to splice (`_rows_json`); `resource` is the span's resource as
    `attributes_text` returns it, computed once for all the spans that share it. The span's
    identities (its run, its tool call, the calls it asks for) are redacted in place, as the
    ledger stores its own: a secret in one becomes its digest, so links still find effects.
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
        "\n".join(
            [
                *texts,
                s.run_key,
                *s.requested_calls,
                attributes_json,
                io_json[0] or "",
                io_json[1] or "",
            ]
        ),
        extras,
    )
    if not checked:
        # The rest are names and ids: a secret in one is replaced by its digest, so that a
        # tool call id still matches its effect's.
        texts = [
            scrub_text(texts[0], extras),
            scrub_text(texts[1], extras),
            *(distinct(t, extras, limit) for t, limit in zip(texts[2:], _ID_LIMITS, strict=True)),
        ]
    if not checked or extras.patterns:
        # A project's pattern may be anchored (`^...$`): its identities are searched alone.
        texts[6] = s.tool_call_id = distinct(s.tool_call_id, extras, _ID_LIMITS[4])
        s.run_key = distinct(s.run_key, extras)
        s.requested_calls = [distinct(c, extras) for c in s.requested_calls]
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


# The row's columns that are not JSON text, after project_id, with their types as read back.
_SCALARS = SPAN_COLUMNS[1:18]
_SCALAR_TYPES = {
    "start": "timestamptz",
    "end": "timestamptz",
    "input_tokens": "bigint",
    "output_tokens": "bigint",
}
_JSON_TEXTS = SPAN_COLUMNS[18:23]
# SPAN_UPSERT: the spans, new or re-sent, each in the run its key names, and then the tool
# calls the model spans asked for, joined to the ids the upsert returns: one statement, no
# second look-up of the spans just written. Its rows come as JSON arrays in lockstep
# (`_rows_json`), parameters rather than a COPY, so that the statement is sent in the runs'
# round trip. A run
# the batch did not write fails the statement (its run_id is null), never a span left out.
# Each span goes to the partition of its trace's first-seen day (RunTrace.day, claimed
# earlier in the same pipeline or in an earlier batch): a span sent again, after midnight or
# a month later, meets its first copy in the one partition the conflict is checked in. (Today,
# should retention have deleted the trace's day since: its first copy was dropped with it.)
# A span stored is updated only while it is in one of the runs the batch locked and refreshes
# (`_holders`): one that another batch moved meanwhile stays as that batch left it, as if
# this copy had come first, and no run is left counting a span it lost.
_SPANS_STORED = (
    "WITH staged AS (SELECT "
    + ", ".join(
        f'(batch.row ->> {n})::{_SCALAR_TYPES.get(c, "text")} AS "{c}"'
        for n, c in enumerate(_SCALARS)
    )
    + f", batch.row ->> {len(_SCALARS)} AS run_key"
    + f", NULLIF(batch.row -> {len(_SCALARS) + 1}, 'null') AS requested, "
    + ", ".join(f'NULLIF(batch."{c}", \'null\') AS "{c}"' for c in _JSON_TEXTS)
    + " FROM ROWS FROM ("
    + ", ".join(["jsonb_array_elements(%s::jsonb)"] * (1 + len(_JSON_TEXTS)))
    + ") AS batch(row, "
    + ", ".join(f'"{c}"' for c in _JSON_TEXTS)
    + ")), stored AS ("
    f'INSERT INTO trajectories_span ("run_id", "day", {", ".join(f'"{c}"' for c in SPAN_COLUMNS)}) '
    "SELECT (SELECT run.id FROM trajectories_run run "
    "WHERE run.project_id = %s AND run.run_id = staged.run_key), "
    "COALESCE((SELECT trace.day FROM trajectories_runtrace trace "
    "WHERE trace.project_id = %s AND trace.trace_id = staged.trace_id), %s), %s, "
    + ", ".join(f'staged."{c}"' for c in SPAN_COLUMNS[1:-1])
    + ", %s FROM staged "
    "ON CONFLICT (project_id, trace_id, span_id, day) DO UPDATE SET "
    + ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in SPAN_UPDATED)
    + " WHERE trajectories_span.run_id = ANY(ARRAY(SELECT id FROM trajectories_run "
    "WHERE project_id = %s AND run_id = ANY(%s)))"
    " RETURNING trace_id, span_id, day, run_id) "
)
_CALLS_ASKED = (
    "INSERT INTO trajectories_requestedtoolcall (project_id, tool_call_id, trace_id, span_id, day) "
    "SELECT %s, call.id, stored.trace_id, stored.span_id, stored.day FROM staged "
    "JOIN stored ON stored.trace_id = staged.trace_id AND stored.span_id = staged.span_id "
    "CROSS JOIN LATERAL jsonb_array_elements_text(staged.requested) AS call(id) "
    "WHERE staged.requested IS NOT NULL "
    "ON CONFLICT (project_id, trace_id, span_id, tool_call_id, day) DO NOTHING"
)
# SPAN_UPSERT_FOLLOWED, for a batch sending spans again: the effect links taking their run
# from a span it writes follow it to its run, in the batch's transaction and in its round trip
# (links.LINKS_FOLLOW, a data-modifying CTE reading `stored`).
SPAN_UPSERT = _SPANS_STORED + _CALLS_ASKED
SPAN_UPSERT_FOLLOWED = _SPANS_STORED + links.LINKS_FOLLOW + _CALLS_ASKED


def _rows_json(rows: list[tuple[Any, ...]], spans: list[SpanData]) -> list[str]:
    """The rows as SPAN_UPSERT reads them: one JSON array of each row's other columns (with
    the span's run key and the calls it asks for), and one of each JSON column, whose texts
    are spliced in as they are rather than encoded again."""
    others = json.dumps(
        [
            [
                *row[1:7],
                row[7].isoformat(),
                None if row[8] is None else row[8].isoformat(),
                *row[9:18],
                s.run_key,
                s.requested_calls or None,
            ]
            for row, s in zip(rows, spans, strict=True)
        ]
    )
    return [others] + [f"[{', '.join([row[n] or 'null' for row in rows])}]" for n in range(18, 23)]


def _spans_upsert(
    project: Project,
    values: list[tuple[Any, ...]],
    spans: list[SpanData],
    locked: list[str],
    resent: bool,
) -> Statement | None:
    """The statement inserting spans (rows of `values`), or updating them in place (same id)
    when re-sent, with the calls asked for: SPAN_UPSERT on PostgreSQL; None elsewhere (SQLite,
    for the demo), where `_spans_create` writes them. `locked`: the keys of the runs the
    batch locked, which a span re-sent must be in; `resent`: some spans were stored before,
    and the effect links they gave their runs follow them (SPAN_UPSERT_FOLLOWED)."""
    if connection.vendor != "postgresql":
        return None
    now = values[0][-1]
    pk = project.pk
    day = today()
    params = [*_rows_json(values, spans), pk, pk, day, pk, now, pk, locked]
    if resent:
        followed = links.links_follow_params(pk, spans)
        return _statement(SPAN_UPSERT_FOLLOWED, [*params, *followed, pk])
    return _statement(SPAN_UPSERT, [*params, pk])


def _spans_create(project: Project, values: list[tuple[Any, ...]], spans: list[SpanData]) -> None:
    """Elsewhere (SQLite, for the demo): the ORM's bulk_create, in the runs the keys name."""
    keys = {s.run_key for s in spans}
    run_pks = dict(Run.objects.filter(project=project, run_id__in=keys).values_list("run_id", "pk"))
    days = dict(
        RunTrace.objects.filter(
            project=project, trace_id__in={s.trace_id for s in spans}
        ).values_list("trace_id", "day")
    )
    created = []
    for row, s in zip(values, spans, strict=True):
        fields = dict(zip(SPAN_COLUMNS, row, strict=True))
        for name in JSON_COLUMNS:
            fields[name] = None if fields[name] is None else json.loads(fields[name])
        day = days.get(s.trace_id) or today()
        created.append(Span(run_id=run_pks[s.run_key], day=day, **fields))
    Span.objects.bulk_create(
        created,
        update_conflicts=True,
        unique_fields=["project", "trace_id", "span_id", "day"],
        update_fields=[c.removesuffix("_id") if c == "run_id" else c for c in SPAN_UPDATED],
    )
    RequestedToolCall.objects.bulk_create(
        [
            RequestedToolCall(
                project_id=span.project_id,
                tool_call_id=call_id,
                trace_id=span.trace_id,
                span_id=span.span_id,
                day=span.day,
            )
            for span, s in zip(created, spans, strict=True)
            for call_id in s.requested_calls
        ],
        ignore_conflicts=True,
    )
    # links.LINKS_FOLLOW, with the ORM (bulk_create updates a span sent again whatever its run).
    links.links_follow(
        project.pk, {(span.trace_id, span.span_id): span.run_id for span in created}, spans
    )


# The runs a batch names, created when new, and the runs it takes spans from, locked in key
# order either way (the update takes the row lock, which a conflict ignored would not), as
# `_runs_write` lists them. A run losing spans is never created: `_holders` found it unlocked,
# and retention or a merge may have deleted it since (committed before this statement, or
# while it waits for the row); the EXISTS locks it first, and is false for a row gone.
# On PostgreSQL one statement of fixed text for all the runs, from arrays in key order (the
# order their rows are locked in); elsewhere (SQLite, the demo) one per run, where a
# transaction writes alone from its start: nothing to lock.
_RUNS_COLUMNS = (
    "INSERT INTO trajectories_run (project_id, run_id, inferred, agent, workflow, "
    "workflow_version, conversation_id, status, started, attributes, span_count, "
    "error_count, input_tokens, output_tokens, updated) "
)
RUNS_UPSERT = (
    _RUNS_COLUMNS + "SELECT %s, run.run_id, run.inferred, '', '', '', '', 'running', "
    "run.started, '{}', 0, 0, 0, 0, %s FROM unnest(%s::text[], %s::boolean[], "
    "%s::timestamptz[], %s::boolean[]) AS run (run_id, inferred, started, losing) "
    "WHERE NOT run.losing OR EXISTS (SELECT 1 FROM trajectories_run held "
    "WHERE held.project_id = %s AND held.run_id = run.run_id FOR UPDATE) "
    "ON CONFLICT (project_id, run_id) DO UPDATE SET updated = EXCLUDED.updated"
)
RUN_UPSERT_ONE = (
    _RUNS_COLUMNS + "SELECT %s, %s, %s, '', '', '', '', 'running', %s, '{}', 0, 0, 0, 0, %s "
    "WHERE NOT %s OR EXISTS (SELECT 1 FROM trajectories_run held "
    "WHERE held.project_id = %s AND held.run_id = %s) "
    "ON CONFLICT (project_id, run_id) DO UPDATE SET updated = EXCLUDED.updated"
)
# A trace joins the run its key names unless it has one already.
# The trace's day is today's, once: a trace claimed before keeps the day it was first seen.
# On PostgreSQL from arrays, elsewhere one statement per trace.
TRACES_CLAIM = (
    "INSERT INTO trajectories_runtrace (project_id, trace_id, day, run_id) "
    "SELECT %s, claim.trace_id, %s, (SELECT id FROM trajectories_run "
    "WHERE project_id = %s AND run_id = claim.run_key) "
    "FROM unnest(%s::text[], %s::text[]) AS claim (trace_id, run_key) "
    "ON CONFLICT (project_id, trace_id) DO NOTHING"
)
TRACE_CLAIM_ONE = (
    "INSERT INTO trajectories_runtrace (project_id, trace_id, day, run_id) VALUES (%s, %s, %s, "
    "(SELECT id FROM trajectories_run WHERE project_id = %s AND run_id = %s)) "
    "ON CONFLICT (project_id, trace_id) DO NOTHING"
)


def _runs_write(
    project: Project,
    first_start: dict[str, datetime],
    inferred: set[str],
    now: datetime,
    losing: set[str],
) -> list[Statement]:
    """The statements creating the runs {key: first start} that are new (`inferred` those
    named after their trace), and locking them all with the runs `losing` spans to them
    that still exist, in key order: one on PostgreSQL."""
    keys = sorted(first_start.keys() | losing)
    starts = [first_start.get(key, now) for key in keys]
    only_losing = [key not in first_start for key in keys]
    named = [key in inferred for key in keys]
    if connection.vendor == "postgresql":
        params = [project.pk, now, keys, named, starts, only_losing, project.pk]
        return [_statement(RUNS_UPSERT, params)]
    return [
        _statement(RUN_UPSERT_ONE, [project.pk, key, flag, start, now, lose, project.pk, key])
        for key, flag, start, lose in zip(keys, named, starts, only_losing, strict=True)
    ]


def _traces_claim(project: Project, claims: dict[str, str]) -> list[Statement]:
    """The statements giving each trace {trace_id: run key} (at least one) to that run,
    unless the trace has a run already: one on PostgreSQL."""
    assert claims, "no trace to claim"
    day = today()
    traces = sorted(claims)
    if connection.vendor == "postgresql":
        keys = [claims[trace_id] for trace_id in traces]
        return [_statement(TRACES_CLAIM, [project.pk, day, project.pk, traces, keys])]
    return [
        _statement(TRACE_CLAIM_ONE, [project.pk, trace_id, day, project.pk, claims[trace_id]])
        for trace_id in traces
    ]


def _owners(project: Project, traces: Iterable[str]) -> Statement:
    """The look-up of the traces' runs: (trace_id, run key, inferred) rows."""
    where, params = _in("trace.trace_id", traces)
    return _statement(
        "SELECT trace.trace_id, run.run_id, run.inferred FROM trajectories_runtrace trace "
        "JOIN trajectories_run run ON run.id = trace.run_id "
        f"WHERE trace.project_id = %s AND {where}",
        [project.pk, *params],
    )


def _holders(project: Project, spans: list[SpanData]) -> Statement:
    """The look-up of the runs holding spans of the batch already: (run key,) rows (NULL
    for the new spans). A span is looked for in the partition of its trace's day only, where
    the upsert meets it: one index probe per span of a trace the project has, none for a
    new trace."""
    if connection.vendor == "postgresql":
        sent = "unnest(%s::text[], %s::text[]) AS sent(trace_id, span_id)"
        params: list[Any] = [[s.trace_id for s in spans], [s.span_id for s in spans]]
    else:
        # SQLite (the demo): the pairs as a VALUES list.
        sent = (
            "(SELECT column1 AS trace_id, column2 AS span_id FROM (VALUES "
            + ", ".join(["(%s, %s)"] * len(spans))
            + ")) AS sent"
        )
        params = [value for s in spans for value in (s.trace_id, s.span_id)]
    # A scalar subquery, which the planner cannot turn into a join over every partition: the
    # trace's day, known when it runs, leaves one partition to read. (NULL: a new span.)
    return _statement(
        "SELECT DISTINCT (SELECT holder.run_id FROM trajectories_span span "
        "JOIN trajectories_run holder ON holder.id = span.run_id "
        "WHERE span.project_id = trace.project_id AND span.trace_id = trace.trace_id "
        "AND span.span_id = sent.span_id AND span.day = trace.day) "
        f"FROM {sent} JOIN trajectories_runtrace trace ON trace.project_id = %s "
        "AND trace.trace_id = sent.trace_id",
        [*params, project.pk],
    )


def _run_keys(
    spans: list[SpanData], owners: dict[str, tuple[str, bool]]
) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """Give every span its run key; returns the claims of traces new to this project
    {trace_id: run key} and the merges (trace_id, inferred run, named run) to make.

    A span names its run, or joins the run its trace belongs to, or starts a run named
    after its trace. A trace first inferred as its own run and now named by a span of a
    named run is merged into that run, with the spans of the batch that name none.
    """
    named = {s.trace_id: s.run_key for s in spans if s.run_key}
    of_trace: dict[str, str] = {}
    claims: dict[str, str] = {}
    merges: list[tuple[str, str, str]] = []
    for trace_id in {s.trace_id for s in spans}:
        owner = owners.get(trace_id)
        if owner is None:
            of_trace[trace_id] = claims[trace_id] = named.get(trace_id, trace_id)
        elif owner[1] and named.get(trace_id, owner[0]) != owner[0]:
            merges.append((trace_id, owner[0], named[trace_id]))
            of_trace[trace_id] = named[trace_id]
        else:
            of_trace[trace_id] = owner[0]
    for s in spans:
        if not s.run_key:
            s.run_key = of_trace[s.trace_id]
    return claims, sorted(merges)


def _run_merge(project: Project, *, trace_id: str, source_key: str, target: Run) -> None:
    """Move a trace from the run inferred for it into the run that named it."""
    source = Run.objects.select_for_update().filter(project=project, run_id=source_key).first()
    if source is None:
        return
    Span.objects.filter(run=source, trace_id=trace_id).update(run=target)
    RunTrace.objects.filter(project=project, trace_id=trace_id).update(run=target)
    links.links_move(source=source, target=target)
    if not Span.objects.filter(run=source).exists():
        source.delete()
    else:
        rows.send(_runs_refresh(project, {source_key: []}))


_FILLS = ",\n    ".join(
    f"{name} = CASE WHEN trajectories_run.{name} = '' THEN hint.{name} "
    f"ELSE trajectories_run.{name} END"
    for name in RUN_HINTS
)
# The days a refresh reads spans of, when it is given traces (`bounded`): those of the runs
# (first_day, last_day, as of their last refresh), of the traces of the batch (a new trace's
# spans, or a trace merged into one of the runs) and today (the day the span upsert gives a
# span whose trace has no row, one retention deleted meanwhile). Scalar subqueries, computed
# once before the scan: PostgreSQL then reads only the span partitions of those days, not
# every partition's index for every run. (Not bounded, the constant condition is planned
# away: every partition.)
_DAYS = """ AND (NOT %s::boolean OR (span.day >= (SELECT LEAST(min(r.first_day), (SELECT min(t.day)
        FROM trajectories_runtrace t WHERE t.project_id = %s AND t.trace_id = ANY(%s::text[])),
        %s::date)
    FROM trajectories_run r WHERE r.project_id = %s AND r.run_id = ANY(%s::text[]))
    AND span.day <= (SELECT GREATEST(max(r.last_day), (SELECT max(t.day)
        FROM trajectories_runtrace t WHERE t.project_id = %s AND t.trace_id = ANY(%s::text[])),
        %s::date)
    FROM trajectories_run r WHERE r.project_id = %s AND r.run_id = ANY(%s::text[]))))"""


def _refresh(*, days: str, runs: str, hints: str) -> str:
    """The text of a refresh of runs: `days` bounds the spans read, `runs` names the runs and
    `hints` is the relation `hint` of their names' hints (`run` its key)."""
    return (
        """UPDATE trajectories_run SET
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
    first_day = agg.first_day,
    last_day = agg.last_day,
    """
        + _FILLS
        + """,
    updated = %s
FROM (
    SELECT run.id AS run_id, run.run_id AS run_key,
        count(span.id) AS n,
        count(CASE WHEN span.status = 'error' THEN 1 END) AS errors,
        coalesce(sum(span.input_tokens), 0) AS tokens_in,
        coalesce(sum(span.output_tokens), 0) AS tokens_out,
        min(span.start) AS first,
        max(span."end") AS last,
        min(span.day) AS first_day,
        max(span.day) AS last_day,
        count(CASE WHEN span.parent_span_id = '' AND span."end" IS NOT NULL
            THEN 1 END) AS roots_ended,
        count(CASE WHEN span.parent_span_id = '' AND span.status = 'error'
            THEN 1 END) AS root_errors
    FROM trajectories_run run LEFT JOIN trajectories_span span ON span.run_id = run.id"""
        + days
        + """
    WHERE run.project_id = %s AND """
        + runs
        + """ GROUP BY run.id, run.run_id
) AS agg JOIN """
        + hints
        + """ ON hint.run = agg.run_key
WHERE trajectories_run.id = agg.run_id
"""
    )


# Aggregates of runs over their spans. A run inferred from spans takes its end and status
# from its root spans; a named run keeps what its run events said. Blank names are filled
# from what the spans just stored say about their run (the `hint` rows, by run key). A run
# left with no spans (all moved to other runs) counts none and has no days; it is kept, as a
# run event's run before its spans, and retention deletes it once it is old. On PostgreSQL
# one statement for all the runs, from arrays; elsewhere (SQLite, the demo) one per run.
RUNS_REFRESH = _refresh(
    days=_DAYS,
    runs="run.run_id = ANY(%s::text[])",
    hints=f"unnest(%s::text[], {', '.join(['%s::text[]'] * len(RUN_HINTS))}) "
    f"AS hint (run, {', '.join(RUN_HINTS)})",
)
RUN_REFRESH_ONE = _refresh(
    days="",
    runs="run.run_id = %s",
    hints=f"(SELECT %s AS run, {', '.join(f'%s AS {name}' for name in RUN_HINTS)}) AS hint",
)


def _runs_refresh(
    project: Project, hints: dict[str, list[SpanData]], extras: Extras = NONE
) -> list[Statement]:
    """The statements recomputing the aggregates of the runs {key: spans just stored in it
    (none: a run that lost spans)}, at least one, from their spans; they fill blank names
    from those spans' hints.

    One statement on PostgreSQL. Rescans each run's spans (one index range per run), so
    counts stay right however often a span is re-sent. Given spans, it reads only the
    partitions of the days of those runs and of those spans' traces (_DAYS); without (a
    merge of runs, rare), every partition.
    """
    assert hints, "no run to refresh"
    rows_of: list[list[str]] = []
    for key, spans in hints.items():
        # Roots and agent spans speak for the run before the spans below them.
        ordered = sorted(
            spans, key=lambda s: (bool(s.parent_span_id), s.kind != SpanKind.AGENT, s.start)
        )
        rows_of.append([key, *(distinct(_hint(ordered, name), extras)[:255] for name in RUN_HINTS)])
    now = timezone.now()
    if connection.vendor != "postgresql":
        return [_statement(RUN_REFRESH_ONE, [now, project.pk, row[0], *row]) for row in rows_of]
    keys = [row[0] for row in rows_of]
    traces = sorted({s.trace_id for spans in hints.values() for s in spans})
    days = [bool(traces), *([project.pk, traces, today(), project.pk, keys] * 2)]
    columns = [list(column) for column in zip(*rows_of, strict=True)]
    return [_statement(RUNS_REFRESH, [now, *days, project.pk, keys, *columns])]


def _hint(spans: list[SpanData], name: str) -> str:
    value = next((getattr(s, name) for s in spans if getattr(s, name)), "")
    if not value and name == "workflow":
        # A workflow no span names is named after the trace's root span.
        value = next((s.name for s in spans if not s.parent_span_id), "")
    return str(value)


def _spans_store(
    project: Project,
    spans: list[SpanData],
    touched: Touched,
    held: Slot | None = None,
    *,
    commit: bool = False,
) -> None:
    """Store spans in the transaction begun, and let go of the slot `held` with the last
    statements; with them too the transaction's COMMIT if `commit` (its outermost block
    ends with them).

    On PostgreSQL in two pipelines (`rows.send`), two round trips, whatever the number of
    spans: the waits' bounds with the look-ups of the traces' runs and of the runs holding
    spans sent again; then the runs, the traces they claim, the spans, the runs' aggregates
    (with those of the runs that lost spans to others), the slot and the COMMIT. Merging an
    inferred run into a named one, rare, costs a few more.
    """
    if not spans:
        return
    # The last copy of a span re-sent within one batch wins.
    spans = list({(s.trace_id, s.span_id): s for s in spans}.values())
    extras = extras_of(project)
    now = timezone.now()
    # Spans of one OTLP resource share its attributes dict: encode it once.
    resources: dict[int, tuple[str, dict[str, int]]] = {}
    for s in spans:
        if id(s.resource) not in resources:
            resources[id(s.resource)] = attributes_text(s.resource, ATTRIBUTE_CAP, extras=extras)
    project_pk = project.pk
    values = [_span_values(project_pk, s, now, resources[id(s.resource)], extras) for s in spans]
    found, held_by = _owners(project, {s.trace_id for s in spans}), _holders(project, spans)
    rows.send([*_bound_waits(), found, held_by])
    owners = {trace_id: (key, inferred) for trace_id, key, inferred in found.rows}
    holders = {key for (key,) in held_by.rows if key is not None}
    claims, merges = _run_keys(spans, owners)
    first_start: dict[str, datetime] = {}
    inferred: set[str] = set()
    hints: dict[str, list[SpanData]] = defaultdict(list)
    for s in spans:
        if s.run_key not in first_start or s.start < first_start[s.run_key]:
            first_start[s.run_key] = s.start
        if s.run_key == s.trace_id:
            inferred.add(s.run_key)
        hints[s.run_key].append(s)
        touched.trace_ids.add(s.trace_id)
        if s.tool_call_id:
            touched.tool_call_ids.add(s.tool_call_id)
        touched.tool_call_ids.update(s.requested_calls)
    touched.run_keys.update(first_start)
    # The runs the batch takes spans away from: locked with its own, refreshed with them.
    losing = holders - first_start.keys()
    # Spans stored before, in some run: the links taking their run from them follow them.
    resent = bool(holders)
    ahead = _runs_write(project, first_start, inferred, now, losing)
    if claims:
        ahead += _traces_claim(project, claims)
    if merges:
        # Rare: the merges read what the statements above wrote.
        rows.send(ahead)
        ahead = []
        for trace_id, source_key, target_key in merges:
            target = Run.objects.get(project=project, run_id=target_key)
            _run_merge(project, trace_id=trace_id, source_key=source_key, target=target)
            touched.run_keys.add(source_key)
    _spans_write(ahead, project, values, spans, hints, losing, resent, extras, held, commit)
    if held is not None:
        held.key = None  # the unlock has run: nothing left for `slot` to do


def _spans_write(
    ahead: list[Statement],
    project: Project,
    values: list[tuple[Any, ...]],
    spans: list[SpanData],
    hints: dict[str, list[SpanData]],
    losing: set[str],
    resent: bool,
    extras: Extras,
    held: Slot | None,
    commit: bool,
) -> None:
    """Send the statements `ahead`, the spans' upsert, the runs' refresh, the slot's unlock
    (if `held`) and the COMMIT (if `commit`): on PostgreSQL one pipeline."""
    upsert = _spans_upsert(project, values, spans, sorted(hints.keys() | losing), resent)
    if upsert is None:
        # Elsewhere (SQLite, the demo) the ORM writes the spans, after the statements ahead.
        rows.send(ahead)
        _spans_create(project, values, spans)
        ahead = []
    else:
        ahead = [*ahead, upsert]
    # A run that lost spans has no hints of its own: its names are kept.
    refresh = _runs_refresh(project, {**{key: [] for key in losing}, **hints}, extras)
    rows.send([*ahead, *refresh, *(held.give_back() if held is not None else [])], commit=commit)


def spans_ingest(*, project: Project, spans: list[SpanData], slot: Slot | None = None) -> Touched:
    """Store spans (new or re-sent) and the runs they belong to, in one transaction.

    Raises Overloaded when the database is slow. The caller holds one of the project's
    slots, `slot`, which is let go with the batch's last statements (before its COMMIT).
    """
    touched = Touched()
    with _ingest_transaction() as outermost:
        _spans_store(project, spans, touched, slot, commit=outermost)
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
        if claims := {t: run.run_id for t in event.trace_ids if t not in owners}:
            rows.send(_traces_claim(project, claims))
        for trace_id, (owner, inferred) in owners.items():
            if inferred and owner != run.run_id:
                _run_merge(project, trace_id=trace_id, source_key=owner, target=run)
                touched.run_keys.add(owner)
        if owners:
            rows.send(_runs_refresh(project, {run.run_id: []}))
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
    with _ingest_transaction() as outermost:
        rows.send(_bound_waits())
        new = _events_claim(project, list(valid))
        fresh = [event for event_id, (_, event) in valid.items() if event_id in new]
        _run_events_store(project, [e for e in fresh if isinstance(e, RunEventIn)], touched)
        _spans_store(
            project,
            [_span_of_event(e) for e in fresh if isinstance(e, SpanEventIn)],
            touched,
            commit=outermost,
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
