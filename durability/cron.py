"""The schedule for `python manage.py rqcron durability.cron` (needs REDIS_URL)."""

from __future__ import annotations

from rq.cron import register

from durability import jobs

# A lost or duplicated run changes nothing the next one would not put right.
register(jobs.sweep, queue_name="default", interval=5)
