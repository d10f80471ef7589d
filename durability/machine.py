"""The effect state machine: the table of allowed transitions and the services that apply it.

Nothing else changes `Effect.state`. Every service here runs in one transaction that
locks the effect row (SELECT … FOR UPDATE), applies at most the transitions the table
allows, opens or closes cases, and appends the audit entries before it commits.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from durability import grants
from durability.audit import Trail
from durability.models import (
    Approval,
    Attempt,
    Case,
    Decision,
    Effect,
    Project,
    Reason,
    Receipt,
    ReconcilerConfig,
    Replay,
    Resolution,
    Severity,
    State,
    Strength,
)
from durability.schemas import FailureIn, IntentIn, ReceiptIn, TimeoutIn
from durability.site import site_url


class Event(StrEnum):
    INTENT = "intent"
    RETRY = "retry"
    RECEIPT = "receipt"
    FAILURE = "failure"  # definitive: the provider said nothing happened
    TIMEOUT = "timeout"  # reported by the agent, or an uncertain failure
    DEADLINE = "deadline"  # the sweep found the deadline passed
    INTERRUPTION = "interruption"  # the same run resumed in a new process
    PROBE_FOUND = "probe_found"
    PROBE_NOT_FOUND = "probe_not_found"  # a reconciler's absence, trusted after its grace period
    ATTEST_HAPPENED = "attest_happened"
    ATTEST_NOT_HAPPENED = "attest_not_happened"
    COMPENSATE = "compensate"
    ABANDON = "abandon"
    REQUIRE_APPROVAL = "require_approval"
    REFUSE = "refuse"
    APPROVE = "approve"
    DENY = "deny"


S = State
# (from state, event) -> to state. None is an effect not yet recorded.
TRANSITIONS: dict[tuple[State | None, Event], State] = {
    (None, Event.INTENT): S.PENDING,
    (None, Event.REQUIRE_APPROVAL): S.AWAITING_APPROVAL,
    (None, Event.REFUSE): S.DENIED,
    (S.AWAITING_APPROVAL, Event.APPROVE): S.PENDING,
    (S.AWAITING_APPROVAL, Event.DENY): S.DENIED,
    (S.PENDING, Event.RECEIPT): S.SUCCEEDED,
    (S.PENDING, Event.FAILURE): S.FAILED,
    (S.PENDING, Event.TIMEOUT): S.TIMED_OUT,
    (S.PENDING, Event.DEADLINE): S.TIMED_OUT,
    (S.PENDING, Event.INTERRUPTION): S.TIMED_OUT,
    # Evidence after the effect was given up on: a late success.
    (S.TIMED_OUT, Event.RECEIPT): S.SUCCEEDED,
    (S.FAILED, Event.RECEIPT): S.SUCCEEDED,
    (S.NOT_HAPPENED, Event.RECEIPT): S.SUCCEEDED,
    (S.ABANDONED, Event.RECEIPT): S.SUCCEEDED,
    (S.TIMED_OUT, Event.PROBE_FOUND): S.SUCCEEDED,
    (S.TIMED_OUT, Event.ATTEST_HAPPENED): S.SUCCEEDED,
    (S.TIMED_OUT, Event.ATTEST_NOT_HAPPENED): S.NOT_HAPPENED,
    (S.TIMED_OUT, Event.PROBE_NOT_FOUND): S.NOT_HAPPENED,
    # A new attempt where a retry is safe.
    (S.TIMED_OUT, Event.RETRY): S.PENDING,
    (S.FAILED, Event.RETRY): S.PENDING,
    (S.NOT_HAPPENED, Event.RETRY): S.PENDING,
    (S.SUCCEEDED, Event.COMPENSATE): S.COMPENSATED,
    (S.TIMED_OUT, Event.COMPENSATE): S.COMPENSATED,
    (S.SUCCEEDED, Event.ABANDON): S.ABANDONED,
    (S.TIMED_OUT, Event.ABANDON): S.ABANDONED,
}

# Receipts that settle an effect given up on are late successes.
LATE_FROM = frozenset({S.TIMED_OUT, S.FAILED, S.NOT_HAPPENED, S.ABANDONED})
# Replay policies under which a timed-out effect may be attempted again without a person.
RETRYABLE_AFTER_TIMEOUT = frozenset({Replay.SAFE, Replay.IDEMPOTENT})


# What a transition may change on an effect row.
EFFECT_MUTABLE_FIELDS = [
    "state",
    "updated",
    "late",
    "deadline",
    "attempt_count",
    "run_id",
    "tool_call_id",
    "trace_id",
    "span_id",
]


class IllegalTransition(Exception):
    def __init__(self, effect: Effect, event: Event) -> None:
        self.effect, self.event = effect, event
        super().__init__(
            f"effect {effect.key!r} is {effect.state}; {event.value} is not allowed from there"
        )


class UnknownEffect(Exception):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no effect has the key {key!r} in this project")


def fingerprint_of(request: Any) -> str:
    """SHA-256 over the canonical JSON of a request: sorted keys, no insignificant space."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def can(state: State | None, event: Event) -> bool:
    return (state, event) in TRANSITIONS


