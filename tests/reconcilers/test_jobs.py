"""Probe jobs on a real Redis queue, the scan that enqueues them, the schedule, the command."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import django_rq
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rq import SimpleWorker
from rq.cron import CronScheduler
from rq.job import JobStatus

from durability import jobs
from durability.audit import first_broken_entry
from durability.management.commands.scheduler import Scheduler, paced
from durability.models import Case, Effect, Probe, Receipt, ReconcilerConfig
from durability.reconcilers import jobs as reconciler_jobs
from durability.reconcilers.reconciling import probes_due
from tests.local_http import LocalHttp, Reply

FOUND = {"id": "re_1", "status": "succeeded"}


@pytest.fixture
def server():
    with LocalHttp() as s:
        yield s


@pytest.fixture
def queue(settings):
    assert settings.REDIS_URL, "these tests need REDIS_URL"
    q = django_rq.get_queue("default")
    q.connection.flushdb()
    yield q
    q.connection.flushdb()


def work(queue) -> None:
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


@pytest.fixture
def stripe(project, server):
    return ReconcilerConfig.objects.create(
        project=project,
        target="stripe",
        kind="http",
        config={
            "url": server.url + "/refunds/{key}",
            "external_id_path": "id",
            "status_path": "status",
            "found": ["succeeded"],
        },
    )


def timed_out(api, key, **intent) -> Effect:
    api.intent(key, **intent)
    api.timeout(key)
    return Effect.objects.get(key=key)


def test_the_scan_enqueues_due_effects_and_a_worker_settles_them(
    api, stripe, server, queue, django_capture_on_commit_callbacks
):
    one, two = timed_out(api, "refund:1"), timed_out(api, "refund:2")
    timed_out(api, "mail:1", target="smtp")  # no reconciler for its target
    api.intent("refund:3")  # pending: nothing to ask yet
    server.reply("/refunds/refund%3A1", Reply(200, FOUND))
    server.reply("/refunds/refund%3A2", Reply(200, {"id": "re_2", "status": "succeeded"}))

    with django_capture_on_commit_callbacks(execute=True):
        assert reconciler_jobs.probe_scan() == 2
    assert queue.count == 2
    work(queue)

    assert {e.state for e in Effect.objects.filter(pk__in=[one.pk, two.pk])} == {"succeeded"}
    assert Effect.objects.get(key="mail:1").state == "timed_out"
    assert set(Receipt.objects.values_list("strength", flat=True)) == {"provider_confirmed"}
    assert [p.requested_by for p in Probe.objects.all()] == ["system:scan"] * 2


def test_a_probed_effect_is_due_again_only_after_the_interval(api, stripe, server):
    effect = timed_out(api, "refund:1")
    assert probes_due() == [effect.pk]
    reconciler_jobs.probe(effect.pk)  # 404: not found, evidence only
    assert probes_due() == []
    later = timezone.now() + timedelta(seconds=stripe.interval_s + 1)
    assert probes_due(now=later) == [effect.pk]
    stripe.enabled = False
    stripe.save()
    assert probes_due(now=later) == []


def test_a_new_attempt_is_a_new_question(api, stripe, server, project):
    effect = timed_out(api, "refund:1", replay="safe")
    reconciler_jobs.probe(effect.pk)
    api.intent("refund:1", replay="safe")  # attempt 2, pending
    api.timeout("refund:1")
    assert probes_due() == [effect.pk]


def test_an_unknown_answer_is_retried_until_one_is_trusted(
    api, stripe, server, queue, settings, django_capture_on_commit_callbacks
):
    settings.TALLYBOOK_PROBE_RETRY_DELAYS = [0, 0, 0]
    effect = timed_out(api, "refund:1")
    server.reply("/refunds/refund%3A1", Reply(503, {}), Reply(200, b"not json"), Reply(200, FOUND))
    with django_capture_on_commit_callbacks(execute=True):
        reconciler_jobs.probe_scan()
    work(queue)
    assert list(Probe.objects.order_by("id").values_list("answer", flat=True)) == [
        "unknown",
        "unknown",
        "found",
    ]
    assert Effect.objects.get(pk=effect.pk).state == "succeeded"


def test_retries_wait_for_the_configured_backoff(
    api, stripe, server, queue, settings, django_capture_on_commit_callbacks
):
    settings.TALLYBOOK_PROBE_RETRY_DELAYS = [30, 120]
    effect = timed_out(api, "refund:1")
    server.reply("/refunds/refund%3A1", Reply(503, {}))
    with django_capture_on_commit_callbacks(execute=True):
        jobs.enqueue(reconciler_jobs.probe, effect.pk, retry=reconciler_jobs.probe_retry())
    work(queue)
    (job_id,) = queue.scheduled_job_registry.get_job_ids()
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.SCHEDULED
    assert job.retries_left == 1
    assert job.retry_intervals == [30, 120]
    assert Probe.objects.get().answer == "unknown"


def test_running_a_probe_job_twice_is_harmless(
    api, stripe, server, queue, project, django_capture_on_commit_callbacks
):
    effect = timed_out(api, "refund:1")
    server.reply("/refunds/refund%3A1", Reply(200, FOUND))
    with django_capture_on_commit_callbacks(execute=True):
        jobs.enqueue(reconciler_jobs.probe, effect.pk)
        jobs.enqueue(reconciler_jobs.probe, effect.pk)
    work(queue)
    results = [queue.fetch_job(i).return_value() for i in queue.finished_job_registry.get_job_ids()]
    assert sorted(results) == ["found", "nothing to probe"]
    assert Receipt.objects.count() == 1 and Probe.objects.count() == 1
    assert Case.objects.get(effect=effect).closed is not None
    assert first_broken_entry(project) is None


def test_without_redis_the_same_work_runs_inline(
    api, stripe, server, queue, settings, django_capture_on_commit_callbacks
):
    settings.REDIS_URL = ""
    effect = timed_out(api, "refund:1")
    server.reply("/refunds/refund%3A1", Reply(503, {}), Reply(200, FOUND))
    with django_capture_on_commit_callbacks(execute=True):
        assert reconciler_jobs.probe_scan() == 1  # unknown: logged, as a worker would, not raised
    assert queue.count == 0
    assert Probe.objects.get().answer == "unknown"
    later = timezone.now() + timedelta(seconds=stripe.interval_s + 1)
    assert probes_due(now=later) == [effect.pk]  # the next scan asks again


def test_jobs_wait_for_the_transaction_to_commit(api, stripe, server, queue, settings):
    effect = timed_out(api, "refund:1")
    jobs.enqueue(reconciler_jobs.probe, effect.pk)  # inside the test's transaction, never committed
    assert queue.count == 0


def test_the_schedule_runs_the_sweep_probes_alerts_emails_repairs_tallies_and_retention(queue):
    scheduler = CronScheduler(connection=queue.connection)
    scheduler.load_config_from_file("durability.cron")
    names = {job.func_name: job.interval for job in scheduler.get_jobs()}
    assert names == {
        "durability.ledger.jobs.sweep": 5,
        "durability.reconcilers.jobs.probe_scan": 60,
        "durability.desk.jobs.alert": 60,
        "durability.desk.jobs.overdue_notify": 60,
        "durability.notices.notices_retry": 60,
        "durability.desk.jobs.bulks_resume": 60,
        "trajectories.jobs.links_repair": 60,
        "durability.tallies.projects_tally": 60,
        "trajectories.jobs.partitions_upkeep": 3600,
        "durability.retention.jobs.payloads_prune": 3600,
        "durability.retention.jobs.projects_delete_resume": 600,
    }


def test_the_scheduler_at_a_pace_scales_every_interval_to_whole_seconds(queue):
    def intervals(pace: float) -> dict[str, int]:
        scheduler = Scheduler(connection=queue.connection)
        scheduler.load_config_from_file("durability.cron")
        paced(scheduler, pace)
        return {job.func_name: job.interval or 0 for job in scheduler.get_jobs()}

    quick = intervals(0.2)
    assert quick["durability.ledger.jobs.sweep"] == 1
    assert quick["durability.desk.jobs.alert"] == 12
    assert quick["durability.retention.jobs.payloads_prune"] == 720
    # Never below a second: at 0 rq would enqueue the job on every pass of its loop.
    assert min(intervals(0.001).values()) == 1


def test_the_probe_command_probes_every_due_effect(api, stripe, server):
    timed_out(api, "refund:1")
    timed_out(api, "refund:2")
    server.reply("/refunds/refund%3A1", Reply(200, FOUND))
    out = StringIO()
    call_command("probe", stdout=out)
    assert "refund:1 (effect" in out.getvalue() and "found -> probe_found" in out.getvalue()
    assert "refund:2 (effect" in out.getvalue() and "not_found" in out.getvalue()
    assert out.getvalue().strip().endswith("Probed 2 effect(s); 1 settled.")
    assert Probe.objects.filter(requested_by="system:probe-command").count() == 2


def test_the_probe_command_probes_one_effect_on_request(api, stripe, server):
    effect = timed_out(api, "refund:1")
    reconciler_jobs.probe(effect.pk)  # probed lately: the scan would skip it, the command does not
    out = StringIO()
    call_command("probe", "--effect", str(effect.pk), stdout=out)
    assert "not_found" in out.getvalue()
    assert Probe.objects.count() == 2
    api.receipt("refund:1", "re_1")
    with pytest.raises(CommandError, match="nothing to probe"):
        call_command("probe", "--effect", str(effect.pk))
