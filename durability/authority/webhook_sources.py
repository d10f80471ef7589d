"""Webhook sources: created with a fresh secret, enabled and disabled, each change audited."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction

from durability.audit import Trail
from durability.models import Project, WebhookKind, WebhookSource


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
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        source = WebhookSource.objects.create(
            project=project,
            name=name,
            kind=kind,
            system=system,
            secret=secrets.token_urlsafe(32),
            mapping=mapping,
            tolerance_s=tolerance_s,
        )
        trail.add("webhook_source_created", source=source.name, kind=kind.value, system=system)
        trail.append()
    return source


def webhook_source_enable(*, source: WebhookSource, actor: str, enabled: bool) -> None:
    trail = Trail(source.project_id, actor)
    with transaction.atomic():
        WebhookSource.objects.filter(pk=source.pk).update(enabled=enabled)
        source.enabled = enabled
        trail.add(
            "webhook_source_enabled" if enabled else "webhook_source_disabled", source=source.name
        )
        trail.append()
