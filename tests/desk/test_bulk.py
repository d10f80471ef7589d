"""Bulk actions on the queue: a preview of what they touch, then assign, resolve as not
happened or acknowledge, inline when small and as a job with progress when large."""

from __future__ import annotations

import re

import django_rq
import pytest
from django.utils import timezone
from rq import SimpleWorker

from durability.desk import case_actions
from durability.desk import jobs as desk_jobs
from durability.models import AuditEntry, BulkAction, BulkVerb, Case, Effect, Reason, State
from tests.desk.support import (
    late_success_case,
    logged_in,
    uncertain_case,
)


@pytest.fixture
def desk(alice):
    return logged_in(alice)


@pytest.fixture
def three(project):
    """Two uncertain cases and a late success."""
    return [
        uncertain_case(project, "u1"),
        uncertain_case(project, "u2"),
        late_success_case(project, "l1"),
    ]


def test_the_preview_counts_what_the_action_would_touch_and_changes_nothing(desk, three):
    r = desk.get("/queue/bulk/preview/", {"verb": "not_happened", "scope": "matching", "note": "x"})
    text = re.sub(r"\s+", " ", r.content.decode())
    assert (
        "This will <strong>resolve as did not happen</strong> "
        "<strong data-eligible>2</strong> cases" in text
    )
    assert "1 of the 3 named is not eligible and will be left alone" in text
    assert Case.objects.filter(closed=None).count() == 3
    r = desk.get("/queue/bulk/preview/", {"verb": "assign", "scope": "selected", "assign_to": "me"})
    assert "Select at least one case" in r.content.decode()


def test_a_filter_narrows_everything_matching(desk, three):
    r = desk.get(
        "/queue/bulk/preview/",
        {"verb": "acknowledge", "scope": "matching", "note": "x", "reason": "uncertain"},
    )
    assert "<strong data-eligible>0</strong>" in r.content.decode()


def test_bulk_assign_on_a_selection(desk, three, admin):
    chosen = [three[0].pk, three[2].pk]
    r = desk.post(
        "/queue/bulk/", {"verb": "assign", "scope": "selected", "case": chosen, "assign_to": "ada"}
    )
    assert r.status_code == 200 and "Done: assign on 2 cases" in r.content.decode()
    assigned = set(Case.objects.filter(assignee=admin).values_list("pk", flat=True))
    assert assigned == set(chosen)
    assert AuditEntry.objects.filter(action="case_assigned", actor="user:alice").count() == 2
    started = AuditEntry.objects.get(action="bulk_started")
    assert started.data["total"] == 2 and started.actor == "user:alice"


def test_bulk_not_happened_on_everything_matching_leaves_the_ineligible_alone(desk, api, three):
    r = desk.post(
        "/queue/bulk/", {"verb": "not_happened", "scope": "matching", "note": "provider outage"}
    )
    assert "Done: resolve as did not happen on 2 cases" in r.content.decode()
    assert set(Effect.objects.values_list("key", "state")) == {
        ("u1", State.NOT_HAPPENED),
        ("u2", State.NOT_HAPPENED),
        ("l1", State.SUCCEEDED),
    }
    assert Case.objects.get(pk=three[2].pk).closed is None
    assert api.intent("u1").json()["decision"] == "proceed"


def test_bulk_acknowledge_only_closes_what_may_be_acknowledged(desk, three):
    ids = [c.pk for c in three]
    desk.post(
        "/queue/bulk/", {"verb": "acknowledge", "scope": "selected", "case": ids, "note": "ok"}
    )
    assert list(Case.objects.filter(closed=None).values_list("reason", flat=True)) == [
        Reason.UNCERTAIN,
        Reason.UNCERTAIN,
    ]


def test_a_bulk_action_needs_its_reason_and_only_touches_this_project(desk, other_api, three):
    r = desk.post("/queue/bulk/", {"verb": "not_happened", "scope": "matching"})
    assert r.status_code == 400 and "Give the reason" in r.content.decode()
    other_api.intent("theirs")
    other_api.timeout("theirs")
    theirs = Case.objects.get(effect__key="theirs")
    desk.post(
        "/queue/bulk/",
        {"verb": "not_happened", "scope": "selected", "case": [theirs.pk], "note": "x"},
    )
    assert Case.objects.get(pk=theirs.pk).closed is None


