"""Helpers for the webhook specifications: sources as an admin creates them, signed headers."""

from __future__ import annotations

from durability.api.webhooks import signature_of
from durability.authority.webhook_sources import webhook_source_create
from durability.models import Project, WebhookKind, WebhookSource

STRIPE_MAPPING = {
    "key": "data.object.metadata.tallybook_key",
    "external_id": "data.object.id",
    "observed_at": "created",
    "amount": "data.object.amount",
    "currency": "data.object.currency",
    "exponent": 2,
}


def stripe_source(project: Project) -> WebhookSource:
    """A generic source mapping Stripe-like refund events."""
    return webhook_source_create(
        project=project,
        actor="user:ada",
        name="alpha-stripe",
        kind=WebhookKind.GENERIC,
        system="stripe",
        mapping=STRIPE_MAPPING,
        tolerance_s=300,
    )


def github_source(project: Project) -> WebhookSource:
    return webhook_source_create(
        project=project,
        actor="user:ada",
        name="alpha-github",
        kind=WebhookKind.GITHUB,
        system="github",
        mapping={},
        tolerance_s=300,
    )


def signed(body: bytes, stamp: str, secret: str, delivery: str = "d-1") -> dict[str, str]:
    """A generic source's headers for a body signed at `stamp` (Unix seconds)."""
    return {
        "X-Tallybook-Signature": signature_of(secret, body, stamp),
        "X-Tallybook-Timestamp": stamp,
        "X-Tallybook-Delivery": delivery,
    }
