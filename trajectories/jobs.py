"""Background jobs of trajectories: thin, they take ids."""

from __future__ import annotations

from durability.jobs import enqueue
from durability.models import Effect, Receipt
from trajectories import links, retention


def effect_link(effect_id: int) -> None:
    links.effect_link_record(effect_id=effect_id)


def links_repair() -> int:
    """Link the recent effects whose link job was lost (scheduled); returns how many."""
    return len(links.links_repair())


def partitions_upkeep() -> list[str]:
    """Create the span partitions ahead and drop the expired ones (scheduled); returns the
    names of the partitions dropped."""
    return retention.partitions_upkeep().dropped


def effect_link_later(effect: Effect | None, *, receipt: Receipt | None = None) -> None:
    """After the transaction commits, link the effect if it names a run, trace or tool call."""
    if effect is None:
        return
    traced = receipt is not None and bool(receipt.trace_id)
    if effect.trace_id or effect.tool_call_id or effect.run_id or traced:
        enqueue(effect_link, effect.pk)


def effect_recorded(
    sender: object, *, effect: Effect, receipt: Receipt | None, **_: object
) -> None:
    """The ledger recorded an intent or a receipt (durability.ledger.signals.effect_recorded)."""
    effect_link_later(effect, receipt=receipt)