def _apply(effect: Effect, event: Event, trail: Trail, **data: Any) -> None:
    """Move a locked effect along the table and record the move."""
    current = State(effect.state) if effect.pk else None
    target = TRANSITIONS.get((current, event))
    if target is None:
        raise IllegalTransition(effect, event)
    effect.state = target
    effect.updated = timezone.now()
    effect.save(update_fields=EFFECT_MUTABLE_FIELDS)
    trail.add(event.value, effect=effect, from_state=current or "", to_state=target, **data)


def _case_open(
    effect: Effect | None,
    reason: Reason,
    severity: Severity,
    summary: str,
    trail: Trail,
    *,
    project_id: int,
    receipt: Receipt | None = None,
    **detail: Any,
) -> Case:
    """Open a case, or add to the open case of the same reason on the same effect."""
    if effect is not None:
        case = Case.objects.filter(effect=effect, reason=reason, closed=None).first()
        if case is not None:
            case.detail.setdefault("repeats", []).append(detail)
            case.severity = max(case.severity, severity)
            case.version += 1
            case.save(update_fields=["detail", "severity", "version"])
            trail.add("case_repeated", effect=effect, case=case, reason=reason.value)
            return case
    case = Case.objects.create(
        project_id=project_id,
        effect=effect,
        receipt=receipt,
        reason=reason,
        severity=severity,
        summary=summary,
        detail=detail,
    )
    trail.add("case_opened", effect=effect, case=case, reason=reason.value)
    return case


def case_close(case: Case, action: str, note: str, trail: Trail) -> None:
    """Close a case with its (immutable) resolution, in the caller's transaction and trail."""
    case.closed = timezone.now()
    case.version += 1
    case.save(update_fields=["closed", "version"])
    Resolution.objects.create(case=case, actor=trail.actor, action=action, note=note)
    trail.add("case_closed", effect=case.effect, case=case, action=action, note=note)


def _open_case(effect: Effect, reason: Reason) -> Case | None:
    return Case.objects.filter(effect=effect, reason=reason, closed=None).first()


def _locked(project: Project, key: str) -> Effect:
    effect = Effect.objects.select_for_update().filter(project=project, key=key).first()
    if effect is None:
        raise UnknownEffect(key)
    return effect


def _locked_or_key_locked(project: Project, key: str) -> Effect | None:
    """The effect with this key, locked; or, while it has none, a lock on the key itself.

    Writers of a key without an effect row are serialised on a transaction-level advisory
    lock, so an intent adopts every receipt committed before it and a receipt finds the
    effect of every intent committed before it. SQLite runs one writer at a time anyway.
    """
    effect = Effect.objects.select_for_update().filter(project=project, key=key).first()
    connection = transaction.get_connection()
    if effect is not None or connection.vendor != "postgresql":
        return effect
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))", [key, project.pk])
    return Effect.objects.select_for_update().filter(project=project, key=key).first()


# -- the decision ------------------------------------------------------------------------


@dataclass
class Outcome:
    """What an intent (or a dry run of one) is answered."""

    decision: Decision
    effect: Effect
    reason: str
    receipt: Receipt | None = None
    case: Case | None = None
    created: bool = False


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "no deadline"


