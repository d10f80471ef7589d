"""The deadline sweep: `manage.py sweep` and the RQ job time out pending effects past deadline."""

from __future__ import annotations

import io
import threading
from datetime import timedelta

import django_rq
import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.utils import timezone
from rq import SimpleWorker

from durability.ledger import evidence
from durability.ledger import jobs as ledger_jobs
from durability.models import Case, Effect, Project, State
from tests.ledger.support import effect_in, row_counts


def overdue(project: Project, *keys: str) -> list[Effect]:
    """Pending effects whose deadline passed a minute ago, as if the clock had moved on."""
    effects = [effect_in(project, State.PENDING, key=key, timeout_s=30) for key in keys]
    Effect.objects.filter(pk__in=[e.pk for e in effects]).update(
        deadline=timezone.now() - timedelta(minutes=1)
    )
    return effects


def sweep_command() -> str:
    out = io.StringIO()
    call_command("sweep", stdout=out)
    return out.getvalue()


def test_the_command_times_out_overdue_effects_and_prints_what_it_moved(project):
    late = overdue(project, "late-1", "late-2")
    effect_in(project, State.PENDING, key="on-time", timeout_s=3600)
    printed = sweep_command()
    lines = printed.splitlines()
    assert sorted(lines[:2]) == sorted(f"timed out: {e.key} (effect {e.pk})" for e in late)
    assert lines[2:] == ["Swept: 2 effect(s) timed out."]
    states = dict(Effect.objects.values_list("key", "state"))
    assert states == {"late-1": "timed_out", "late-2": "timed_out", "on-time": "pending"}
    cases = Case.objects.filter(reason="uncertain", closed=None)
    assert sorted(c.effect.key for c in cases.select_related("effect")) == ["late-1", "late-2"]
    assert all(c.detail["cause"] == "deadline" for c in cases)


def test_sweeping_again_changes_nothing(project):
    overdue(project, "late")
    sweep_command()
    counts = row_counts()
    assert sweep_command() == "Swept: 0 effect(s) timed out.\n"
    assert row_counts() == counts


def test_an_effect_settled_before_the_sweep_is_left_alone(api, project):
    overdue(project, "late")
    api.receipt("late", "re_1")
    assert sweep_command() == "Swept: 0 effect(s) timed out.\n"
    assert Effect.objects.get().state == "succeeded"


def test_the_rq_job_sweeps_through_a_real_redis_queue_and_a_duplicate_is_harmless(project):
    overdue(project, "late")
    # Enqueued at once: the test's transaction never commits.
    queue = django_rq.get_queue("default", commit_mode="auto")
    queue.empty()
    first, duplicate = queue.enqueue(ledger_jobs.sweep), queue.enqueue(ledger_jobs.sweep)
    assert SimpleWorker([queue], connection=queue.connection).work(burst=True)
    assert (first.latest_result().return_value, duplicate.latest_result().return_value) == (1, 0)
    assert Effect.objects.get().state == "timed_out"
    assert Case.objects.filter(reason="uncertain").count() == 1
    assert queue.count == 0


@pytest.mark.django_db(transaction=True)
def test_a_sweep_skips_an_effect_a_writer_holds_and_the_next_one_moves_it():
    project = Project.objects.create(name="alpha")
    (effect,) = overdue(project, "late")
    locked, release = threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with transaction.atomic():
                Effect.objects.select_for_update().get(pk=effect.pk)
                locked.set()
                release.wait(timeout=120)  # set as soon as the sweep has run
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert locked.wait(timeout=30)
        assert evidence.deadlines_sweep() == []
    finally:
        release.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert [e.pk for e in evidence.deadlines_sweep()] == [effect.pk]
