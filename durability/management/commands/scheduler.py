"""The schedule of durability.cron, kept running while Redis comes and goes."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
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

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--pace", type=float, default=1.0, help="multiplies the schedule's intervals"
        )

    def handle(self, *args: Any, pace: float, **options: Any) -> None:
        scheduler = Scheduler(logging_level=logging.INFO)
        scheduler.load_config_from_file("durability.cron")
        if pace != 1.0:
            paced(scheduler, pace)

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


def paced(scheduler: Scheduler, pace: float) -> None:
    """Scale every interval of the schedule, as `demoagents --pace` scales its own copy of it:
    the tests sweep every second rather than wait out the five seconds of durability.cron."""
    for job in scheduler.get_jobs():
        if job.interval is not None:
            # rq counts intervals in whole seconds.
            job.interval = max(1, round(job.interval * pace))
    scheduler.log.info("The schedule's intervals at pace %s", pace)
