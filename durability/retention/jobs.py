"""The scheduled retention pass (durability.cron): thin, it calls the services."""

from __future__ import annotations

import logging

from durability.models import Project
from durability.retention import services

logger = logging.getLogger(__name__)


def payloads_prune() -> int:
    """Prune every project's payloads its policy lets go; the effects pruned. A refusal is
    logged and waits for a person; the other projects carry on."""
    pruned = 0
    for project in Project.objects.order_by("pk"):
        try:
            pruned += services.payloads_prune(project=project).effects
        except services.Refused as exc:
            logger.warning("retention of %s refused: %s", project, exc)
    return pruned
