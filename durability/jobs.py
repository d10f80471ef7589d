"""Background jobs: thin wrappers that take ids and call services."""

from __future__ import annotations

from durability import machine


def sweep() -> int:
    """One deadline sweep. Safe to run twice or concurrently: each move re-checks its row."""
    return len(machine.deadlines_sweep())
