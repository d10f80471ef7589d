"""The schedule of durability.cron, kept running while Redis comes and goes."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand
from django_rq.cron import DjangoCronScheduler
from redis.exceptions import RedisError

from durability.management.reconnect import keep_running


class Scheduler(DjangoCronScheduler):
    """rq's cron scheduler that remembers it was asked to stop."""

    stopping = False

    def _request_stop(self, signum: int, frame: object) -> None:
        self.stopping = True
        super()._request_stop(signum, frame)  # type: ignore[no-untyped-call]


class Command(BaseCommand):
    help = (
        "Enqueue the scheduled jobs of durability.cron (deadline sweep, probe scan, alerts, "
        "link repair) until stopped; when Redis goes away, wait for it and carry on."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = Scheduler(logging_level=logging.INFO)
        scheduler.load_config_from_file("durability.cron")

        def start() -> bool:
            # Returns on a signal; a lost Redis raises out of it (rq's own rqcron then exits),
            # and so may its goodbye to a Redis that is away after a signal.
            try:
                scheduler.start()  # type: ignore[no-untyped-call]
            except RedisError:
                if not scheduler.stopping:
                    raise
            return True

        keep_running("the scheduler", start)
