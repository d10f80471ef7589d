"""Evidence about an attempt: receipts, failures, timeouts, and the deadline sweep.

A receipt settles its effect (late if the effect had been given up on) or opens the case
it calls for: orphan, duplicate, unauthorized, beyond its grant. A failure or a timeout
moves a pending effect on; an uncertain outcome opens a case for a person.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import cast

from django.utils import timezone

from durability import audit, rows
from durability.audit import Trail
from durability.ledger import grant_check
from durability.ledger.cases import case_close, case_open, open_case_of, uncertain_case_open
from durability.ledger.commands import Failure, ReceiptEvidence, Timeout
from durability.ledger.decisions import when
from durability.ledger.machine import Event, KeyLock, apply, locked
from durability.ledger.signals import effect_recorded
from durability.models import (
    AuditAction,
    Case,
    Effect,
    Grant,
    Project,
    Reason,
    Receipt,
    Severity,
    State,
    Strength,
)
from durability.redaction import extras_of, redact_input

S = State
# Receipts that settle an effect given up on are late successes.
LATE_FROM = frozenset({S.TIMED_OUT, S.FAILED, S.NOT_HAPPENED, S.ABANDONED})

# How much a receipt proves: the provider's own word outranks a person's, which outranks
# the agent's report about itself.
STRENGTH_RANK = {
    Strength.AGENT_REPORTED: 1,
    Strength.OPERATOR_ATTESTED: 2,
    Strength.PROVIDER_CONFIRMED: 3,
}


@dataclass
class ReceiptOutcome:
    receipt: Receipt
    effect: Effect | None
    case: Case | None
    created: bool


@dataclass
class EffectOutcome:
    """What a report on an effect (a failure, a timeout) or a verdict on it answers."""

    effect: Effect
    case: Case | None
    changed: bool


def aware(value: datetime | None) -> datetime | None:
    """A time from outside, in UTC when it names no zone."""
    if value is not None and timezone.is_naive(value):
        return value.replace(tzinfo=UTC)
    return value


# -- receipts ------------------------------------------------------------------------------


def receipt_record(
    *,
    project: Project,
    actor: str,
    receipt: ReceiptEvidence,
    strength: Strength = Strength.AGENT_REPORTED,
) -> ReceiptOutcome:
    """Store evidence that an effect happened and settle the effect if it can be.

    The same (key, system, external_id) twice is one receipt; a different external id
    for a succeeded effect is a duplicate effect.
    """
    outcome = _receipt_store(project=project, actor=actor, receipt=receipt, strength=strength)
    if outcome.effect is not None:
        effect_recorded.send(sender=Effect, effect=outcome.effect, receipt=outcome.receipt)
    return outcome


def receipt_row(
    project: Project,
    effect: Effect | None,
    receipt: ReceiptEvidence,
    strength: Strength,
    *,
    attempt: int | None,
) -> Receipt:
    """The row a piece of evidence is stored as (not saved yet)."""
    return rows.new(
        Receipt,
        project=project,
        effect=effect,
        key=effect.key if effect is not None else receipt.key,
        system=receipt.system,
        external_id=receipt.external_id,
        observed_at=aware(receipt.observed_at),
        data=receipt.data,
        amount=receipt.amount.value if receipt.amount else None,
        currency=receipt.amount.currency if receipt.amount else "",
        target=receipt.target or "",
        strength=strength,
        attempt=attempt,
        trace_id=receipt.trace_id or "",
        span_id=receipt.span_id or "",
    )


# The grant the evidence is compared with, read with its effect.
_GRANT_BESIDE = [(Grant, "WHERE project_id = e.project_id AND id = e.grant_id")]


@cache
def _sent_before_sql() -> str:
    """The same receipt sent before (by its unique index, receipt_identity_uniq: no ORDER BY,
    which could lead the planner away), or else a key drawn for it: one row either way."""
    return (
        f"SELECT {rows.names_sql(Receipt, 'r')}, CASE WHEN r.id IS NULL THEN "
        f'{rows.next_id(Receipt)} END FROM (SELECT 1) AS one LEFT JOIN "durability_receipt" r '
        "ON r.project_id = %s AND r.key = %s AND r.system = %s AND r.external_id = %s"
    )


def _receipt_store(
    *, project: Project, actor: str, receipt: ReceiptEvidence, strength: Strength
) -> ReceiptOutcome:
    # Before anything is looked up, stored or hashed: the redacted key and external id are
    # what earlier receipts were stored under.
    receipt = redact_input(receipt, extras_of(project))
    with audit.trail(project.pk, actor) as trail:
        lock = KeyLock(project, receipt.key, _GRANT_BESIDE)
        same = lock.add(
            _sent_before_sql(), [project.pk, receipt.key, receipt.system, receipt.external_id]
        )
        effect = lock.run(trail)
        found = same.one()
        assert found is not None  # one row whether the receipt was sent before or not
        *before, drawn = found
        if drawn is None:
            existing = rows.hydrate(Receipt, before)
            if STRENGTH_RANK[strength] > STRENGTH_RANK[Strength(existing.strength)]:
                # The provider confirms what the agent reported: the same evidence, stronger.
                trail.add(
                    AuditAction.RECEIPT_CONFIRMED,
                    effect=effect,
                    receipt=existing.pk,
                    was=existing.strength,
                    strength=strength.value,
                )
                existing.strength = strength
                trail.stage(existing, "strength")
            return ReceiptOutcome(existing, effect, None, created=False)
        row = receipt_row(project, effect, receipt, strength, attempt=receipt.attempt)
        row.pk = drawn
        if effect is None:
            trail.stage(row)
            trail.add(AuditAction.RECEIPT, receipt=row.pk, key=receipt.key, orphan=True)
            case = case_open(
                None,
                Reason.ORPHAN_RECEIPT,
                Severity.HIGH,
                f"A receipt from {receipt.system} ({receipt.external_id}) names key "
                f"{receipt.key!r}, which no intent has recorded.",
                trail,
                receipt=row,
                key=receipt.key,
            )
            return ReceiptOutcome(row, None, case, created=True)
        effect.grant = cast(Grant | None, lock.found[0])
        settled = _receipt_settle(project, effect, row, trail)
        return ReceiptOutcome(row, effect, settled, created=True)


def _receipt_settle(
    project: Project, effect: Effect, row: Receipt, trail: Trail, first: Receipt | None = None
) -> Case | None:
    """The evidence step every receipt for an effect passes, in order or adopted: the
    transition and its cases, then the comparison with the effect's grant. `first` is the
    effect's first receipt where the caller holds it unwritten (an adoption's first orphan)."""
    settled = _receipt_apply(effect, row, trail, first)
    flagged = _authority_of_evidence(project, effect, row, trail)
    return settled or flagged


def orphans_adopt(
    project: Project, effect: Effect, trail: Trail, orphans: list[Receipt]
) -> tuple[Receipt, Case | None] | None:
    """Give a new effect the receipts that arrived before its intent: the first of them and
    the case they call for, or None if there were none.

    Each passes the evidence step of a receipt that came in order, after its intent: it
    settles the effect, a second one is a duplicate, evidence for an effect awaiting
    approval or denied is unauthorized, evidence beyond the grant exceeds it. An orphan
    receipt names only the key, never the request, so any intent with that key adopts it:
    where the receipt and the intent disagree, its case stays open on the effect.
    `orphans` are the key's receipts without an effect, oldest first, read under its lock.
    """
    if not orphans:
        return None
    found: Case | None = None
    for row in orphans:
        row.effect = effect
        trail.stage(row, "effect")
        disputed = _orphan_case_settle(effect, row, trail)
        # The orphans after the first are duplicates of it, whose adoption is staged only.
        first = orphans[0] if row is not orphans[0] else None
        found = _receipt_settle(project, effect, row, trail, first) or disputed or found
    return orphans[0], found


def _orphan_case_settle(effect: Effect, row: Receipt, trail: Trail) -> Case | None:
    """Answer the orphan case's question, which effect the receipt belongs to: the case
    names the effect and closes, unless the receipt disagrees with the intent's request;
    then a case on the effect (returned) shows where."""
    differs = evidence_mismatch(effect, row)
    mismatch = (
        f" The intent recorded later for this key disagrees with it ({', '.join(differs)}): "
        "check that the receipt is this effect's."
    )
    case = Case.objects.filter(
        project_id=row.project_id, receipt=row, reason=Reason.ORPHAN_RECEIPT, closed=None
    ).first()
    if case is not None:
        case.effect = effect
        if differs and open_case_of(effect, Reason.ORPHAN_RECEIPT) is None:
            case.summary += mismatch
            case.detail["differs"] = differs
            case.version += 1
            case.save(update_fields=["effect", "summary", "detail", "version"])
            trail.add(AuditAction.CASE_REPEATED, effect=effect, case=case, reason=case.reason)
            return case
        # Closed before it names the effect: an effect has one open case per reason.
        case_close(case, "auto_resolved", "the intent for this key arrived", trail)
    # Closed cases (acknowledged before the intent came) name the effect too.
    Case.objects.filter(
        project_id=row.project_id, receipt=row, reason=Reason.ORPHAN_RECEIPT
    ).update(effect=effect)
    if not differs:
        return None
    # Another disputed receipt of the effect, or one whose case a person closed already.
    return case_open(
        effect,
        Reason.ORPHAN_RECEIPT,
        Severity.HIGH,
        f"A receipt from {row.system} ({row.external_id}) arrived before the intent for "
        f"key {effect.key!r}." + mismatch,
        trail,
        receipt=row,
        differs=differs,
    )


def evidence_mismatch(effect: Effect, row: Receipt) -> dict[str, list[object]]:
    """Where a receipt's own word disagrees with the effect's intent: {what: [intent, receipt]}.

    Compares what both name: the amount, the target, and the top-level fields that the
    intent's request and the receipt's data share.
    """
    differs: dict[str, list[object]] = {}
    if row.amount is not None and effect.amount is not None:
        asked = grant_check.money(effect.amount, effect.currency)
        said = grant_check.money(row.amount, row.currency or effect.currency)
        if asked != said:
            differs["amount"] = [asked, said]
    if row.target and row.target != effect.target:
        differs["target"] = [effect.target, row.target]
    request, data = effect.request, row.data
    if isinstance(request, dict) and isinstance(data, dict):
        for name in sorted(request.keys() & data.keys()):
            if request[name] != data[name]:
                differs[f"request.{name}"] = [request[name], data[name]]
    return differs


def _authority_of_evidence(
    project: Project, effect: Effect, row: Receipt, trail: Trail
) -> Case | None:
    """Compare new evidence with the effect's grant: beyond it opens a case, and so does
    none unless the project's policy is plain `audit`."""
    finding = grant_check.evidence_finding(effect, row, project.authority_policy)
    if finding is None:
        return None
    return case_open(
        effect,
        finding.reason,
        finding.severity,
        finding.summary,
        trail,
        receipt=row,
        **finding.detail,
    )


