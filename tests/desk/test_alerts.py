"""Alerts: an open case past its reason's threshold posts once to the webhook."""

from __future__ import annotations

from datetime import UTC, timedelta

import django_rq
import pytest
from django.utils import timezone
from rq import SimpleWorker

from durability import jobs
from durability.desk import jobs as desk_jobs
from durability.desk.alerts import alerts_send
from durability.models import Case, CaseAlert, Effect
from tests.ledger.support import cases_asked
from tests.local_http import LocalHttp, Reply

HOUR = timedelta(hours=1)


@pytest.fixture
def webhook(settings):
    with LocalHttp() as server:
        server.reply("/hook", Reply(200, b"ok"))
        settings.TALLYBOOK_ALERT_WEBHOOK_URL = server.url + "/hook"
        settings.TALLYBOOK_ALERT_AFTER = {"uncertain": 3600, "duplicate_effect": 60}
        yield server


def uncertain(api, key="refund:1") -> Case:
    api.intent(key)
    api.timeout(key)
    return Case.objects.get(effect__key=key, reason="uncertain")


def test_an_overdue_case_posts_once_to_the_webhook(api, webhook, settings):
    case = uncertain(api)
    now = timezone.now() + 2 * HOUR

    sent = alerts_send(now=now)

    assert [a.case for a in sent] == [case]
    (post,) = webhook.seen
    assert post.method == "POST" and post.headers["Content-Type"] == "application/json"
    text = post.json()["text"]
    assert set(post.json()) == {"text"}
    assert "alpha" in text and "uncertain" in text and "refund:1" in text
    opened = case.opened.astimezone(UTC).replace(microsecond=0).isoformat()
    assert f"case open since {opened.replace('+00:00', 'Z')}: refund:1 " in text
    assert settings.SITE_URL + f"/cases/{case.pk}/" in text
    assert alerts_send(now=now + HOUR) == []
    assert len(webhook.seen) == 1
    alert = CaseAlert.objects.get(case=case)
    assert alert.sent is not None and alert.tries == 1


def test_each_reason_has_its_own_threshold(api, webhook):
    first = uncertain(api)
    api.intent("refund:2")
    api.receipt("refund:2", "re_a")
    api.receipt("refund:2", "re_b")  # a duplicate effect
    soon = first.opened + timedelta(minutes=10)
    assert [a.case.reason for a in alerts_send(now=soon)] == ["duplicate_effect"]
    assert [a.case.reason for a in alerts_send(now=soon + HOUR)] == ["uncertain"]


def test_a_reason_the_settings_do_not_name_alerts_after_an_hour(api, webhook):
    api.intent("refund:1")
    api.intent("refund:1", request={"amount": 2})  # key reuse conflict
    opened = Case.objects.get(reason="key_reuse_conflict").opened
    assert alerts_send(now=opened + timedelta(minutes=59)) == []
    assert len(alerts_send(now=opened + 2 * HOUR)) == 1


def test_a_young_or_closed_case_is_not_posted(api, webhook):
    first = uncertain(api, "refund:1")
    closed = uncertain(api, "refund:2")
    api.receipt("refund:2", "re_late")  # closes the uncertain case, opens a late success
    assert alerts_send(now=first.opened + timedelta(minutes=30)) == []
    sent = alerts_send(now=first.opened + 2 * HOUR)
    assert first.pk in [a.case_id for a in sent]
    assert closed.pk not in [a.case_id for a in sent]
    assert [a.case.reason for a in sent] == ["uncertain", "late_success"]


def test_a_failed_post_is_tried_again_by_the_next_run(api, webhook):
    case = uncertain(api)
    uncertain(api, "refund:2")
    webhook.reply("/hook", Reply(500, b"down"), Reply(200, b"ok"))
    now = timezone.now() + 2 * HOUR
    assert alerts_send(now=now) == []
    assert len(webhook.seen) == 1  # the webhook is down: the run stops there
    failed = CaseAlert.objects.get(case=case)
    assert failed.sent is None and failed.tries == 1 and "500" in failed.error
    assert len(alerts_send(now=now)) == 2
    assert CaseAlert.objects.get(case=case).tries == 2
    assert alerts_send(now=now) == []


def test_without_a_webhook_nothing_is_posted_or_recorded(api, settings):
    settings.TALLYBOOK_ALERT_WEBHOOK_URL = ""
    uncertain(api)
    assert alerts_send(now=timezone.now() + 2 * HOUR) == []
    assert not CaseAlert.objects.exists()


def test_the_alert_job_runs_on_a_worker(api, webhook, settings, django_capture_on_commit_callbacks):
    settings.TALLYBOOK_ALERT_AFTER = {"uncertain": 0}
    uncertain(api)
    queue = django_rq.get_queue("default")
    queue.connection.flushdb()
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            jobs.enqueue(desk_jobs.alert)
        SimpleWorker([queue], connection=queue.connection).work(burst=True)
    assert len(webhook.seen) == 1
    assert Effect.objects.get().state == "timed_out"
    queue.connection.flushdb()


def test_low_severity_cases_wait_in_the_queue_and_page_nobody(api, project, webhook, settings):
    settings.TALLYBOOK_ALERT_AFTER = {"unauthorized_effect": 60}
    cases_asked(project)
    api.intent("refund:ungranted", authority=None)  # proceeds under audit_cases, flagged low
    case = Case.objects.get(effect__key="refund:ungranted", reason="unauthorized_effect")
    later = timezone.now() + 2 * HOUR

    assert alerts_send(now=later) == []
    assert webhook.seen == []

    api.receipt("refund:ungranted", "re_1")  # evidence without authority: raised to high
    assert [a.case for a in alerts_send(now=later)] == [case]
    assert len(webhook.seen) == 1
