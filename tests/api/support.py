"""Helpers for the webhook specifications: sources as an admin creates them, signed headers."""

from __future__ import annotations

import time
from typing import Any

from django.test import Client

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


def deliver(
    client: Client,
    source: WebhookSource,
    body: bytes,
    *,
    delivery: str = "d-1",
    secret: str | None = None,
    timestamp: str | None = None,
    **headers: str,
) -> Any:
    """POST `body` to the source's URL signed as its kind signs (at `timestamp`, or now, for
    a generic one), with the source's secret unless another is given; `headers` are added
    last. A replay of the same signed bytes passes the first delivery's timestamp: two
    calls "now" can fall in two different seconds."""
    key = secret or source.secret
    if source.kind == WebhookKind.GITHUB:
        own = {
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature_of(key, body),
        }
    else:
        own = signed(body, timestamp or str(int(time.time())), key, delivery)
    return client.post(
        f"/hooks/{source.name}/",
        data=body,
        content_type="application/json",
        headers={**own, **headers},
    )
