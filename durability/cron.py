"""The schedule for `python manage.py rqcron durability.cron` (needs REDIS_URL).

Without Redis, `python manage.py demoagents` runs the same schedule itself.
"""

from __future__ import annotations

from rq.cron import register

from durability import jobs
from trajectories import jobs as trajectories_jobs

# (job, seconds between runs). A lost or duplicated run changes nothing the next one would
# not put right.
SCHEDULE = [
    (jobs.sweep, 5),
    (jobs.probe_scan, 60),
    (jobs.alert, 60),
    (trajectories_jobs.links_repair, 60),
]
for job, interval in SCHEDULE:
    register(job, queue_name="default", interval=interval)
