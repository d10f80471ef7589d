"""The Tallybook SDK: make an agent's external effects durable.

    from durability.sdk import Tallybook

    tb = Tallybook()  # TALLYBOOK_URL, TALLYBOOK_API_KEY
    with tb.run("refund-bot", version="2.3.0", run_id=ticket_id):
        with tb.effect(f"refund:{order_id}", kind="payment", target="stripe",
                       request={"order": order_id, "amount": 1250}, timeout_s=30) as fx:
            if fx.completed:
                return fx.receipt  # done before a crash: not repeated
            refund = stripe.Refund.create(...)
            fx.receipt(system="stripe", external_id=refund.id, observed_at=refund.created)

Imports nothing outside the standard library (OpenTelemetry is used when installed);
Django is not needed.
"""

from __future__ import annotations

from durability.sdk.aio import AsyncEffect, AsyncTallybook
from durability.sdk.client import Amount, Effect, ReceiptSlot, Tallybook
from durability.sdk.errors import (
    EffectConflict,
    EffectDenied,
    EffectInDoubt,
    EffectInterrupted,
    EffectUnsettled,
    IntentNotRecorded,
    RequestRejected,
    ServerUnavailable,
    TallybookError,
)
from durability.sdk.records import Case, EffectStatus, Receipt

__all__ = [
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
    "ReceiptSlot",
    "RequestRejected",
    "ServerUnavailable",
    "Tallybook",
    "TallybookError",
]
