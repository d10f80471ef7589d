"""Trajectories: runs, their spans (model requests, tool calls), and the links to effects."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime
from functools import cached_property

from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from durability.inbound import EARLIEST
from durability.models import Effect, Project

# What the database holds of the times agents report (runs' and spans' starts and ends).
# The entrances take only times from 2000 to one day from now (durability.inbound); these
# constraints keep every other write out too, since a value Python cannot load (year 10000,
# or year 1 turned into 1 BC by its offset) would make every page that lists it fail.
# The latest is no real time, only one that Python loads in any zone with room to spare.
LATEST_STORED = datetime(3000, 1, 1, tzinfo=UTC)


def today() -> date:
    """The current UTC day: the partition of the traces first seen now."""
    return timezone.now().astimezone(UTC).date()


def _in_range(name: str, *, null: bool = False) -> Q:
    within = Q(**{f"{name}__gte": EARLIEST, f"{name}__lt": LATEST_STORED})
    return within | Q(**{f"{name}__isnull": True}) if null else within


class RunStatus(models.TextChoices):
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"


class Run(models.Model):
    """One agent or workflow execution, possibly over many processes and traces."""

    # run_project_run_id_uniq leads with the project: it serves the foreign key too.
    project = models.ForeignKey(Project, models.CASCADE, related_name="runs", db_index=False)
    # The client's id; a run inferred from spans alone is named after its first trace.
    run_id = models.CharField(max_length=255)
    # True until a run event names the run: its fields then come from spans.
    inferred = models.BooleanField(default=False)
    agent = models.CharField(max_length=255, blank=True)
    workflow = models.CharField(max_length=255, blank=True)
    workflow_version = models.CharField(max_length=255, blank=True)
    conversation_id = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    started = models.DateTimeField(default=timezone.now)
    ended = models.DateTimeField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    # Aggregates over the run's spans, recomputed whenever spans arrive.
    span_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    # The first and last partition day (Span.day) of the run's spans, recomputed with the
    # aggregates: the run page reads only those partitions, retention finds runs gone with them.
    first_day = models.DateField(null=True, blank=True)
    last_day = models.DateField(null=True, blank=True)
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "run_id"], name="run_project_run_id_uniq"),
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            models.CheckConstraint(condition=_in_range("started"), name="run_started_in_range"),
            models.CheckConstraint(
                condition=_in_range("ended", null=True), name="run_ended_in_range"
            ),
        ]
        indexes = [
            # The runs page: runs in a time range, newest first, keyset on (started, id).
            models.Index(fields=["project", "-started", "-id"], name="run_project_started_idx"),
            # Retention (every project at once): the runs whose spans all expired.
            models.Index(fields=["last_day"], name="run_last_day_idx"),
        ]

    def __str__(self) -> str:
        return self.run_id

    def get_absolute_url(self) -> str:
        return reverse("run", args=[self.pk])

    @property
    def duration_ms(self) -> float | None:
        if self.ended is None:
            return None
        return (self.ended - self.started).total_seconds() * 1000


class RunTrace(models.Model):
    """Which run a trace belongs to, so that spans without a run id find theirs."""

    # runtrace_trace_uniq leads with the project: it serves the foreign key too.
    project = models.ForeignKey(Project, models.CASCADE, related_name="+", db_index=False)
    trace_id = models.CharField(max_length=32)
    run = models.ForeignKey(Run, models.CASCADE, related_name="traces")
    # The UTC day the trace was first seen: the partition of all its spans (Span.day), so
    # that a span sent again, whenever, lands where it was stored first.
    day = models.DateField(default=today)

    class Meta:
        constraints = [
            # Span ingest: the run of a trace, by (project, trace_id).
            models.UniqueConstraint(fields=["project", "trace_id"], name="runtrace_trace_uniq"),
        ]
        indexes = [
            # Retention (every project at once): the traces whose partition was dropped.
            models.Index(fields=["day"], name="runtrace_day_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.trace_id} in {self.run_id}"


class SpanKind(models.TextChoices):
    MODEL = "model"
    TOOL = "tool"
    AGENT = "agent"
    OTHER = "other"


class SpanStatus(models.TextChoices):
    UNSET = "unset"
    OK = "ok"
    ERROR = "error"


class Span(models.Model):
    """One step of a run. Input, output and attributes are stored redacted and capped.

    On PostgreSQL the table is partitioned by `day` (one partition per UTC day, and a
    DEFAULT one; trajectories.retention), its primary key is (id, day), and nothing holds a
    foreign key to it: other rows name a span by value (project, trace_id, span_id).
    """

    # Every span written updates every index: the foreign keys use the indexes that lead
    # with them (span_identity_uniq, span_run_start_idx) rather than two of their own.
    # No constraint in the database (db_constraint=False): a partition's foreign keys would
    # put triggers on the run and project tables, and dropping the partition then locks
    # those tables, which an ingest transaction holds as it writes its spans (a deadlock).
    # Ingest writes a span's run in the span's own transaction (RUNS_UPSERT locks it);
    # retention deletes old spans by partition, and a project's deletion deletes its spans
    # partition by partition (durability/retention/projects.py) before its runs.
    project = models.ForeignKey(
        Project, models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    run = models.ForeignKey(
        Run, models.CASCADE, related_name="spans", db_index=False, db_constraint=False
    )
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    # The partition key: its trace's first-seen day (RunTrace.day), never the span's own
    # times, so every copy of a span lands in one partition and the identity holds.
    day = models.DateField(default=today)
    parent_span_id = models.CharField(max_length=16, blank=True)
    kind = models.CharField(max_length=8, choices=SpanKind.choices, default=SpanKind.OTHER)
    # The GenAI operation (chat, execute_tool, invoke_agent, …) when the span names one.
    operation = models.CharField(max_length=64, blank=True)
    name = models.CharField(max_length=255)
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=8, choices=SpanStatus.choices, default=SpanStatus.UNSET)
    status_message = models.TextField(blank=True)
    provider = models.CharField(max_length=100, blank=True)
    request_model = models.CharField(max_length=255, blank=True)
    response_model = models.CharField(max_length=255, blank=True)
    input_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    output_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=255, blank=True)
    tool_name = models.CharField(max_length=255, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    resource = models.JSONField(default=dict, blank=True)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    # {field: {"size": original bytes, "cap": bytes kept}} for every value cut to its cap.
    capped = models.JSONField(default=dict, blank=True)
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Re-sent spans update in place; effect links find spans by these ids. The
            # partition key is a column of any unique index of a partitioned table; the day
            # is a function of (project, trace_id), so this is still one row per identity.
            models.UniqueConstraint(
                fields=["project", "trace_id", "span_id", "day"], name="span_identity_uniq"
            ),
            models.CheckConstraint(condition=Q(kind__in=SpanKind.values), name="span_kind_valid"),
            models.CheckConstraint(
                condition=Q(status__in=SpanStatus.values), name="span_status_valid"
            ),
            models.CheckConstraint(condition=_in_range("start"), name="span_start_in_range"),
            models.CheckConstraint(condition=_in_range("end", null=True), name="span_end_in_range"),
        ]
        indexes = [
            # The run page: all spans of one run in one query, in time order.
            models.Index(fields=["run", "start", "id"], name="span_run_start_idx"),
            # Effect links by tool_call_id: the tool span that executed a call.
            models.Index(
                fields=["project", "tool_call_id"],
                name="span_tool_call_idx",
                condition=~Q(tool_call_id=""),
            ),
            # Effect links without a tool_call_id: the nearest model span before a tool call.
            models.Index(
                fields=["project", "trace_id", "start"],
                name="span_model_by_trace_idx",
                condition=Q(kind="model"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.span_id})"

    def get_absolute_url(self) -> str:
        return reverse("run-span", args=[self.run_id, self.pk])

    @property
    def duration_ms(self) -> float | None:
        if self.end is None:
            return None
        return (self.end - self.start).total_seconds() * 1000


class RequestedToolCall(models.Model):
    """A tool call a model span asked for (a `tool_call` part of its output messages).

    Names its span by value, and is partitioned by the span's day as spans are: retention
    drops both together.
    """

    # requested_call_id_idx and requested_call_uniq lead with these: no index of their own.
    # No constraint in the database, as for Span.project (dropping a partition must not lock
    # the project table).
    project = models.ForeignKey(
        Project, models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    tool_call_id = models.CharField(max_length=255)
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    day = models.DateField(default=today)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "trace_id", "span_id", "tool_call_id", "day"],
                name="requested_call_uniq",
            ),
        ]
        indexes = [
            # Effect links: the model span that asked for a tool call id.
            models.Index(fields=["project", "tool_call_id"], name="requested_call_id_idx"),
        ]

    def __str__(self) -> str:
        return self.tool_call_id


class SeenEvent(models.Model):
    """An ingested event id, recorded in the transaction that stored the event."""

    # seen_event_uniq leads with the project: it serves the foreign key too.
    project = models.ForeignKey(Project, models.CASCADE, related_name="+", db_index=False)
    event_id = models.CharField(max_length=255)
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Event ingest: has this id been seen? (INSERT … ON CONFLICT DO NOTHING).
            models.UniqueConstraint(fields=["project", "event_id"], name="seen_event_uniq"),
        ]

    def __str__(self) -> str:
        return self.event_id


class EffectLink(models.Model):
    """Where an effect sits in a trajectory: its run, its tool call, the model that asked.

    Holds a copy of the effect's lookup keys so that arriving spans can find the
    effects waiting for them through this app's own indexes.
    """

    effect = models.OneToOneField(Effect, models.CASCADE, primary_key=True, related_name="link")
    # link_trace_idx leads with the project: it serves the foreign key too.
    project = models.ForeignKey(Project, models.CASCADE, related_name="+", db_index=False)
    run_key = models.CharField(max_length=255, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    tool_call_id = models.CharField(max_length=255, blank=True)
    # The run of the span `run_span` names, else the one `run_key` names (links.LINKS_RESOLVE);
    # a batch moving that span to another run moves the link with it (links.LINKS_FOLLOW).
    run = models.ForeignKey(Run, models.SET_NULL, null=True, blank=True, related_name="links")
    # The tool span and the model span found, by value (in the link's project): spans are
    # partitioned, and outlive nothing that points at them (blank: none found).
    tool_trace_id = models.CharField(max_length=32, blank=True)
    tool_span_id = models.CharField(max_length=16, blank=True)
    model_trace_id = models.CharField(max_length=32, blank=True)
    model_span_id = models.CharField(max_length=16, blank=True)
    resolved = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Span ingest: effects recorded in one of the batch's traces.
            models.Index(fields=["project", "trace_id"], name="link_trace_idx"),
            # Span ingest: effects naming one of the batch's tool call ids.
            models.Index(fields=["project", "tool_call_id"], name="link_tool_call_idx"),
            # Run ingest: effects naming the run by its client id.
            models.Index(fields=["project", "run_key"], name="link_run_key_idx"),
        ]

    def __str__(self) -> str:
        return f"link of effect {self.effect_id}"

    @property
    def run_span(self) -> tuple[str, str]:
        """The span the link takes its run from, by value: its tool span, else the span its
        effect was recorded in, else its model span (blank: none); links.LINKS_FOLLOW says
        it in SQL. (An effect recorded in a span never stored takes its model span's run:
        the resolution after the batch, links.links_refresh, follows that one.)"""
        if self.tool_span_id:
            return (self.tool_trace_id, self.tool_span_id)
        if self.span_id:
            return (self.trace_id, self.span_id)
        return (self.model_trace_id, self.model_span_id)

    @cached_property
    def _spans(self) -> dict[tuple[str, str], Span]:
        """The tool and model spans named, still stored: one query, in their partitions."""
        return spans_named(
            self.project_id,
            [(self.tool_trace_id, self.tool_span_id), (self.model_trace_id, self.model_span_id)],
        )

    @property
    def tool_span(self) -> Span | None:
        return self._spans.get((self.tool_trace_id, self.tool_span_id))

    @property
    def model_span(self) -> Span | None:
        return self._spans.get((self.model_trace_id, self.model_span_id))


def spans_named(project_id: int, names: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Span]:
    """The spans of a project named by value, (trace_id, span_id) pairs (blank ones skipped),
    with their runs: one query, reading only their traces' partitions."""
    wanted = {(t, s) for t, s in names if t and s}
    if not wanted:
        return {}
    traces = {t for t, _ in wanted}
    days = RunTrace.objects.filter(project_id=project_id, trace_id__in=traces).values("day")
    found = Span.objects.select_related("run").filter(
        project_id=project_id,
        trace_id__in=traces,
        span_id__in={s for _, s in wanted},
        day__in=days,
    )
    return {(s.trace_id, s.span_id): s for s in found if (s.trace_id, s.span_id) in wanted}
