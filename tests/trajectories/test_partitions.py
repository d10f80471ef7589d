"""Spans partitioned by day on PostgreSQL: partitions made ahead, expired ones dropped whole,
a span stored once whenever it is sent again, and the run page reading its run's days only."""

from __future__ import annotations

import io
import re
import threading
from datetime import UTC, date, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from tests.trajectories.support import TRACE, chat, post_traces, request, span, tool
from trajectories import retention
from trajectories.links import effect_link_record
from trajectories.models import EffectLink, RequestedToolCall, Run, RunTrace, Span
from trajectories.retention import PARTITIONED, partition_name, partitions
from trajectories.views import run_spans

AGENT, MODEL, TOOL = "a" * 16, "1" * 16, "2" * 16
SPANS, CALLS = PARTITIONED


def _now() -> datetime:
    return timezone.now().astimezone(UTC)


@pytest.fixture
def clock(monkeypatch):
    """Set the time Tallybook reads (django.utils.timezone.now) to a given moment."""

    def set_to(moment: datetime) -> None:
        monkeypatch.setattr(timezone, "now", lambda: moment)

    return set_to


def _partition_of(span_id: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM trajectories_span WHERE span_id = %s", [span_id]
        )
        return cursor.fetchone()[0]


def _send_run(api) -> Run:
    post_traces(
        api.client,
        api.key,
        request(
            span(AGENT, "invoke_agent refunds", duration_ms=500),
            chat(MODEL, parent=AGENT, at_ms=10, calls=("call_1",)),
            tool(TOOL, "call_1", parent=AGENT, at_ms=100),
        ),
    )
    return Run.objects.get()


def test_the_migration_makes_the_partitions_of_today_and_the_week_ahead(db):
    today = _now().date()
    for table in PARTITIONED:
        assert set(partitions(table)) >= {today + timedelta(days=n) for n in range(8)}


def test_upkeep_creates_partitions_ahead_once(db):
    later = _now() + timedelta(days=40)
    days = [later.date() + timedelta(days=n) for n in range(3)]
    created = retention.partitions_create(now=later, ahead=2)
    assert created == [partition_name(table, day) for table in PARTITIONED for day in days]
    assert retention.partitions_create(now=later, ahead=2) == []
    for table in PARTITIONED:
        assert set(days) <= set(partitions(table))


def test_retention_drops_the_partitions_wholly_past_the_horizon_and_the_runs_left_empty(api):
    run = _send_run(api)
    today = _now().date()
    assert _partition_of(TOOL) == partition_name(SPANS, today)
    # Thirty days on, today's partition is still inside the horizon.
    kept = retention.drop_expired(now=_now() + timedelta(days=30), days=30)
    assert kept.dropped == [] and Span.objects.count() == 3
    # A day later it is wholly past it: dropped, with the traces and the run it held.
    report = retention.drop_expired(now=_now() + timedelta(days=31), days=30)
    assert partition_name(SPANS, today) in report.dropped
    assert partition_name(CALLS, today) in report.dropped
    assert today not in partitions(SPANS) and today + timedelta(days=1) in partitions(SPANS)
    assert (report.traces_deleted, report.runs_deleted) == (1, 1)
    assert not Span.objects.exists() and not RequestedToolCall.objects.exists()
    assert not RunTrace.objects.exists() and not Run.objects.filter(pk=run.pk).exists()
    # Run again, it finds nothing more to do.
    again = retention.drop_expired(now=_now() + timedelta(days=31), days=30)
    assert (again.dropped, again.runs_deleted, again.traces_deleted) == ([], 0, 0)


def test_a_span_sent_again_after_midnight_is_stored_once_in_the_partition_of_its_first_day(
    api, clock
):
    day = _now().date() + timedelta(days=1)
    midnight = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    clock(midnight - timedelta(seconds=1))
    post_traces(api.client, api.key, request(span(AGENT, "before midnight")))
    clock(midnight + timedelta(seconds=1))
    post_traces(api.client, api.key, request(span(AGENT, "after midnight")))
    stored = Span.objects.get()
    assert (stored.name, stored.day) == ("after midnight", day)
    assert _partition_of(AGENT) == partition_name(SPANS, day)
    # A trace first seen after midnight goes to the next day's partition, which exists.
    other = "5" * 32
    post_traces(api.client, api.key, request(span(MODEL, trace_id=other)))
    assert _partition_of(MODEL) == partition_name(SPANS, day + timedelta(days=1))


