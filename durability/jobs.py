"""Background jobs: thin wrappers that take ids and call services.

`enqueue` runs them on an RQ worker once the current transaction commits or, with no
REDIS_URL configured, inline at that same moment. Every job may be lost or run twice:
PostgreSQL holds the truth, and the next scheduled run puts right what a lost one missed.
That is also why Redis is never on the synchronous write path: a job that cannot be
enqueued is logged and left to that run, and the write that asked for it answers as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import django_rq
from django.conf import settings
from django.db import transaction
from redis.exceptions import RedisError
from rq import Retry

logger = logging.getLogger(__name__)


def enqueue(func: Callable[..., object], *args: Any, retry: Retry | None = None) -> None:
    """Run `func(*args)` after the current transaction commits (at once outside one)."""

    def run() -> None:
        if settings.REDIS_URL:
            try:
                # Already after the commit: django-rq need not wait for one again.
                queue = django_rq.get_queue("default", commit_mode="auto")
                queue.enqueue(func, *args, retry=retry)
            except RedisError as error:
                # Fail open: the write is committed, so its 2xx is the truth; raising here would
                # answer 500 and the agent would take a recorded intent for a lost one. One line
                # per job, no traceback: while Redis is away there is one for every write.
                logger.warning(
                    "job %s%r not enqueued (%s); the next scheduled pass does it",
                    func.__qualname__,
                    args,
                    error,
                )
            return
        try:
            func(*args)
        except Exception:
            # As a worker would: the failure is logged, the caller carries on.
            logger.exception("inline job %s%r failed", func.__qualname__, args)

    transaction.on_commit(run)