def decide(effect: Effect) -> Outcome:
    """The decision a new intent for this (already recorded) effect would get now."""
    state, n = effect.state, effect.attempt_count
    if state == S.SUCCEEDED:
        receipt = effect.receipts.order_by("received", "id").first()
        where = f"{receipt.system}:{receipt.external_id}" if receipt else "a receipt"
        return Outcome(
            Decision.COMPLETED,
            effect,
            f"Already done: {where} is on record; do not repeat the effect.",
            receipt=receipt,
        )
    if state in (S.FAILED, S.NOT_HAPPENED):
        why = "failed with no effect" if state == S.FAILED else "was settled as not happened"
        return Outcome(Decision.PROCEED, effect, f"Attempt {n} {why}: a new attempt may be made.")
    if state == S.TIMED_OUT:
        case = _open_case(effect, Reason.UNCERTAIN)
        if effect.replay in RETRYABLE_AFTER_TIMEOUT:
            return Outcome(
                Decision.PROCEED,
                effect,
                f"Attempt {n} timed out and replay policy '{effect.replay}' allows a retry.",
                case=case,
            )
        return Outcome(
            Decision.WAIT,
            effect,
            f"Attempt {n} timed out with an unknown outcome and replay policy "
            f"'{effect.replay}' forbids a blind retry; an operator or a reconciler must "
            "settle the case first.",
            case=case,
        )
    if state == S.PENDING and n == 0:
        return Outcome(
            Decision.PROCEED, effect, "Approved: perform the effect, then send the receipt."
        )
    if state == S.PENDING:
        return Outcome(
            Decision.WAIT,
            effect,
            f"Attempt {n} is in progress (deadline {_when(effect.deadline)}); wait for its "
            "receipt or its deadline.",
        )
    if state == S.AWAITING_APPROVAL:
        approval = Approval.objects.filter(effect=effect).first()
        return Outcome(
            Decision.WAIT,
            effect,
            "The effect awaits a person's approval." + (_where(approval) if approval else ""),
            case=_open_case(effect, Reason.APPROVAL_REQUIRED),
        )
    if state == S.DENIED:
        return Outcome(Decision.DENIED, effect, _denial(effect))
    return Outcome(
        Decision.DENIED,
        effect,
        f"An operator closed this effect as {state}; use a new key to perform it again.",
    )


def _where(approval: Approval) -> str:
    return f" Wait for approval {approval.pk}: {site_url()}{approval.get_absolute_url()}"


def _denial(effect: Effect) -> str:
    """Why a denied effect was denied: the grant rule, or the person who refused approval."""
    case = (
        effect.cases.filter(reason__in=[Reason.AUTHORITY_DENIED, Reason.APPROVAL_REQUIRED])
        .select_related("resolution")
        .order_by("-opened", "-id")
        .first()
    )
    if case is None:
        return "Authority for this effect was refused."
    if case.reason == Reason.AUTHORITY_DENIED:
        return case.summary
    refused = getattr(case, "resolution", None)
    if refused is None:
        return "Approval for this effect was refused."
    return f"Approval was denied by {refused.actor}: {refused.note}"


# -- intents -----------------------------------------------------------------------------


def _context_of(intent: IntentIn) -> dict[str, Any]:
    return intent.context.model_dump(exclude_none=True) if intent.context else {}


def _place(effect: Effect, intent: IntentIn) -> None:
    """Where in a run and trace the intent was made; the caller saves the effect."""
    effect.run_id = intent.run_id or effect.run_id
    effect.tool_call_id = intent.tool_call_id or ""
    effect.trace_id = intent.trace_id or ""
    effect.span_id = intent.span_id or ""


def _attempt_begin(effect: Effect, intent: IntentIn) -> Attempt:
    """Number, time and place the next attempt; the caller saves the effect."""
    now = timezone.now()
    effect.attempt_count += 1
    effect.deadline = now + timedelta(seconds=effect.timeout_s) if effect.timeout_s else None
    _place(effect, intent)
    return Attempt(
        effect=effect,
        number=effect.attempt_count,
        started=now,
        deadline=effect.deadline,
        context=_context_of(intent),
        run_id=intent.run_id or "",
        worker=intent.worker or "",
        trace_id=intent.trace_id or "",
        span_id=intent.span_id or "",
    )


def context_drift(previous: Attempt, current: Attempt) -> dict[str, list[Any]]:
    keys = set(previous.context) | set(current.context)
    return {
        k: [previous.context.get(k), current.context.get(k)]
        for k in sorted(keys)
        if previous.context.get(k) != current.context.get(k)
    }


