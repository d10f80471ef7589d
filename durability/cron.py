"""The schedule for `python manage.py rqcron durability.cron` (needs REDIS_URL)."""

from __future__ import annotations

from rq.cron import register

from durability import jobs
from trajectories import jobs as trajectories_jobs

# A lost or duplicated run changes nothing the next one would not put right.
register(jobs.sweep, queue_name="default", interval=5)
register(jobs.probe_scan, queue_name="default", interval=60)
register(jobs.alert, queue_name="default", interval=60)
register(trajectories_jobs.links_repair, queue_name="default", interval=60)