def _receipt_apply(
    effect: Effect, row: Receipt, trail: Trail, first: Receipt | None = None
) -> Case | None:
    """Apply a new receipt to its locked effect: the transition and the cases it implies."""
    state = State(effect.state)
    if state == S.PENDING:
        trail.stage(row)
        apply(effect, Event.RECEIPT, trail, receipt=row.pk)
        return None
    if state in LATE_FROM:
        row.late = effect.late = True
        trail.stage(row, "late")
        apply(effect, Event.RECEIPT, trail, receipt=row.pk, late=True)
        uncertain = open_case_of(effect, Reason.UNCERTAIN)
        if uncertain is not None:
            case_close(uncertain, "auto_resolved", "a receipt arrived after the timeout", trail)
        return case_open(
            effect,
            Reason.LATE_SUCCESS,
            Severity.HIGH,
            f"A receipt ({row}) arrived after the effect was "
            f"recorded as {state.replace('_', ' ')}: it happened after all.",
            trail,
            receipt=row,
            was=state.value,
        )
    trail.stage(row)
    trail.add(AuditAction.RECEIPT, effect=effect, receipt=row.pk)
    if state in (S.SUCCEEDED, S.COMPENSATED):
        first = (
            first
            or effect.receipts.filter(project_id=effect.project_id)
            .exclude(pk=row.pk)
            .order_by("received", "id")
            .first()
        )
        return case_open(
            effect,
            Reason.DUPLICATE_EFFECT,
            Severity.CRITICAL,
            f"A second receipt ({row}) differs from the first "
            f"({first}): the effect may have happened twice."
            if first
            else "A second receipt arrived: the effect may have happened twice.",
            trail,
            receipt=row,
            first=first.pk if first else None,
        )
    # awaiting_approval or denied: evidence of an effect that had no authority.
    return case_open(
        effect,
        Reason.UNAUTHORIZED_EFFECT,
        Severity.CRITICAL,
        f"A receipt ({row}) arrived for an effect that is {state}: it happened without authority.",
        trail,
        receipt=row,
    )