def _retry(effect: Effect, intent: IntentIn, trail: Trail) -> Outcome:
    """A new attempt at an effect whose last one failed, did not happen or may be replayed."""
    previous = effect.attempts.order_by("-number").first()
    was = effect.state
    effect.late = False
    attempt = _attempt_begin(effect, intent)
    _apply(effect, Event.RETRY, trail, attempt=attempt.number)
    attempt.save()
    uncertain = _open_case(effect, Reason.UNCERTAIN)
    if uncertain is not None:
        case_close(uncertain, "retried", f"replay policy '{effect.replay}' allows a retry", trail)
    if previous is not None and (drift := context_drift(previous, attempt)):
        _case_open(
            effect,
            Reason.VERSION_DRIFT,
            Severity.LOW,
            f"Attempt {attempt.number} runs under a different context than attempt "
            f"{previous.number}: {', '.join(drift)} changed.",
            trail,
            project_id=effect.project_id,
            attempt=attempt.number,
            changes=drift,
        )
    return Outcome(
        Decision.PROCEED,
        effect,
        f"Attempt {attempt.number}: the previous attempt {was.replace('_', ' ')}; "
        "perform the effect, then send the receipt.",
    )


def _first_attempt(effect: Effect, intent: IntentIn, trail: Trail) -> Outcome:
    """The first intent after an approval makes the attempt the approval allowed."""
    attempt = _attempt_begin(effect, intent)
    effect.updated = attempt.started
    effect.save(update_fields=EFFECT_MUTABLE_FIELDS)
    attempt.save()
    trail.add("attempt", effect=effect, attempt=attempt.number)
    return Outcome(Decision.PROCEED, effect, "Approved: perform the effect, then send the receipt.")


def _resume(effect: Effect, intent: IntentIn, trail: Trail) -> Outcome:
    """An intent for an effect that is already pending."""
    if effect.attempt_count == 0:
        return _first_attempt(effect, intent, trail)
    current = effect.attempts.order_by("-number").first()
    assert current is not None
    if intent.worker and current.worker == intent.worker:
        return Outcome(
            Decision.PROCEED,
            effect,
            f"Attempt {current.number} was already granted to this worker; carry on with it.",
        )
    # Both workers named (and so different): without identities a resent request and a
    # resumed process look alike, and the attempt is left to its receipt or deadline.
    if intent.run_id and current.run_id == intent.run_id and intent.worker and current.worker:
        # The same run came back in another process: the attempt was interrupted
        # somewhere between the intent and the receipt, and nobody knows where.
        _apply(effect, Event.INTERRUPTION, trail, attempt=current.number)
        _case_open(
            effect,
            Reason.UNCERTAIN,
            Severity.HIGH,
            f"Run {intent.run_id!r} resumed while attempt {current.number} was pending: the "
            "effect may or may not have happened.",
            trail,
            project_id=effect.project_id,
            attempt=current.number,
            cause="interruption",
        )
        if effect.replay in RETRYABLE_AFTER_TIMEOUT:
            return _retry(effect, intent, trail)
    return decide(effect)


def _conflict(effect: Effect, intent: IntentIn, fingerprint: str, trail: Trail) -> Outcome:
    case = _case_open(
        effect,
        Reason.KEY_REUSE_CONFLICT,
        Severity.HIGH,
        f"Key {effect.key!r} was reused with a different request.",
        trail,
        project_id=effect.project_id,
        fingerprint=fingerprint,
        request=intent.request,
        run_id=intent.run_id,
    )
    return Outcome(
        Decision.CONFLICT,
        effect,
        f"Key {effect.key!r} was first used for a different request (fingerprint "
        f"{effect.fingerprint[:12]}…, this one {fingerprint[:12]}…); do not perform it, "
        "and give a different request its own key.",
        case=case,
    )


