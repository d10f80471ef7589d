"""The background worker: rq's worker, started again whenever Redis goes away."""

from __future__ import annotations

from typing import Any

import django_rq
from django.core.management.base import BaseCommand, CommandParser
from django_rq.utils import reset_db_connections
from redis.exceptions import RedisError

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