# -- failures, timeouts, deadlines ---------------------------------------------------------


def failure_record(*, project: Project, actor: str, failure: Failure) -> EffectOutcome:
    """A failed attempt: definitive (nothing happened) or uncertain (treated as a timeout)."""
    failure = redact_input(failure, extras_of(project))
    with audit.trail(project.pk, actor) as trail:
        effect = locked(project, failure.key, trail)
        target = S.FAILED if failure.definitive else S.TIMED_OUT
        if effect.state == target:
            return EffectOutcome(effect, open_case_of(effect, Reason.UNCERTAIN), changed=False)
        case: Case | None = None
        if failure.definitive:
            apply(effect, Event.FAILURE, trail, error=failure.error)
        else:
            apply(effect, Event.TIMEOUT, trail, error=failure.error, definitive=False)
            case = uncertain_case_open(
                effect,
                f"Attempt {effect.attempt_count} failed without knowing whether the effect "
                f"happened: {failure.error[:200]}",
                trail,
                error=failure.error,
            )
    return EffectOutcome(effect, case, changed=True)


def timeout_record(*, project: Project, actor: str, timeout: Timeout) -> EffectOutcome:
    """The agent makes its timeout authoritative: the outcome is now uncertain."""
    timeout = redact_input(timeout, extras_of(project))
    with audit.trail(project.pk, actor) as trail:
        effect = locked(project, timeout.key, trail)
        if effect.state == S.TIMED_OUT:
            return EffectOutcome(effect, open_case_of(effect, Reason.UNCERTAIN), changed=False)
        apply(effect, Event.TIMEOUT, trail, reason=timeout.reason)
        case = uncertain_case_open(
            effect,
            f"Attempt {effect.attempt_count} timed out: {timeout.reason[:200]}",
            trail,
            cause="timeout",
            note=timeout.reason,
        )
    return EffectOutcome(effect, case, changed=True)


def deadlines_sweep(*, now: datetime | None = None, limit: int = 1000) -> list[Effect]:
    """Time out pending effects whose deadline has passed; returns those it moved.

    Each effect moves in its own short transaction, read by its project and id (on a
    table distributed by project, on the project's node alone); rows locked by a
    concurrent writer are skipped and left to the next sweep.
    """
    now = now or timezone.now()
    due = list(
        Effect.objects.filter(state=S.PENDING, deadline__lt=now, project__deleting=None)
        .order_by("deadline")
        .values_list("pk", "project_id")[:limit]
    )
    moved = []
    for pk, project_id in due:
        with audit.trail(project_id, "system:sweep") as trail:
            effect = (
                Effect.objects.select_for_update(skip_locked=True)
                .filter(project_id=project_id, pk=pk, state=S.PENDING, deadline__lt=now)
                .first()
            )
            if effect is None:
                continue
            trail.hold(effect)
            apply(effect, Event.DEADLINE, trail, deadline=when(effect.deadline))
            uncertain_case_open(
                effect,
                f"Attempt {effect.attempt_count} passed its deadline ({when(effect.deadline)}) "
                "without a receipt: the effect may or may not have happened.",
                trail,
                cause="deadline",
            )
            moved.append(effect)
    return moved
