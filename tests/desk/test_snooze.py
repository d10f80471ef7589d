"""Snoozing a case: out of the default queue until a time or until it happens again (a new
case joins its group), then back on its own; the Snoozed view lists them; audited."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.desk import case_actions
from durability.desk.queue import QueueQuery, open_cases
from durability.models import AuditAction, AuditEntry, Case
from tests.desk.support import logged_in, uncertain_case


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _shown(response) -> set[int]:
    return {int(pk) for pk in re.findall(r'<tr id="case-(\d+)"', response.content.decode())}


def test_a_case_snoozed_for_an_hour_leaves_the_queue_and_comes_back_after_it(desk, project, alice):
    case = uncertain_case(project, "refund-1")
    other = uncertain_case(project, "refund-2")

    r = desk.post(f"/cases/{case.pk}/snooze/", {"version": case.version, "snooze": "1h"})

    assert r.status_code == 302
    queue = desk.get("/queue/")
    assert _shown(queue) == {other.pk}
    assert "1 open case" in queue.content.decode()
    assert re.search(r"Snoozed <span class=\"snoozed-count\">1</span>", queue.content.decode())
    snoozed = desk.get("/queue/?snoozed=1")
    assert _shown(snoozed) == {case.pk}
    assert re.search(r"data-snooze>snoozed until <time", snoozed.content.decode())
    entry = AuditEntry.objects.get(action=AuditAction.CASE_SNOOZED)
    assert (entry.case_id, entry.actor) == (case.pk, "user:alice")
    # An hour later it is back, with nothing run in between: read from the time.
    assert case.pk not in set(
        open_cases(project, QueueQuery.from_params({}), alice).values_list("pk", flat=True)
    )
    Case.objects.filter(pk=case.pk).update(snoozed_until=timezone.now() - timedelta(seconds=1))
    assert _shown(desk.get("/queue/")) == {case.pk, other.pk}
    assert _shown(desk.get("/queue/?snoozed=1")) == set()


def test_a_case_snoozed_until_it_happens_again_comes_back_when_a_new_case_joins_its_group(
    desk, project
):
    case = uncertain_case(project, "refund-1")
    desk.post(f"/cases/{case.pk}/snooze/", {"version": case.version, "snooze": "recurs"})
    assert _shown(desk.get("/queue/")) == set()
    page = desk.get(f"/cases/{case.pk}/").content.decode()
    assert "until it happens again" in page

    again = uncertain_case(project, "refund-2")

    assert again.group_key == case.group_key
    assert _shown(desk.get("/queue/")) == {case.pk, again.pk}
    assert "data-snoozed>" not in desk.get(f"/cases/{case.pk}/").content.decode()


def test_a_case_of_another_group_does_not_wake_it(desk, project):
    case = uncertain_case(project, "refund-1")
    desk.post(f"/cases/{case.pk}/snooze/", {"version": case.version, "snooze": "recurs"})

    other = uncertain_case(project, "deploy-1", kind="deploy", target="k8s")

    assert other.group_key != case.group_key
    assert _shown(desk.get("/queue/")) == {other.pk}


def test_a_snoozed_case_can_be_brought_back_now(desk, project):
    case = uncertain_case(project, "refund-1")
    desk.post(f"/cases/{case.pk}/snooze/", {"version": case.version, "snooze": "7d"})
    case.refresh_from_db()

    r = desk.post(f"/cases/{case.pk}/snooze/", {"version": case.version, "unsnooze": "1"})

    assert r.status_code == 302
    assert _shown(desk.get("/queue/")) == {case.pk}
    assert AuditEntry.objects.filter(action=AuditAction.CASE_UNSNOOZED, case=case).exists()


def test_a_snooze_until_a_past_time_or_of_a_stale_page_is_refused(desk, project):
    case = uncertain_case(project, "refund-1")
    past = (timezone.localtime() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    r = desk.post(
        f"/cases/{case.pk}/snooze/",
        {"version": case.version, "snooze": "until", "until": past},
        follow=True,
    )

    assert "A snooze ends in the future" in r.content.decode()
    r = desk.post(
        f"/cases/{case.pk}/snooze/", {"version": case.version + 5, "snooze": "1h"}, follow=True
    )
    assert "changed while you were looking at it" in r.content.decode()
    assert _shown(desk.get("/queue/")) == {case.pk}


def test_a_viewer_cannot_snooze(project, viewer):
    case = uncertain_case(project, "refund-1")

    r = logged_in(viewer).post(f"/cases/{case.pk}/snooze/", {"version": 1, "snooze": "1h"})

    assert r.status_code == 403
    assert Case.objects.get(pk=case.pk).snoozed_at is None


def test_the_queue_reads_as_many_statements_with_snoozed_cases_as_without(desk, project):
    for n in range(3):
        uncertain_case(project, f"refund-{n}")
    with CaptureQueriesContext(connection) as before:
        desk.get("/queue/")
    for case in Case.objects.all():
        case_actions.case_snooze(
            project=project, case_id=case.pk, version=case.version, actor="user:x", until=None
        )
    uncertain_case(project, "deploy-1", kind="deploy", target="k8s")

    with CaptureQueriesContext(connection) as after:
        desk.get("/queue/")

    assert len(after) == len(before)


def test_the_snoozed_view_walks_its_index_and_the_queue_its_own(project, alice):
    from durability.desk import queue
    from durability.models import Effect, Reason, Severity
    from tests import plans

    effects = Effect.objects.bulk_create(
        Effect(project=project, key=f"e-{n}", kind="payment", target="stripe") for n in range(3000)
    )
    now = timezone.now()
    Case.objects.bulk_create(
        Case(
            project=project,
            effect=e,
            reason=Reason.UNCERTAIN,
            severity=Severity.HIGH,
            summary="timed out",
            group_key=f"{n % 7:032x}",
            snoozed_at=now if n % 100 == 0 else None,
            snoozed_until=now + timedelta(hours=1) if n % 100 == 0 else None,
        )
        for n, e in enumerate(effects)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durability_case")

    def scanned(params: dict[str, str]) -> set[str]:
        q = QueueQuery.from_params(params)
        with CaptureQueriesContext(connection) as captured:
            rows, _ = queue.page_of(queue.open_cases(project, q, alice), q)
        assert rows
        sql = captured.captured_queries[0]["sql"]
        return {
            read
            for scan in plans.scans(plans.explain(sql), "durability_case")
            for read in plans.index_names(scan) or [scan["Node Type"]]
        }

    assert "case_snoozed_idx" in scanned({"snoozed": "1"})
    assert "case_queue_open_idx" in scanned({})


def test_the_overview_counts_the_cases_the_queue_shows_and_the_snoozed_ones_beside_them(
    desk, project
):
    sleeper = uncertain_case(project, "refund-1")
    awake = uncertain_case(project, "refund-2")
    Case.objects.filter(pk=sleeper.pk).update(opened=timezone.now() - timedelta(hours=3))
    desk.post(f"/cases/{sleeper.pk}/snooze/", {"version": sleeper.version, "snooze": "1h"})

    overview = desk.get("/")

    # The tile, the table and the oldest case: what the queue they link to shows.
    assert overview.context["open_total"].n == 1 == len(_shown(desk.get("/queue/")))
    assert overview.context["oldest"].pk == awake.pk
    snoozed = overview.context["snoozed_total"]
    assert snoozed.n == 1 and _shown(desk.get(snoozed.url)) == {sleeper.pk}
    assert f'<a href="{snoozed.url}">1</a> snoozed' in overview.content.decode()
    # The backlog's line starts from every open case, snoozed or not.
    assert overview.context["backlog"].bars[-1].still_open == 2
