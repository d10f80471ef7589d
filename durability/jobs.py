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
