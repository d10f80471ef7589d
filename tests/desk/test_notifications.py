"""Email about cases: the assignee on assignment and when their case goes overdue, a member
a comment mentions; each sent by a job after the commit, as each member chose."""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime, timedelta

import django_rq
import pytest
from django.core import mail
from django.utils import timezone
from rq import SimpleWorker

from durability import notices
from durability.desk import case_actions
from durability.desk import jobs as desk_jobs
from durability.desk.notifications import mentions, overdue_announce
from durability.models import (
    BulkVerb,
    Case,
    Membership,
    Notice,
    NoticeKind,
    Preference,
    Project,
    Role,
)
from tests.desk.support import logged_in, member, uncertain_case

HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def inline(settings):
    """Jobs run in this process, after the commit (no Redis)."""
    settings.REDIS_URL = ""
    settings.TALLYBOOK_ALERT_AFTER = {"uncertain": 3600}


@pytest.fixture
def ada(admin):
    admin.email = "ada@example.com"
    admin.save()
    return admin


@pytest.fixture
def alice_mail(alice):
    alice.email = "alice@example.com"
    alice.save()
    return alice


@pytest.fixture
def case(project):
    return uncertain_case(project, "refund:1")


def _assign(client, case, assignee):
    case.refresh_from_db()
    return client.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": assignee})


def _comment(client, case, body):
    return client.post(f"/cases/{case.pk}/comment/", {"body": body})


def _prefer(user, project, **choices):
    Membership.objects.filter(user=user, project=project).update(**choices)


