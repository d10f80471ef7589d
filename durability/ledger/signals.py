"""What the ledger announces, so that it imports nothing of the apps that listen."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by intent_record and receipt_record, after their transaction, with `effect` and
# `receipt` (None for an intent). Trajectories links the effect to its run and spans.
effect_recorded = Signal()