def intent_record(*, project: Project, actor: str, intent: IntentIn) -> Outcome:
    """Record an intent and answer with a decision. Idempotent on the key.

    Locks the effect row; concurrent intents for one key are serialised on it, so
    exactly one of them is answered `proceed` for a new effect.
    """
    fingerprint = intent.fingerprint or fingerprint_of(intent.request)
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = _locked_or_key_locked(project, intent.key)
        created = False
        if effect is None:
            check = grants.authority_check(project=project, intent=intent)
            effect = Effect(
                project=project,
                key=intent.key,
                kind=intent.kind,
                target=intent.target,
                fingerprint=fingerprint,
                request=intent.request,
                replay=intent.replay,
                state=TRANSITIONS[(None, ENTRY[check.ruling])],
                timeout_s=intent.timeout_s,
                authority=intent.authority,
                grant=check.grant,
                amount=Decimal(intent.amount.value) if intent.amount else None,
                currency=intent.amount.currency if intent.amount else "",
            )
            attempt: Attempt | None = None
            if check.ruling == grants.Ruling.PROCEED:
                attempt = _attempt_begin(effect, intent)
            else:
                _place(effect, intent)
            try:
                with transaction.atomic():
                    effect.save(force_insert=True)
                created = True
            except IntegrityError:
                # Another intent for this key committed first: answer as a repeat.
                effect = Effect.objects.select_for_update().get(project=project, key=intent.key)
        if created:
            outcome = _entered(effect, intent, check, attempt, fingerprint, trail)
        elif effect.fingerprint != fingerprint:
            outcome = _conflict(effect, intent, fingerprint, trail)
        elif effect.state == S.PENDING:
            outcome = _resume(effect, intent, trail)
        elif effect.state in (S.FAILED, S.NOT_HAPPENED) or (
            effect.state == S.TIMED_OUT and effect.replay in RETRYABLE_AFTER_TIMEOUT
        ):
            outcome = _retry(effect, intent, trail)
        else:
            outcome = decide(effect)
        trail.append()
    return outcome


# The event that records a new effect, by the grant check's ruling.
ENTRY = {
    grants.Ruling.PROCEED: Event.INTENT,
    grants.Ruling.APPROVAL: Event.REQUIRE_APPROVAL,
    grants.Ruling.DENY: Event.REFUSE,
}


def _entered(
    effect: Effect,
    intent: IntentIn,
    check: grants.Check,
    attempt: Attempt | None,
    fingerprint: str,
    trail: Trail,
) -> Outcome:
    """A new effect's first answer, from its grant check: proceed, wait for approval, or
    denied, with the case each calls for."""
    authority: dict[str, Any] = {"grant": check.grant.pk} if check.grant else {}
    if check.rule:
        authority["rule"] = check.rule.value
    data: dict[str, Any] = {"attempt": attempt.number} if attempt else {}
    trail.add(
        ENTRY[check.ruling].value,
        effect=effect,
        to_state=effect.state,
        **data,
        fingerprint=fingerprint,
        **authority,
    )
    project_id = effect.project_id
    if check.ruling == grants.Ruling.DENY:
        case = _case_open(
            effect,
            Reason.AUTHORITY_DENIED,
            Severity.MEDIUM,
            check.reason,
            trail,
            project_id=project_id,
            **authority,
        )
        return Outcome(Decision.DENIED, effect, check.reason, case=case, created=True)
    if check.ruling == grants.Ruling.APPROVAL:
        assert check.grant is not None
        approval = Approval.objects.create(
            project_id=project_id,
            effect=effect,
            grant=check.grant,
            needed=check.approvers,
            context=_context_of(intent),
        )
        case = _case_open(
            effect,
            Reason.APPROVAL_REQUIRED,
            Severity.MEDIUM,
            check.reason,
            trail,
            project_id=project_id,
            approval=approval.pk,
            approvers=check.approvers,
            **authority,
        )
        return Outcome(
            Decision.WAIT, effect, check.reason + _where(approval), case=case, created=True
        )
    assert attempt is not None
    attempt.effect = effect
    attempt.save()
    outcome = Outcome(
        Decision.PROCEED,
        effect,
        "New effect: perform it, then send the receipt." + _reconciler_missing(effect),
        created=True,
    )
    if check.unauthorized:
        outcome.reason += " " + check.reason
        _case_open(
            effect,
            Reason.UNAUTHORIZED_EFFECT,
            Severity.LOW,
            f"{effect.key!r} was attempted with no grant; the project's audit policy let it "
            "proceed.",
            trail,
            project_id=project_id,
            policy="audit",
        )
    _adopt_orphans(effect, trail, outcome)
    return outcome


