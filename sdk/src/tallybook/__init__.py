"""The Tallybook SDK: make an agent's external effects durable.

    from tallybook import Tallybook

    tb = Tallybook()  # TALLYBOOK_URL, TALLYBOOK_API_KEY
    with tb.run("refund-bot", version="2.3.0", run_id=ticket_id):
        with tb.effect(f"refund:{order_id}", kind="payment", target="stripe",
                       request={"order": order_id, "amount": 1250}, timeout_s=30) as fx:
            if fx.completed:
                return fx.receipt  # done before a crash: not repeated
            refund = stripe.Refund.create(...)
            fx.receipt(system="stripe", external_id=refund.id, observed_at=refund.created)

Imports nothing outside the standard library; OpenTelemetry is used when
`opentelemetry-api` is installed (`pip install tallybook-sdk[otel]`).
"""

from __future__ import annotations

from tallybook.aio import AsyncEffect, AsyncTallybook
from tallybook.client import VERSION as __version__
from tallybook.client import Amount, Effect, ReceiptSlot, Tallybook
from tallybook.errors import (
    EffectConflict,
    EffectDenied,
    EffectInDoubt,
    EffectInterrupted,
    EffectUnsettled,
    IntentNotRecorded,
    ReceiptConflict,
    RequestRejected,
    ServerUnavailable,
    TallybookError,
)
from tallybook.records import Case, EffectStatus, Receipt
from tallybook.scope import current_run

__all__ = [
    "__version__",
    "Amount",
    "AsyncEffect",
    "AsyncTallybook",
    "Case",
    "Effect",
    "EffectConflict",
    "EffectDenied",
    "EffectInDoubt",
    "EffectInterrupted",
    "EffectStatus",
    "EffectUnsettled",
    "IntentNotRecorded",
    "Receipt",
    "ReceiptConflict",
    "ReceiptSlot",
    "RequestRejected",
    "ServerUnavailable",
    "Tallybook",
    "TallybookError",
    "current_run",
]