def test_a_span_of_a_day_without_a_partition_is_kept_and_moved_into_it_when_it_is_made(api, clock):
    later = _now() + timedelta(days=20)
    clock(later)
    assert post_traces(api.client, api.key, request(span(AGENT))).status_code == 200
    assert _partition_of(AGENT) == f"{SPANS}_default"
    assert partition_name(SPANS, later.date()) in retention.partitions_create(now=later, ahead=0)
    assert _partition_of(AGENT) == partition_name(SPANS, later.date())
    assert Span.objects.count() == 1


def test_a_run_a_span_moved_away_from_is_refreshed_from_the_partitions_of_its_days(api, clock):
    """run-a holds a trace of one day and a trace of the next; two days on, a span of the
    second moves to run-b. run-a's refresh reads its own days too, not only the batch's."""
    first, second = "5" * 32, "6" * 32
    day = _now().date() + timedelta(days=1)
    at = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12)
    run_a = {"service.name": "a", "tallybook.run.id": "run-a"}
    clock(at)
    post_traces(api.client, api.key, request(span(AGENT, trace_id=first), resource=run_a))
    clock(at + timedelta(days=1))
    moved = chat(MODEL, trace_id=second)
    post_traces(api.client, api.key, request(span(TOOL, trace_id=second), moved, resource=run_a))
    clock(at + timedelta(days=2))
    refreshes: list[tuple[str, object]] = []

    def keep(execute, sql, params, many, context):
        if sql.startswith("UPDATE trajectories_run SET"):
            refreshes.append((sql, params))
        return execute(sql, params, many, context)

    run_b = {"service.name": "a", "tallybook.run.id": "run-b"}
    with connection.execute_wrapper(keep):
        post_traces(api.client, api.key, request(moved, resource=run_b))
    a, b = Run.objects.get(run_id="run-a"), Run.objects.get(run_id="run-b")
    assert (a.span_count, a.input_tokens, a.first_day, a.last_day) == (
        2,
        0,
        day,
        day + timedelta(days=1),
    )
    assert (b.span_count, b.input_tokens) == (1, 100)
    [(sql, params)] = refreshes
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    scanned = set(re.findall(rf"on ({SPANS}_(?:p\d{{8}}|default)) \w+ \(actual", plan))
    # run-a's two days and the batch's (the moved span's trace, and today's).
    assert scanned == {partition_name(SPANS, day + timedelta(days=n)) for n in range(3)}, plan


def test_the_run_pages_span_query_reads_only_the_partitions_of_its_days(api):
    run = _send_run(api)
    plan = run_spans(run).order_by("start", "id").explain()
    read = set(re.findall(rf"\b{SPANS}_(?:p\d{{8}}|default)\b", plan))
    assert read == {partition_name(SPANS, _now().date())}


def test_effects_link_to_their_tool_call_and_model_request_by_value(client, alice, api):
    run = _send_run(api)
    effect = api.intent("refund:1", trace_id=TRACE, span_id=TOOL).json()["effect"]["id"]
    effect_link_record(effect_id=effect)
    link = EffectLink.objects.get(pk=effect)
    assert (link.tool_trace_id, link.tool_span_id) == (TRACE, TOOL)
    assert (link.model_trace_id, link.model_span_id) == (TRACE, MODEL)
    client.force_login(alice)
    # On the run page the effect sits under its tool call.
    executed = Span.objects.get(span_id=TOOL)
    page = client.get(f"/runs/{run.pk}/spans/{executed.pk}/").content.decode()
    assert "refund:1" in page
    effect_page = client.get(f"/effects/{effect}/").content.decode()
    for span_id in (TOOL, MODEL):
        found = Span.objects.get(span_id=span_id)
        assert f'href="/runs/{run.pk}/spans/{found.pk}/"' in effect_page
    # Once retention has dropped the spans, the effect still names them, as no longer kept.
    retention.drop_expired(now=_now() + timedelta(days=31), days=30)
    effect_page = client.get(f"/effects/{effect}/").content.decode()
    assert TOOL in effect_page and "no longer kept" in effect_page


