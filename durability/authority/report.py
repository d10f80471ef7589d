"""Authority against evidence: the four quadrants and the table of the authority report.

An effect is *authorized* when it was recorded under a grant and neither denied nor
still awaiting approval; it *has evidence* when any receipt names it. Orphan receipts
(evidence for a key no intent named) count as evidence without authority, because
nothing authorized them; they only open `orphan_receipt` (not `unauthorized_effect`)
since their intent may still arrive and be checked then.

Counts come from the hourly tallies (`durability.tallies`); the table is one query
whatever its length (the strongest receipt and the mismatch are subqueries, not per-row
look-ups).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Exists,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from durability.ledger.evidence import STRENGTH_RANK
from durability.ledger.grant_check import money
from durability.models import Case as LedgerCase
from durability.models import Effect, Project, Reason, Receipt, State
from durability.paging import Keyset, Page
from durability.tallies import tallied_until, tally

PAGE_SIZE = 100
# The table's order: newest first, keyset on id (`?before=<id>`).
NEWEST = Keyset("-id")
DEFAULT_SPAN = timedelta(days=7)


class Quadrant:
    AUTHORIZED_EVIDENCE = "authorized_evidence"
    AUTHORIZED_WAITING = "authorized_waiting"
    EVIDENCE_UNAUTHORIZED = "evidence_unauthorized"
    DENIED_UNATTEMPTED = "denied_unattempted"


QUADRANTS = [
    (Quadrant.AUTHORIZED_EVIDENCE, "Authorized, with evidence"),
    (Quadrant.AUTHORIZED_WAITING, "Authorized, no evidence yet"),
    (Quadrant.EVIDENCE_UNAUTHORIZED, "Evidence without authority"),
    (Quadrant.DENIED_UNATTEMPTED, "Denied or never attempted"),
]
QUADRANT_LABEL = dict(QUADRANTS)


# Recorded under a grant, and neither denied nor still awaiting approval.
AUTHORIZED = Q(grant__isnull=False) & ~Q(state__in=[State.DENIED, State.AWAITING_APPROVAL])
QUADRANT_OF = {
    (True, True): Quadrant.AUTHORIZED_EVIDENCE,
    (True, False): Quadrant.AUTHORIZED_WAITING,
    (False, True): Quadrant.EVIDENCE_UNAUTHORIZED,
    (False, False): Quadrant.DENIED_UNATTEMPTED,
}
QUADRANT_FILTER = {
    Quadrant.AUTHORIZED_EVIDENCE: AUTHORIZED & Q(evidenced=True),
    Quadrant.AUTHORIZED_WAITING: AUTHORIZED & Q(evidenced=False),
    Quadrant.EVIDENCE_UNAUTHORIZED: ~AUTHORIZED & Q(evidenced=True),
    Quadrant.DENIED_UNATTEMPTED: ~AUTHORIZED & Q(evidenced=False),
}

_RANK = Case(
    *[When(strength=strength, then=Value(rank)) for strength, rank in STRENGTH_RANK.items()],
    output_field=IntegerField(),
)


@dataclass(frozen=True)
class ReportQuery:
    """What the page shows: a time range over effects' creation, and filters."""

    since: datetime
    until: datetime
    kind: str = ""
    target: str = ""
    grant: int | None = None
    quadrant: str = ""

    @classmethod
    def default(cls, now: datetime | None = None) -> ReportQuery:
        now = now or timezone.now()
        return cls(since=now - DEFAULT_SPAN, until=now)

    @property
    def narrowed(self) -> bool:
        """Filters that orphan receipts (no effect: no kind, no grant) cannot satisfy."""
        return bool(self.kind or self.target or self.grant)


def _matching(project: Project, query: ReportQuery) -> QuerySet[Effect]:
    """The effects in the query's range and filters."""
    effects = Effect.objects.filter(
        project=project, created__gte=query.since, created__lt=query.until
    )
    if query.kind:
        effects = effects.filter(kind=query.kind)
    if query.target:
        effects = effects.filter(target=query.target)
    if query.grant:
        effects = effects.filter(grant=query.grant)
    return effects


def _evidence() -> Exists:
    return Exists(Receipt.objects.filter(project=OuterRef("project_id"), effect=OuterRef("pk")))


def _effects(project: Project, query: ReportQuery) -> QuerySet[Effect]:
    """The effects in the query's range and filters, and in its quadrant if it names one."""
    effects = _matching(project, query)
    if query.quadrant:
        effects = effects.alias(evidenced=_evidence()).filter(QUADRANT_FILTER[query.quadrant])
    return effects


def _orphans(project: Project, query: ReportQuery) -> QuerySet[Receipt]:
    if query.narrowed:
        return Receipt.objects.none()
    return Receipt.objects.filter(
        project=project, effect=None, received__gte=query.since, received__lt=query.until
    )


def quadrant_counts(project: Project, query: ReportQuery) -> dict[str, int]:
    """Effects per quadrant (orphan receipts added to evidence without authority).

    The effects per grant and state, with how many have evidence: from the hourly tallies
    for whole hours, live for the rest (`tallies.tally`), whatever the range's size.
    """
    filters: dict[str, Any] = {
        name: value
        for name, value in (("kind", query.kind), ("target", query.target), ("grant", query.grant))
        if value
    }
    found = tally(
        project,
        query.since,
        query.until,
        by=("grant", "state"),
        measures=("n", "evidenced"),
        tallied=tallied_until(project),
        **filters,
    )
    counts = dict.fromkeys(QUADRANT_LABEL, 0)
    for (grant, state), measured in found.groups.items():
        yes = _authorized(grant, state)
        counts[QUADRANT_OF[yes, True]] += measured["evidenced"]
        counts[QUADRANT_OF[yes, False]] += measured["n"] - measured["evidenced"]
    counts[Quadrant.EVIDENCE_UNAUTHORIZED] += _orphans(project, query).count()
    return counts