def test_an_assignment_emails_the_assignee_with_the_case_its_effect_and_link(
    project, ada, alice_mail, case, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        r = _assign(logged_in(ada), case, "alice")
        # Written in the assignment's transaction, sent only once it committed.
        assert r.status_code == 302 and mail.outbox == []
    assert len(callbacks) == 1
    (email,) = mail.outbox
    assert email.to == ["alice@example.com"]
    assert email.subject == (
        f"[Tallybook · alpha] ada assigned you case #{case.pk}: uncertain · refund:1"
    )
    body = email.body
    assert f"ada assigned you case #{case.pk} in alpha." in body
    opened = case.opened.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    assert f"Case #{case.pk} · uncertain · high severity · open since {opened} UTC" in body
    assert case.summary in body
    assert "Effect: refund:1 — payment on stripe, now timed_out" in body
    assert f"Open the case: {settings.SITE_URL}/cases/{case.pk}/" in body
    assert f"{settings.SITE_URL}/settings/notifications/" in body
    notice = Notice.objects.get()
    assert notice.kind == NoticeKind.ASSIGNED and notice.sent is not None and notice.tries == 1


def test_taking_a_case_oneself_sends_nothing(
    project, alice_mail, case, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = _assign(logged_in(alice_mail), case, "me")
    assert r.status_code == 302
    case.refresh_from_db()
    assert case.assignee == alice_mail
    assert mail.outbox == [] and not Notice.objects.exists()


def test_an_assignee_who_turned_assignments_off_gets_no_email(
    project, ada, alice_mail, case, django_capture_on_commit_callbacks
):
    _prefer(alice_mail, project, notify_assigned=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert _assign(logged_in(ada), case, "alice").status_code == 302
    assert mail.outbox == [] and not Notice.objects.exists()


def _bulk_assign(project, cases, assignee, actor="user:ada"):
    bulk = case_actions.bulk_start(
        project=project,
        actor=actor,
        verb=BulkVerb.ASSIGN,
        case_ids=[c.pk for c in cases],
        note="the Stripe outage",
        assignee=assignee,
    )
    case_actions.bulk_run(bulk_id=bulk.pk)
    case_actions.bulk_run(bulk_id=bulk.pk)  # a job delivered twice
    return bulk


def test_a_bulk_assignment_sends_one_email_listing_its_cases(
    project, ada, alice_mail, settings, django_capture_on_commit_callbacks
):
    first, second = uncertain_case(project, "k1"), uncertain_case(project, "k2")
    with django_capture_on_commit_callbacks(execute=True):
        _bulk_assign(project, [first, second], alice_mail)
    (email,) = mail.outbox
    assert email.subject == "[Tallybook · alpha] ada assigned you 2 cases"
    assert "ada assigned you 2 cases in alpha at once: the Stripe outage" in email.body
    for case in (first, second):
        assert f"- #{case.pk} uncertain · high · {case.effect.key}" in email.body
        assert f"{settings.SITE_URL}/cases/{case.pk}/" in email.body
    assert f"{settings.SITE_URL}/queue/?assignee=me" in email.body


def test_a_bulk_assignment_to_oneself_or_to_one_who_opted_out_sends_nothing(
    project, ada, alice_mail, django_capture_on_commit_callbacks
):
    first, second = uncertain_case(project, "k1"), uncertain_case(project, "k2")
    _prefer(alice_mail, project, notify_assigned=False)
    with django_capture_on_commit_callbacks(execute=True):
        _bulk_assign(project, [first], alice_mail)
        _bulk_assign(project, [second], ada)
    assert mail.outbox == [] and not Notice.objects.exists()


def test_a_mention_emails_the_member_named_with_the_comment(
    project, ada, alice_mail, case, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = _comment(logged_in(ada), case, "@alice can you check the refund on Stripe?")
    assert r.status_code == 302
    (email,) = mail.outbox
    assert email.to == ["alice@example.com"]
    assert email.subject.startswith(f"[Tallybook · alpha] ada mentioned you on case #{case.pk}")
    assert "@alice can you check the refund on Stripe?" in email.body
    assert f"/cases/{case.pk}/" in email.body


def test_a_mention_of_someone_outside_the_project_or_of_oneself_sends_nothing(
    project, ada, alice_mail, case, outsider, django_capture_on_commit_callbacks
):
    outsider.email = "olga@example.com"
    outsider.save()
    with django_capture_on_commit_callbacks(execute=True):
        _comment(logged_in(ada), case, "cc @olga and @ada, and @nobody")
    assert mail.outbox == [] and not Notice.objects.exists()


def test_a_viewer_mentioned_is_told_but_one_who_turned_mentions_off_is_not(
    project, ada, case, django_capture_on_commit_callbacks
):
    victor = member(project, "victor", Role.VIEWER)
    vera = member(project, "vera", Role.VIEWER)
    for user in (victor, vera):
        user.email = f"{user.username}@example.com"
        user.save()
    _prefer(vera, project, notify_mentioned=False)
    with django_capture_on_commit_callbacks(execute=True):
        _comment(logged_in(ada), case, "@victor, @vera: FYI.")
    assert [e.to for e in mail.outbox] == [["victor@example.com"]]


def test_mentions_are_usernames_after_an_at_sign_not_email_addresses():
    assert mentions("@alice, ask @bob.smith. Mail ops@example.com (@carol)") == {
        "alice",
        "bob.smith",
        "carol",
    }


def test_an_overdue_case_emails_its_assignee_once_however_often_the_scan_runs(
    project, ada, alice_mail, case, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        _assign(logged_in(ada), case, "alice")
    mail.outbox.clear()
    assert desk_jobs.overdue_notify() == 0  # not overdue yet
    case.refresh_from_db()
    later = case.opened + 2 * HOUR
    assert overdue_announce(now=later) == 1
    assert overdue_announce(now=later) == 0
    assert overdue_announce(now=later + HOUR) == 0
    (email,) = mail.outbox
    assert email.to == ["alice@example.com"]
    assert email.subject.startswith(f"[Tallybook · alpha] Case #{case.pk} is overdue: uncertain")
    opened = case.opened.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    assert email.subject.endswith(f", open since {opened} UTC · refund:1")
    assert f"is overdue: it has been open since {opened} UTC and still needs you." in email.body
    assert Notice.objects.filter(kind=NoticeKind.OVERDUE).count() == 1


def test_an_email_states_its_times_in_the_recipients_zone_as_the_pages_do(
    project, ada, alice_mail, case, django_capture_on_commit_callbacks
):
    """Not "5 minutes ago": an email is read later, and anywhere."""
    Case.objects.filter(pk=case.pk).update(opened=datetime(2026, 1, 15, 23, 30, 5, tzinfo=UTC))
    Preference.objects.create(user=alice_mail, time_zone="Asia/Tokyo")
    with django_capture_on_commit_callbacks(execute=True):
        _assign(logged_in(ada), case, "alice")
    (email,) = mail.outbox
    # {% when %}'s words, in Tokyo (UTC+9): the next day.
    assert "open since 2026-01-16 08:30 Asia/Tokyo" in email.body
    assert " ago" not in email.body
    mail.outbox.clear()

    overdue_announce(now=timezone.now())
    (email,) = mail.outbox
    assert email.subject.endswith(", open since 2026-01-16 08:30 Asia/Tokyo · refund:1")
    assert "it has been open since 2026-01-16 08:30 Asia/Tokyo and still needs you" in email.body


def test_an_overdue_case_with_no_assignee_or_one_who_opted_out_sends_nothing(
    project, ada, alice_mail, django_capture_on_commit_callbacks
):
    nobodys = uncertain_case(project, "k1")
    opted_out = uncertain_case(project, "k2")
    with django_capture_on_commit_callbacks(execute=True):
        _assign(logged_in(ada), opted_out, "alice")
    mail.outbox.clear()
    _prefer(alice_mail, project, notify_overdue=False)
    assert overdue_announce(now=nobodys.opened + 2 * HOUR) == 0
    assert mail.outbox == []


@pytest.fixture
def worker_queue(settings):
    """The RQ queue on this run's Redis (undoing `inline`), empty."""
    settings.REDIS_URL = os.environ["REDIS_URL"]
    queue = django_rq.get_queue("default")
    queue.connection.flushdb()
    yield queue
    queue.connection.flushdb()


def test_with_workers_the_email_goes_out_when_the_job_runs(
    project, ada, alice_mail, case, worker_queue, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert _assign(logged_in(ada), case, "alice").status_code == 302
    assert worker_queue.count == 1 and mail.outbox == []
    SimpleWorker([worker_queue], connection=worker_queue.connection).work(burst=True)
    assert [e.to for e in mail.outbox] == [["alice@example.com"]]
    assert Notice.objects.get().sent is not None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def smtp_down(settings):
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": _closed_port(), "timeout": 2},
        }
    }


def test_a_mail_server_that_is_down_fails_no_assignment_and_the_email_is_retried(
    project, ada, alice_mail, case, smtp_down, settings, caplog, django_capture_on_commit_callbacks
):
    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        r = _assign(logged_in(ada), case, "alice")
    assert r.status_code == 302
    case.refresh_from_db()
    assert case.assignee == alice_mail
    notice = Notice.objects.get()
    assert notice.sent is None and notice.tries == 1
    assert "ConnectionRefusedError" in notice.error
    assert any("inline job notice_deliver" in record.getMessage() for record in caplog.records)

    # The mail server is back: the scheduled pass sends it, once.
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    soon = timezone.now() + timedelta(minutes=2)
    assert notices.notices_send(notices.notices_unsent(now=soon)) == 1
    assert notices.notices_send(notices.notices_unsent(now=soon)) == 0
    assert [e.to for e in mail.outbox] == [["alice@example.com"]]
    notice.refresh_from_db()
    assert notice.sent is not None and notice.tries == 2 and notice.error == ""


def test_the_scheduled_pass_gives_up_after_its_tries(project, ada, alice_mail, case, settings):
    settings.TALLYBOOK_NOTICE_TRIES = 2
    notice = Notice.objects.create(
        project=project, user=alice_mail, kind=NoticeKind.ASSIGNED, case=case, tries=2
    )
    soon = timezone.now() + timedelta(minutes=2)
    assert notice.pk not in notices.notices_unsent(now=soon)


def test_no_member_hears_about_a_project_being_deleted(
    project, ada, alice_mail, case, django_capture_on_commit_callbacks
):
    """Its members go at the mark; one whose membership was committed just after it (kept
    here) is told of no assignment, bulk assignment, mention or overdue case of it."""
    other = uncertain_case(project, "k2")
    bulk = case_actions.bulk_start(
        project=project,
        actor="user:ada",
        verb=BulkVerb.ASSIGN,
        case_ids=[other.pk],
        note="before the mark",
        assignee=alice_mail,
    )
    with django_capture_on_commit_callbacks(execute=True):
        _assign(logged_in(ada), case, "alice")
    mail.outbox.clear()
    told = Notice.objects.count()
    Project.objects.filter(pk=project.pk).update(deleting=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        case_actions.bulk_run(bulk_id=bulk.pk)
        case_actions.case_assign(
            project=project,
            case_id=case.pk,
            version=case.version + 1,
            actor="user:ada",
            assignee=alice_mail,
        )
        case_actions.case_comment(project=project, case_id=case.pk, actor="user:ada", body="@alice")
        assert overdue_announce(now=case.opened + 2 * HOUR) == 0
    assert Case.objects.filter(project=project, assignee=alice_mail).count() == 2
    assert mail.outbox == [] and Notice.objects.count() == told
