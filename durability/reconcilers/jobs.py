"""Reconciler jobs: probe one timed-out effect (retried with backoff), and the scan that
enqueues the probes due (scheduled in durability.cron)."""

from __future__ import annotations

from django.conf import settings
from rq import Retry

from durability.jobs import enqueue
from durability.models import ProbeAnswer
from durability.reconcilers import reconciling


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
