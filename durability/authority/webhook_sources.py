"""Webhook sources: created with a fresh secret, enabled and disabled, each change audited."""

from __future__ import annotations

import secrets
from typing import Any

from durability import audit
from durability.models import AuditAction, Project, WebhookKind, WebhookSource


def webhook_source_create(
    *,
    project: Project,
    actor: str,
    name: str,
    kind: WebhookKind,
    system: str,
    mapping: dict[str, Any],
    tolerance_s: int,
) -> WebhookSource:
    """A new source with a fresh secret, shown to admins on its page."""
    with audit.trail(project.pk, actor) as trail:
        source = WebhookSource.objects.create(
            project=project,
            name=name,
            kind=kind,
            system=system,
            secret=secrets.token_urlsafe(32),
            mapping=mapping,
            tolerance_s=tolerance_s,
        )
        trail.add(
            AuditAction.WEBHOOK_SOURCE_CREATED, source=source.name, kind=kind.value, system=system
        )
    return source


def webhook_source_enable(*, source: WebhookSource, actor: str, enabled: bool) -> None:
    with audit.trail(source.project_id, actor) as trail:
        WebhookSource.objects.filter(pk=source.pk).update(enabled=enabled)
        source.enabled = enabled
        trail.add(
            AuditAction.WEBHOOK_SOURCE_ENABLED if enabled else AuditAction.WEBHOOK_SOURCE_DISABLED,
            source=source.name,
        )