def test_a_large_bulk_action_runs_as_a_job_and_shows_its_progress(
    desk, three, settings, django_capture_on_commit_callbacks
):
    settings.TALLYBOOK_BULK_INLINE = 1
    queue = django_rq.get_queue("default")
    queue.empty()
    with django_capture_on_commit_callbacks(execute=True):
        r = desk.post("/queue/bulk/", {"verb": "not_happened", "scope": "matching", "note": "x"})
    bulk = BulkAction.objects.get()
    html = r.content.decode()
    assert f'hx-get="/queue/bulk/{bulk.pk}/"' in html and 'hx-trigger="every 1s"' in html
    assert '<progress max="2" value="0">' in html
    assert Case.objects.filter(reason=Reason.UNCERTAIN, closed=None).count() == 2
    SimpleWorker([queue], connection=queue.connection).work(burst=True)
    progress = desk.get(f"/queue/bulk/{bulk.pk}/").content.decode()
    assert '<progress max="2" value="2">' in progress and "hx-trigger" not in progress
    assert Case.objects.filter(reason=Reason.UNCERTAIN, closed=None).count() == 0


def test_a_large_bulk_action_whose_job_was_lost_is_finished_by_the_scheduled_pass(
    desk, three, settings, django_capture_on_commit_callbacks
):
    settings.TALLYBOOK_BULK_INLINE = 1
    queue = django_rq.get_queue("default")
    with django_capture_on_commit_callbacks(execute=True):
        desk.post("/queue/bulk/", {"verb": "not_happened", "scope": "matching", "note": "x"})
    queue.connection.flushdb()  # Redis is lost, and the bulk job with it
    bulk = BulkAction.objects.get()
    assert desk_jobs.bulks_resume() == 0, "a fresh action may still be at work"

    # As if the clock had moved on.
    BulkAction.objects.filter(pk=bulk.pk).update(created=timezone.now() - case_actions.BULK_STALLED)
    assert desk_jobs.bulks_resume() == 1

    bulk.refresh_from_db()
    assert (bulk.done, bulk.finished is not None) == (2, True)
    assert Case.objects.filter(reason=Reason.UNCERTAIN, closed=None).count() == 0
    assert desk_jobs.bulks_resume() == 0


def test_a_bulk_run_resumes_and_never_acts_twice(project, three):
    ids = [c.pk for c in three[:2]]
    bulk = case_actions.bulk_start(
        project=project, actor="user:alice", verb=BulkVerb.NOT_HAPPENED, case_ids=ids, note="x"
    )
    # One case is settled by someone else before the job reaches it.
    first = three[0]
    case_actions.case_resolve(
        project=project,
        case_id=first.pk,
        version=first.version,
        actor="user:ada",
        verdict=case_actions.Verdict.ABANDONED,
        note="gave up",
    )
    done = case_actions.bulk_run(bulk_id=bulk.pk)
    assert (done.done, done.skipped, done.finished is not None) == (1, 1, True)
    again = case_actions.bulk_run(bulk_id=bulk.pk)
    assert (again.done, again.skipped) == (1, 1)
    assert AuditEntry.objects.filter(action="attest_not_happened").count() == 1


def test_someone_elses_bulk_progress_is_not_shown_to_strangers(project, three, mallory):
    bulk = case_actions.bulk_start(
        project=project, actor="user:alice", verb=BulkVerb.ASSIGN, case_ids=[], note=""
    )
    assert logged_in(mallory).get(f"/queue/bulk/{bulk.pk}/").status_code == 404


def test_reloading_the_queue_after_a_bulk_action_keeps_its_filter(
    desk, three, settings, django_capture_on_commit_callbacks
):
    filtered = {"reason": "uncertain", "target": "stripe"}
    r = desk.post(
        "/queue/bulk/", {"verb": "assign", "scope": "matching", "assign_to": "me"} | filtered
    )
    assert (
        '<a href="/queue/?reason=uncertain&amp;target=stripe">Reload the queue</a>'
        in r.content.decode()
    )
    # A large one, watched by its progress until it is done.
    settings.TALLYBOOK_BULK_INLINE = 1
    queue = django_rq.get_queue("default")
    queue.empty()
    with django_capture_on_commit_callbacks(execute=True):
        r = desk.post(
            "/queue/bulk/", {"verb": "not_happened", "scope": "matching", "note": "x"} | filtered
        )
    bulk = BulkAction.objects.filter(verb=BulkVerb.NOT_HAPPENED).get()
    progress_url = f"/queue/bulk/{bulk.pk}/?reason=uncertain&amp;target=stripe"
    assert f'hx-get="{progress_url}"' in r.content.decode()
    SimpleWorker([queue], connection=queue.connection).work(burst=True)
    done = desk.get(progress_url.replace("&amp;", "&")).content.decode()
    assert '<a href="/queue/?reason=uncertain&amp;target=stripe">Reload the queue</a>' in done