def _reconciler_missing(effect: Effect) -> str:
    """Replay policy `reconcile` counts on a reconciler; without one the intent is still
    accepted (it may be configured before a timeout), and the agent is told."""
    if (
        effect.replay != Replay.RECONCILE
        or ReconcilerConfig.objects.filter(
            project_id=effect.project_id, target=effect.target, enabled=True
        ).exists()
    ):
        return ""
    return (
        f" No reconciler is configured for target {effect.target!r}: if this attempt times "
        "out, an operator must settle it."
    )


def _adopt_orphans(effect: Effect, trail: Trail, outcome: Outcome) -> None:
    """Receipts that arrived before their intent belong to the new effect: it happened."""
    orphans = list(
        Receipt.objects.filter(project_id=effect.project_id, key=effect.key, effect=None)
    )
    if not orphans:
        return
    Receipt.objects.filter(pk__in=[r.pk for r in orphans]).update(effect=effect)
    _apply(effect, Event.RECEIPT, trail, receipt=orphans[0].pk, adopted=len(orphans))
    # Their cases asked which effect the receipts belong to: this one. Closed before
    # they are attached, as an effect has at most one open case per reason.
    cases = Case.objects.filter(receipt__in=orphans, reason=Reason.ORPHAN_RECEIPT)
    for case in cases.filter(closed=None):
        case.effect = effect
        case_close(case, "auto_resolved", "the intent for this key arrived", trail)
    cases.update(effect=effect)
    outcome.decision = Decision.COMPLETED
    outcome.receipt = orphans[0]
    outcome.reason = (
        f"A receipt ({orphans[0].system}:{orphans[0].external_id}) arrived before this intent: "
        "the effect already happened; do not repeat it."
    )


# -- receipts, failures, timeouts ----------------------------------------------------------


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


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and timezone.is_naive(value):
        return value.replace(tzinfo=UTC)
    return value


def receipt_record(
    *,
    project: Project,
    actor: str,
    receipt: ReceiptIn,
    strength: Strength = Strength.AGENT_REPORTED,
) -> ReceiptOutcome:
    """Store evidence that an effect happened and settle the effect if it can be.

    The same (key, system, external_id) twice is one receipt; a different external id
    for a succeeded effect is a duplicate effect.
    """
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = _locked_or_key_locked(project, receipt.key)
        existing = Receipt.objects.filter(
            project=project, key=receipt.key, system=receipt.system, external_id=receipt.external_id
        ).first()
        if existing is not None:
            if STRENGTH_RANK[strength] > STRENGTH_RANK[Strength(existing.strength)]:
                # The provider confirms what the agent reported: the same evidence, stronger.
                trail.add(
                    "receipt_confirmed",
                    effect=effect,
                    receipt=existing.pk,
                    was=existing.strength,
                    strength=strength.value,
                )
                existing.strength = strength
                existing.save(update_fields=["strength"])
                trail.append()
            return ReceiptOutcome(existing, effect, None, created=False)
        row = Receipt(
            project=project,
            effect=effect,
            key=receipt.key,
            system=receipt.system,
            external_id=receipt.external_id,
            observed_at=_aware(receipt.observed_at),
            data=receipt.data,
            amount=Decimal(receipt.amount.value) if receipt.amount else None,
            currency=receipt.amount.currency if receipt.amount else "",
            target=receipt.target or "",
            strength=strength,
            attempt=receipt.attempt,
            trace_id=receipt.trace_id or "",
            span_id=receipt.span_id or "",
        )
        if effect is None:
            row.save()
            trail.add("receipt", receipt=row.pk, key=receipt.key, orphan=True)
            case = _case_open(
                None,
                Reason.ORPHAN_RECEIPT,
                Severity.HIGH,
                f"A receipt from {receipt.system} ({receipt.external_id}) names key "
                f"{receipt.key!r}, which no intent has recorded.",
                trail,
                project_id=project.pk,
                receipt=row,
                key=receipt.key,
            )
            trail.append()
            return ReceiptOutcome(row, None, case, created=True)
        settled = _settle(effect, row, trail)
        flagged = _authority_of_evidence(effect, row, trail)
        trail.append()
        return ReceiptOutcome(row, effect, settled or flagged, created=True)


def _authority_of_evidence(effect: Effect, row: Receipt, trail: Trail) -> Case | None:
    """Compare new evidence with the effect's grant: none, or beyond it, opens a case."""
    finding = grants.evidence_finding(effect, row)
    if finding is None:
        return None
    return _case_open(
        effect,
        finding.reason,
        finding.severity,
        finding.summary,
        trail,
        project_id=effect.project_id,
        receipt=row,
        **finding.detail,
    )


