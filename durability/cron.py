"""The schedule for `python manage.py scheduler` (needs REDIS_URL).

Without Redis, `python manage.py demoagents` runs the same schedule itself.
"""

from __future__ import annotations

from rq.cron import register

from durability import notices, tallies
from durability.desk import jobs as desk_jobs
from durability.ledger import jobs as ledger_jobs
from durability.reconcilers import jobs as reconciler_jobs
from durability.retention import jobs as retention_jobs
from trajectories import jobs as trajectories_jobs

# (job, seconds between runs). A lost or duplicated run changes nothing the next one would
# not put right.
SCHEDULE = [
    (ledger_jobs.sweep, 5),
    (reconciler_jobs.probe_scan, 60),
    (desk_jobs.alert, 60),
    (desk_jobs.overdue_notify, 60),
    (notices.notices_retry, 60),
    (desk_jobs.bulks_resume, 60),
    (trajectories_jobs.links_repair, 60),
    (tallies.projects_tally, 60),
    (trajectories_jobs.partitions_upkeep, 3600),
    (retention_jobs.payloads_prune, 3600),
    (retention_jobs.projects_delete_resume, 600),
]
for job, interval in SCHEDULE:
    register(job, queue_name="default", interval=interval)