@pytest.mark.django_db(transaction=True)
def test_two_upkeeps_at_once_make_each_partition_once():
    later = _now() + timedelta(days=60)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def upkeep() -> None:
        try:
            results.append(retention.partitions_create(now=later, ahead=3))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=upkeep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    made = sorted(name for names in results for name in names)
    days: list[date] = [later.date() + timedelta(days=n) for n in range(4)]
    assert made == sorted(partition_name(t, d) for t in PARTITIONED for d in days)


def test_the_partitions_command_drops_what_the_days_given_leave_out(api):
    _send_run(api)
    out = io.StringIO()
    call_command("partitions", "--days", "30", stdout=out)
    assert "dropped 0 partitions" in out.getvalue() and Span.objects.count() == 3
    with pytest.raises(CommandError, match="--days"):
        call_command("partitions", "--days", "-1")


def test_a_project_that_keeps_spans_for_less_loses_them_before_the_partitions_go(api, project):
    """Partitions hold every project's spans: they go at the longest retention of any
    project, and a project whose policy keeps spans for less has its own deleted first."""
    from durability.models import Project, RetentionPolicy

    run = _send_run(api)
    RetentionPolicy.objects.create(project=project, span_days=10)
    Project.objects.create(name="keeps the default")  # TALLYBOOK_SPAN_RETENTION_DAYS: 30
    assert retention.span_days_of_projects() == (30, {project.pk: 10})
    report = retention.partitions_upkeep(now=_now() + timedelta(days=11))
    assert report.dropped == [] and report.rows_deleted == 4  # 3 spans, 1 requested call
    assert not Span.objects.filter(project=project).exists()
    assert not Run.objects.filter(pk=run.pk).exists() and report.runs_deleted == 1
    assert _now().date() in partitions(SPANS), "the other project's days are still kept"


def test_the_partitioned_tables_hold_no_foreign_keys(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' "
            "AND conrelid IN (SELECT oid FROM pg_class WHERE relname LIKE ANY (%s))",
            [[f"{table}%" for table in PARTITIONED]],
        )
        assert cursor.fetchall() == []


@pytest.mark.django_db(transaction=True)
def test_dropping_a_partition_does_not_wait_for_an_ingest_holding_the_run_table(api):
    """An OTLP batch writes its runs first (RUNS_UPSERT), then its spans. Were the partitions
    to hold foreign keys to the runs, dropping one would lock the run table behind that
    batch while the batch waits for the span table behind the drop: a deadlock, one side
    aborted. Now the drop needs the span tables only."""
    run = _send_run(api)
    old = _now() - timedelta(days=40)
    retention.partitions_create(now=old, ahead=0)
    outcome: list[object] = []

    def upkeep() -> None:
        try:
            outcome.append(retention.drop_expired(days=30))
        except BaseException as exc:  # reported below, in the test's thread
            outcome.append(exc)
        finally:
            connections.close_all()

    try:
        with transaction.atomic():
            # The batch in progress: its run written and locked, its spans not yet.
            Run.objects.filter(pk=run.pk).update(updated=timezone.now())
            thread = threading.Thread(target=upkeep)
            thread.start()
            thread.join(120)
            assert not thread.is_alive()
    finally:
        # A transactional test's partitions outlive it: none of the old day's may be left.
        with connection.cursor() as cursor:
            for table in PARTITIONED:
                cursor.execute(f'DROP TABLE IF EXISTS "{partition_name(table, old.date())}"')
    [report] = outcome
    assert isinstance(report, retention.Report), report
    assert report.dropped == [partition_name(t, old.date()) for t in PARTITIONED]
    assert Span.objects.count() == 3 and Run.objects.filter(pk=run.pk).exists()


def test_a_batch_refreshes_its_runs_from_the_partitions_of_their_days_only(api):
    _send_run(api)
    refreshes: list[tuple[str, object]] = []

    def keep(execute, sql, params, many, context):
        if sql.startswith("UPDATE trajectories_run SET"):
            refreshes.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        post_traces(api.client, api.key, request(span("3" * 16, parent=AGENT, at_ms=200)))
    [(sql, params)] = refreshes
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    scanned = set(re.findall(rf"on ({SPANS}_(?:p\d{{8}}|default)) \w+ \(actual", plan))
    # The run's one day (not the clock's: the test may cross midnight).
    day = RunTrace.objects.get().day
    assert scanned == {partition_name(SPANS, day)}, plan
    assert Run.objects.get().span_count == 4
