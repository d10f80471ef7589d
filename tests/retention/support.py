"""Helpers for the retention specifications: settled effects with payloads, a policy, and
the moment retention runs (injected, never slept for)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from durability.accounts import members
from durability.models import Effect, Project
from tests.ledger.support import failure, intent, receipt

OPERATOR = "user:operator"


def policy(
    project: Project, *, payload_days: int | None = 1, require_archive: bool = False
) -> None:
    members.project_retention_set(
        project=project,
        actor=OPERATOR,
        span_days=30,
        payload_days=payload_days,
        require_archive=require_archive,
    )


def later(days: float = 2) -> datetime:
    """A moment past the policy's day: what retention will see then."""
    return timezone.now() + timedelta(days=days)


def succeeded(project: Project, key: str, external_id: str = "") -> Effect:
    """An effect that failed once (an entry with the agent's error), then succeeded."""
    intent(project, key, request={"order": key, "card": "4242"}, replay="safe")
    failure(project, key, definitive=True)
    intent(project, key, request={"order": key, "card": "4242"}, replay="safe")
    receipt(project, key, external_id or f"re_{key}")
    return Effect.objects.get(project=project, key=key)
