"""Keep a long-running Redis client (the worker, the scheduler) alive while Redis comes and
goes: the deadline sweep must never stop silently because Redis restarted once."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

from redis.exceptions import RedisError
from rq.exceptions import StopRequested

logger = logging.getLogger(__name__)

# Waits between attempts double up to this; an attempt that ran this long starts them over.
MAX_WAIT_S = 30.0
HEALTHY_S = 60.0


def keep_running(name: str, run: Callable[[], bool]) -> None:
    """Call `run` again and again until it returns True (it was asked to stop).

    Each time it raises a Redis error, or returns False (rq gave up on its own), the next
    call comes after a wait that doubles while Redis stays away. A signal that asks to stop
    during a wait ends the loop.
    """
    wait = 1.0
    while True:
        started = time.monotonic()
        try:
            if run():
                return
            problem = "stopped on its own"
        except (StopRequested, KeyboardInterrupt):
            return  # a signal between rq's loops
        except RedisError as error:
            problem = f"lost Redis ({error})"
        if time.monotonic() - started >= HEALTHY_S:
            wait = 1.0
        logger.warning("%s %s; starting again in %.0f s", name, problem, wait)
        # rq's handlers are still installed and ask Redis things: during the wait, ours.
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            time.sleep(wait)
        except (StopRequested, KeyboardInterrupt):
            return
        wait = min(wait * 2, MAX_WAIT_S)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise StopRequested()