def _settle(effect: Effect, row: Receipt, trail: Trail) -> Case | None:
    """Apply a new receipt to its locked effect: the transition and the cases it implies."""
    state = State(effect.state)
    if state == S.PENDING:
        row.save()
        _apply(effect, Event.RECEIPT, trail, receipt=row.pk)
        return None
    if state in LATE_FROM:
        row.late = effect.late = True
        row.save()
        _apply(effect, Event.RECEIPT, trail, receipt=row.pk, late=True)
        uncertain = _open_case(effect, Reason.UNCERTAIN)
        if uncertain is not None:
            case_close(uncertain, "auto_resolved", "a receipt arrived after the timeout", trail)
        return _case_open(
            effect,
            Reason.LATE_SUCCESS,
            Severity.HIGH,
            f"A receipt ({row.system}:{row.external_id}) arrived after the effect was "
            f"recorded as {state.replace('_', ' ')}: it happened after all.",
            trail,
            project_id=effect.project_id,
            receipt=row,
            was=state.value,
        )
    row.save()
    trail.add("receipt", effect=effect, receipt=row.pk)
    if state in (S.SUCCEEDED, S.COMPENSATED):
        first = effect.receipts.exclude(pk=row.pk).order_by("received", "id").first()
        return _case_open(
            effect,
            Reason.DUPLICATE_EFFECT,
            Severity.CRITICAL,
            f"A second receipt ({row.system}:{row.external_id}) differs from the first "
            f"({first.system}:{first.external_id}): the effect may have happened twice."
            if first
            else "A second receipt arrived: the effect may have happened twice.",
            trail,
            project_id=effect.project_id,
            receipt=row,
            first=first.pk if first else None,
        )
    # awaiting_approval or denied: evidence of an effect that had no authority.
    return _case_open(
        effect,
        Reason.UNAUTHORIZED_EFFECT,
        Severity.CRITICAL,
        f"A receipt ({row.system}:{row.external_id}) arrived for an effect that is {state}: "
        "it happened without authority.",
        trail,
        project_id=effect.project_id,
        receipt=row,
    )


@dataclass
class EffectOutcome:
    effect: Effect
    case: Case | None
    changed: bool


def _uncertain(effect: Effect, summary: str, trail: Trail, **detail: Any) -> Case:
    return _case_open(
        effect,
        Reason.UNCERTAIN,
        Severity.HIGH,
        summary,
        trail,
        project_id=effect.project_id,
        attempt=effect.attempt_count,
        **detail,
    )


def failure_record(*, project: Project, actor: str, failure: FailureIn) -> EffectOutcome:
    """A failed attempt: definitive (nothing happened) or uncertain (treated as a timeout)."""
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = _locked(project, failure.key)
        target = S.FAILED if failure.definitive else S.TIMED_OUT
        if effect.state == target:
            return EffectOutcome(effect, _open_case(effect, Reason.UNCERTAIN), changed=False)
        if failure.definitive:
            _apply(effect, Event.FAILURE, trail, error=failure.error)
            case = None
        else:
            _apply(effect, Event.TIMEOUT, trail, error=failure.error, definitive=False)
            case = _uncertain(
                effect,
                f"Attempt {effect.attempt_count} failed without knowing whether the effect "
                f"happened: {failure.error[:200]}",
                trail,
                error=failure.error,
            )
        trail.append()
    return EffectOutcome(effect, case, changed=True)


def timeout_record(*, project: Project, actor: str, timeout: TimeoutIn) -> EffectOutcome:
    """The agent makes its timeout authoritative: the outcome is now uncertain."""
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = _locked(project, timeout.key)
        if effect.state == S.TIMED_OUT:
            return EffectOutcome(effect, _open_case(effect, Reason.UNCERTAIN), changed=False)
        _apply(effect, Event.TIMEOUT, trail, reason=timeout.reason)
        case = _uncertain(
            effect,
            f"Attempt {effect.attempt_count} timed out: {timeout.reason[:200]}",
            trail,
            cause="timeout",
            note=timeout.reason,
        )
        trail.append()
    return EffectOutcome(effect, case, changed=True)