def _strongest() -> QuerySet[Receipt]:
    return (
        Receipt.objects.filter(project=OuterRef("project_id"), effect=OuterRef("pk"))
        .annotate(rank=_RANK)
        .order_by("-rank", "received", "id")
    )


def rows(project: Project, query: ReportQuery, before: int | None = None) -> QuerySet[Effect]:
    """The table: every effect the query matches (older than the id `before`, if given),
    newest first, with its authority, its strongest evidence (None without any: see
    `evidenced`) and whether evidence went beyond the grant.

    Whether a row has evidence is read from its strongest receipt, not asked again with an
    EXISTS: PostgreSQL plans that one as if it ran for every effect in the range, not for
    the page's hundred, and hashes every receipt of the project for it (a sequential scan,
    while the hash fits in work_mem); the strongest receipt's look-up, ordered and limited,
    is always made row by row, by the receipt's effect index.
    """
    table = (
        _effects(project, query)
        .select_related("grant")
        .annotate(
            strongest=Subquery(_strongest().values("strength")[:1]),
            strongest_id=Subquery(_strongest().values("external_id")[:1]),
            strongest_system=Subquery(_strongest().values("system")[:1]),
            exceeded=Exists(
                LedgerCase.objects.filter(
                    project=OuterRef("project_id"),
                    effect=OuterRef("pk"),
                    reason=Reason.AUTHORITY_EXCEEDED,
                )
            ),
            denied_rule=Subquery(
                LedgerCase.objects.filter(
                    project=OuterRef("project_id"),
                    effect=OuterRef("pk"),
                    reason=Reason.AUTHORITY_DENIED,
                )
                .order_by("-id")
                .values("detail__rule")[:1]
            ),
        )
    )
    return NEWEST.after(table, None if before is None else (before,))


def page(
    project: Project, query: ReportQuery, before: int | None
) -> tuple[list[Effect], int | None]:
    """One page of the table, keyset on id; and the id to continue before, if any."""
    taken = Page.of(rows(project, query, before or None), PAGE_SIZE)
    return taken.rows, taken.next(lambda effect: effect.pk)


def orphan_rows(project: Project, query: ReportQuery, limit: int = PAGE_SIZE) -> list[Receipt]:
    """Evidence for keys no intent named, newest first, unless the query looks elsewhere."""
    if query.quadrant not in ("", Quadrant.EVIDENCE_UNAUTHORIZED):
        return []
    return list(_orphans(project, query).order_by("-received", "-id")[:limit])


def _authorized(grant_id: int | None, state: str) -> bool:
    return grant_id is not None and state not in (State.DENIED, State.AWAITING_APPROVAL)


def authorized(effect: Effect) -> bool:
    return _authorized(effect.grant_id, effect.state)


def evidenced(effect: Any) -> bool:
    """Whether a row of the table has any receipt."""
    return effect.strongest is not None


def quadrant_of(effect: Any) -> str:
    return QUADRANT_OF[authorized(effect), evidenced(effect)]


def authority_of(effect: Any) -> str:
    """The authority column: the grant and what became of the ask."""
    if effect.grant_id is None:
        # Not denied, so it proceeded under an audit policy: the report is its evidence.
        return f"denied: {effect.denied_rule}" if effect.denied_rule else "no grant (audit policy)"
    grant = f"{effect.grant.name} (grant {effect.grant_id} v{effect.grant.version})"
    if effect.state == State.DENIED:
        return f"{grant}: denied" + (f" ({effect.denied_rule})" if effect.denied_rule else "")
    if effect.state == State.AWAITING_APPROVAL:
        return f"{grant}: awaiting approval"
    return grant


def mismatch_of(effect: Any) -> str:
    """Where authority and evidence disagree, in a few words; empty when they agree."""
    if effect.exceeded:
        return "evidence beyond the grant"
    if not evidenced(effect) or authorized(effect):
        return ""
    if effect.state == State.DENIED:
        return "happened although denied"
    if effect.state == State.AWAITING_APPROVAL:
        return "happened before approval"
    return "happened with no grant"


HEADER = [
    "effect",
    "key",
    "kind",
    "target",
    "state",
    "amount",
    "authority",
    "strongest evidence",
    "evidence id",
    "mismatch",
    "quadrant",
    "created",
]


def line(effect: Any) -> list[str]:
    """One row of the table, as the page and the CSV show it."""
    amount = money(effect.amount, effect.currency) if effect.amount is not None else ""
    evidence = f"{effect.strongest_system}:{effect.strongest_id}" if effect.strongest else ""
    return [
        str(effect.pk),
        effect.key,
        effect.kind,
        effect.target,
        effect.state,
        amount,
        authority_of(effect),
        effect.strongest or "none",
        evidence,
        mismatch_of(effect),
        QUADRANT_LABEL[quadrant_of(effect)],
        effect.created.isoformat(),
    ]


def lines(effects: QuerySet[Effect]) -> Iterator[list[str]]:
    yield HEADER
    for effect in effects.iterator(chunk_size=2000):
        yield line(effect)
