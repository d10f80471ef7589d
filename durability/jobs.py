"""Background jobs: thin wrappers that take ids and call services.

`enqueue` runs them on an RQ worker once the current transaction commits or, with no
REDIS_URL configured, inline at that same moment. Every job may be lost or run twice:
PostgreSQL holds the truth, and the next scheduled run puts right what a lost one missed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import django_rq
from django.conf import settings
from django.db import transaction
from rq import Retry

from durability import alerts, cases, machine
from durability.models import ProbeAnswer
from durability.reconcilers import services as reconciling

logger = logging.getLogger(__name__)


def enqueue(func: Callable[..., object], *args: Any, retry: Retry | None = None) -> None:
    """Run `func(*args)` after the current transaction commits (at once outside one)."""

    def run() -> None:
        if settings.REDIS_URL:
            # Already after the commit: django-rq need not wait for one again.
            django_rq.get_queue("default", commit_mode="auto").enqueue(func, *args, retry=retry)
            return
        try:
            func(*args)
        except Exception:
            # As a worker would: the failure is logged, the caller carries on.
            logger.exception("inline job %s%r failed", func.__qualname__, args)

    transaction.on_commit(run)


def sweep() -> int:
    """One deadline sweep. Safe to run twice or concurrently: each move re-checks its row."""
    return len(machine.deadlines_sweep())


class ProbeUnknown(Exception):
    """A probe got no trustworthy answer: raised so that RQ retries it with backoff."""


def probe_retry() -> Retry:
    delays = settings.TALLYBOOK_PROBE_RETRY_DELAYS
    return Retry(max=len(delays), interval=delays)


def probe(effect_id: int, requested_by: str = reconciling.SCAN_ACTOR) -> str:
    """Probe one timed-out effect; a no-op once it is settled. Returns the answer."""
    row = reconciling.effect_probe(effect_id=effect_id, requested_by=requested_by)
    if row is None:
        return "nothing to probe"
    if row.answer == ProbeAnswer.UNKNOWN:
        raise ProbeUnknown(row.detail)
    return row.answer


def probe_scan() -> int:
    """Enqueue a probe for each timed-out effect that is due one; returns how many."""
    due = reconciling.probes_due()
    for effect_id in due:
        enqueue(probe, effect_id, retry=probe_retry())
    return len(due)


def alert() -> int:
    """Post the overdue cases to the alert webhook, each once; returns how many were sent."""
    return len(alerts.alerts_send())


def cases_bulk(bulk_id: int) -> int:
    """Carry out a bulk action on cases; a second run resumes where the first stopped."""
    return cases.bulk_run(bulk_id=bulk_id).done
