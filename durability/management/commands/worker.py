"""The background worker: rq's worker, started again whenever Redis goes away."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import django_rq
from django.core.management.base import BaseCommand, CommandParser
from django_rq.utils import reset_db_connections
from redis.exceptions import RedisError
from rq import Worker
from rq.utils import now

from durability.management.reconnect import keep_running


class Command(BaseCommand):
    help = (
        "Run the queued jobs (and their delayed retries) until stopped; when Redis goes away, "
        "wait for it and carry on."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", default=["default"], help="queues to work on")

    def handle(self, *args: Any, queues: list[str], **options: Any) -> None:
        def work() -> bool:
            worker = django_rq.get_worker(*queues)
            # The work horses are forked: none may inherit this process's connections.
            reset_db_connections()
            keep_a_stop_asked_while_starting(worker)
            try:
                # The worker's scheduler moves delayed retries (the probes') back to the queue.
                worker.work(with_scheduler=True)
            except RedisError:
                # With Redis away even its goodbye after a signal raises.
                if worker._shutdown_requested_date is None:
                    raise
            # rq's loop ends on a signal or on an error it gave up on: only a signal stops us.
            return worker._shutdown_requested_date is not None

        keep_running("the worker", work)


def keep_a_stop_asked_while_starting(worker: Worker) -> None:
    """Hold on to a SIGTERM or SIGINT that comes before rq installs its own handlers.

    rq logs "Listening on", takes the scheduler lock and forks the scheduler before it
    installs them: a signal in that window would kill the worker outright (its scheduler
    orphaned, its registration left in Redis). Caught here, it is what rq's loop checks
    first, so the worker stops as if asked once its loop begins.
    """

    def asked(signum: int, frame: FrameType | None) -> None:
        worker._shutdown_requested_date = now()
        worker._stop_requested = True

    signal.signal(signal.SIGTERM, asked)
    signal.signal(signal.SIGINT, asked)
