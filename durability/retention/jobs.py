"""The scheduled retention pass (durability.cron): thin, it calls the services."""

from __future__ import annotations

import logging

from durability.jobs import enqueue
from durability.models import Project
from durability.retention import projects, services

logger = logging.getLogger(__name__)
# Seconds of deleting per job, well within RQ_QUEUES' DEFAULT_TIMEOUT (300).
JOB_BUDGET_S = 120


def payloads_prune() -> int:
    """Prune every project's payloads its policy lets go; the effects pruned. A refusal is
    logged and waits for a person; the other projects carry on."""
    pruned = 0
    for project in Project.objects.filter(deleting=None).order_by("pk"):
        try:
            pruned += services.payloads_prune(project=project).effects
        except services.Refused as exc:
            logger.warning("retention of %s refused: %s", project, exc)
    return pruned


def project_delete(project_id: int) -> bool:
    """Delete a project marked for deletion, in batches; a second run resumes the first.
    Stops well within the queue's job timeout and enqueues its own continuation. True once
    the project is gone."""
    done = projects.project_delete(project_id=project_id, budget_s=JOB_BUDGET_S)
    if not done.finished and not done.busy:
        enqueue(project_delete, project_id)
    return done.finished


def projects_delete_resume() -> int:
    """Carry on the deletions whose job was lost or crashed (scheduled): a job of its own
    for each, each within the queue's timeout; returns how many were enqueued."""
    marked = projects.projects_deleting()
    for project_id in marked:
        enqueue(project_delete, project_id)
    return len(marked)