def deadlines_sweep(*, now: datetime | None = None, limit: int = 1000) -> list[Effect]:
    """Time out pending effects whose deadline has passed; returns those it moved.

    Each effect moves in its own short transaction; rows locked by a concurrent
    writer are skipped and left to the next sweep.
    """
    now = now or timezone.now()
    due = list(
        Effect.objects.filter(state=S.PENDING, deadline__lt=now)
        .order_by("deadline")
        .values_list("pk", flat=True)[:limit]
    )
    moved = []
    for pk in due:
        with transaction.atomic():
            effect = (
                Effect.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, state=S.PENDING, deadline__lt=now)
                .first()
            )
            if effect is None:
                continue
            trail = Trail(effect.project_id, "system:sweep")
            _apply(effect, Event.DEADLINE, trail, deadline=_when(effect.deadline))
            _uncertain(
                effect,
                f"Attempt {effect.attempt_count} passed its deadline ({_when(effect.deadline)}) "
                "without a receipt: the effect may or may not have happened.",
                trail,
                cause="deadline",
            )
            trail.append()
            moved.append(effect)
    return moved


# -- settling by people and reconcilers --------------------------------------------------

SETTLING_EVENTS = frozenset(
    {
        Event.ATTEST_HAPPENED,
        Event.PROBE_FOUND,
        Event.ATTEST_NOT_HAPPENED,
        Event.PROBE_NOT_FOUND,
        Event.COMPENSATE,
        Event.ABANDON,
    }
)
EVIDENCE_STRENGTH = {
    Event.ATTEST_HAPPENED: Strength.OPERATOR_ATTESTED,
    Event.PROBE_FOUND: Strength.PROVIDER_CONFIRMED,
}


def effect_settle(
    *,
    project: Project,
    effect_id: int,
    actor: str,
    event: Event,
    note: str,
    evidence: ReceiptIn | None = None,
) -> EffectOutcome:
    """An operator's or a reconciler's verdict on an effect, closing the cases it settles.

    `attest_happened` and `probe_found` need evidence, stored as a receipt of the
    matching strength; the terminal verdicts close every open case of the effect.
    """
    if event not in SETTLING_EVENTS:
        raise ValueError(f"{event} does not settle an effect")
    if event in EVIDENCE_STRENGTH and evidence is None:
        raise ValueError(f"{event} needs evidence")
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = Effect.objects.select_for_update().filter(project=project, pk=effect_id).first()
        if effect is None:
            raise UnknownEffect(str(effect_id))
        if not can(State(effect.state), event):
            raise IllegalTransition(effect, event)
        if evidence is not None and event in EVIDENCE_STRENGTH:
            receipt = Receipt.objects.create(
                project=project,
                effect=effect,
                key=effect.key,
                system=evidence.system,
                external_id=evidence.external_id,
                observed_at=_aware(evidence.observed_at),
                data=evidence.data,
                strength=EVIDENCE_STRENGTH[event],
                attempt=effect.attempt_count,
            )
            _apply(effect, event, trail, receipt=receipt.pk, note=note)
        else:
            _apply(effect, event, trail, note=note)
        terminal = event in (Event.COMPENSATE, Event.ABANDON)
        settled = effect.cases.filter(closed=None)
        if not terminal:
            settled = settled.filter(reason=Reason.UNCERTAIN)
        for case in settled:
            case_close(case, event.value, note, trail)
        trail.append()
    return EffectOutcome(effect, None, changed=True)


# -- approvals -----------------------------------------------------------------------------


def effect_approval_decide(
    *, project: Project, effect_id: int, actor: str, approve: bool, note: str
) -> EffectOutcome:
    """Release an effect awaiting approval (`pending`, no attempt yet: the agent's next
    intent makes it) or deny it, closing its `approval_required` case.

    Who may decide and how many must agree is the approvals service's business; it
    calls this once the decision is final.
    """
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        effect = Effect.objects.select_for_update().filter(project=project, pk=effect_id).first()
        if effect is None:
            raise UnknownEffect(str(effect_id))
        _apply(effect, Event.APPROVE if approve else Event.DENY, trail, note=note)
        case = _open_case(effect, Reason.APPROVAL_REQUIRED)
        if case is not None:
            case_close(case, "approved" if approve else "denied", note, trail)
        trail.append()
    return EffectOutcome(effect, case, changed=True)
