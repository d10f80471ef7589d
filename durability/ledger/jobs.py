"""The ledger's background job: the deadline sweep (scheduled in durability.cron)."""

from __future__ import annotations

from durability.ledger import evidence


def sweep() -> int:
    """One deadline sweep. Safe to run twice or concurrently: each move re-checks its row."""
    return len(evidence.deadlines_sweep())
