"""Alerts: an open case older than its reason's threshold is posted once to a webhook."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from durability.accounts.timezones import utc_iso
from durability.models import Case, CaseAlert, Reason, Severity

# Reasons the settings do not name (added after them) alert after an hour.
DEFAULT_AFTER_S = 60 * 60
POST_TIMEOUT_S = 10


def alert_text(case: Case) -> str:
    """One line a person reads in a chat channel, with a link to the case. Its time is UTC
    in ISO 8601: the channel's readers are in any zone, and its bots parse it."""
    what = (
        f"{case.effect.key} ({case.effect.kind} on {case.effect.target})"
        if case.effect
        else "no effect"
    )
    url = settings.SITE_URL + case.get_absolute_url()
    return (
        f"[Tallybook · {case.project.name}] {case.get_severity_display()} {case.reason} case "
        f"open since {utc_iso(case.opened, timespec='seconds')}: {what}. {case.summary} {url}"
    )


def _post(url: str, text: str) -> None:
    """POST Slack-compatible JSON; raises OSError for a refusal or a non-2xx answer."""
    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
        response.read()


def overdue(now: datetime) -> QuerySet[Case]:
    """Open cases past their reason's threshold: what the desk calls overdue.

    Low-severity cases (version drift, an effect proceeding without a grant under the
    `audit` policy) wait in the queue and page nobody; a case raised above low (say, a
    receipt for that ungranted effect) is overdue like any other.
    """
    past = Q()
    for reason in Reason.values:
        after = settings.TALLYBOOK_ALERT_AFTER.get(reason, DEFAULT_AFTER_S)
        past |= Q(reason=reason, opened__lte=now - timedelta(seconds=after))
    return Case.objects.filter(past, closed=None, severity__gt=Severity.LOW)


def cases_due(*, now: datetime, limit: int) -> list[tuple[int, int]]:
    """Ids of overdue cases that no alert has been sent for, with their projects'."""
    return list(
        overdue(now)
        .exclude(alert__sent__isnull=False)
        .order_by("opened", "id")
        .values_list("pk", "project_id")[:limit]
    )


def alerts_send(*, now: datetime | None = None, limit: int = 100) -> list[CaseAlert]:
    """Post each overdue open case to TALLYBOOK_ALERT_WEBHOOK_URL once; returns those sent.

    A case is claimed by its CaseAlert row, locked (skipping rows another run holds)
    while posting, so concurrent runs never post a case twice. A failed post keeps its
    error and is tried again by the next run; this run stops there, as the webhook is
    likely down. Only a crash between the post and the commit can post a case again.
    """
    url = settings.TALLYBOOK_ALERT_WEBHOOK_URL
    if not url:
        return []
    now = now or timezone.now()
    sent = []
    for case_id, project_id in cases_due(now=now, limit=limit):
        CaseAlert.objects.get_or_create(case_id=case_id, defaults={"project_id": project_id})
        with transaction.atomic():
            alert = (
                CaseAlert.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("case__project", "case__effect")
                .filter(project_id=project_id, case_id=case_id, sent=None, case__closed=None)
                .first()
            )
            if alert is None:
                continue
            alert.tries += 1
            try:
                _post(url, alert_text(alert.case))
            except (OSError, ValueError) as exc:
                alert.error = str(exc)[:1000]
                alert.save(update_fields=["tries", "error"])
                break
            alert.sent, alert.error = timezone.now(), ""
            alert.save(update_fields=["tries", "error", "sent"])
            sent.append(alert)
    return sent
