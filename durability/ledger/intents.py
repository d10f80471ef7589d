"""Intents: recording one and answering it with the decision.

A new key is checked against its grant and recorded through the table's rows from None
(intent, require_approval, refuse); a known key is answered by the decision rule
(`decisions.decision_for`), and a `proceed` for it is a new attempt. Every attempt has a
deadline: the intent's `timeout_s`, else the project's `effect_timeout_s`.

The same tool call asked again under another key (a key that names the model's call id,
which a model's retry changes) is recognised too: an intent for a new key, from another
worker of the same run, with the same kind, target and request fingerprint as an effect of
that run still pending, interrupts that effect's attempt as a resumed run interrupts its own
(`effect_interrupt`: timed out, an `uncertain` case). The new key still proceeds: it may
be a deliberate second call, which is what its own key says.

Every round trip an intent makes to PostgreSQL (two; `tests/api/test_round_trips.py`), and
the two that this module does not spell out:
1. The BEGIN, the API key's check and the reads under the key's lock, in one pipeline:
   `audit.trail` opens the transaction with `rows.begun_lazily()`, which holds the BEGIN
   back so that it rides in the first batch; and the API's front door
   (`api.decorators.authorize(keys_ahead=True)`) set `rows.ahead(...)`, the keys version
   that validates a cached API key, which the first batch (`machine.KeyLock`'s `rows.Batch`)
   carries as its first column. A stale answer rolls the block back before anything was written.
2. The staged writes, the audit entries and the COMMIT, in one pipeline (`Trail.append(commit=True)`
   as the trail closes).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any, cast

from django.utils import timezone

from durability import audit, rows
from durability.audit import Trail
from durability.ledger import evidence, grant_check
from durability.ledger.cases import case_close, case_open, open_case_of, uncertain_case_open
from durability.ledger.commands import Intent
from durability.ledger.decisions import (
    UNREAD,
    Outcome,
    Unread,
    approval_where,
    decide,
    decision_for,
)
from durability.ledger.machine import EFFECT_MUTABLE_FIELDS, Event, KeyLock, apply
from durability.ledger.signals import effect_recorded
from durability.models import (
    Approval,
    Attempt,
    AuditAction,
    AuthorityPolicy,
    Case,
    Decision,
    Effect,
    Grant,
    Project,
    Reason,
    Receipt,
    Replay,
    Severity,
    State,
)
from durability.redaction import distinct, extras_of, redact_input

S = State
# The event that records a new effect, by the grant check's ruling.
ENTRY = {
    grant_check.Ruling.PROCEED: Event.INTENT,
    grant_check.Ruling.APPROVAL: Event.REQUIRE_APPROVAL,
    grant_check.Ruling.DENY: Event.REFUSE,
}
# What an intent changes on a pending effect when it makes the attempt an approval allowed.
ATTEMPT_FIELDS = [name for name in EFFECT_MUTABLE_FIELDS if name != "state"]


# json.dumps with these arguments would build this encoder afresh on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(request: Any) -> str:
    """SHA-256 over the canonical JSON of a request: sorted keys, no insignificant space."""
    canonical = _CANONICAL.encode(request)
    return hashlib.sha256(canonical.encode()).hexdigest()


# At most this many of a request's fields are listed as differing, then that more do.
DIFFERS_SHOWN = 20


def request_differs(stored: Any, asked: Any, path: str = "request") -> dict[str, list[Any]]:
    """Where two requests differ, field by field (`request.items.0.sku`: [was, now]); a
    field one lacks is None there. Lists are compared item by item."""
    found: dict[str, list[Any]] = {}

    def walk(a: Any, b: Any, at: str) -> None:
        if len(found) > DIFFERS_SHOWN:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{at}.{k}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{at}.{i}")
        elif a != b or type(a) is not type(b):
            found[at] = [a, b]

    walk(stored, asked, path)
    if len(found) > DIFFERS_SHOWN:
        found = dict(list(found.items())[:DIFFERS_SHOWN])
        found["request…"] = ["more fields differ", "more fields differ"]
    return found


def _claim_field(name: str) -> str:
    """The part of an intent a differing field belongs to: `request.amount` is the request."""
    return "request" if name == "fingerprint" or name.startswith("request") else name


def context_drift(previous: Attempt, current: Attempt) -> dict[str, list[Any]]:
    keys = set(previous.context) | set(current.context)
    return {
        k: [previous.context.get(k), current.context.get(k)]
        for k in sorted(keys)
        if previous.context.get(k) != current.context.get(k)
    }


def intent_record(*, project: Project, actor: str, intent: Intent) -> Outcome:
    """Record an intent and answer with a decision. Idempotent on the key.

    Locks the effect row; concurrent intents for one key are serialised on it, so
    exactly one of them is answered `proceed` for a new effect.
    """
    outcome = _intent_store(project=project, actor=actor, intent=intent)
    effect_recorded.send(sender=Effect, effect=outcome.effect, receipt=None)
    return outcome


def _intent_store(*, project: Project, actor: str, intent: Intent) -> Outcome:
    # The fingerprint and the claim are taken from the intent as sent, so that two requests
    # differing only in a secret are still two requests (a conflict); from here on only the
    # redacted intent is seen, so nothing stored or hashed into the audit chain holds a secret.
    extras = extras_of(project)
    fingerprint = distinct(
        intent.fingerprint or fingerprint_of(intent.request),
        extras,
        Effect._meta.get_field("fingerprint").max_length,
    )
    # Separate from the fingerprint, which is the client's to choose: what was approved and
    # checked is the request and this claim together, whoever computes the fingerprint.
    claim = fingerprint_of(grant_check.claim_of(intent))
    intent = redact_input(intent, extras)
    with audit.trail(project.pk, actor) as trail:
        read = _Read(project, intent, fingerprint)
        effect = read.lock.run(trail)
        if effect is None:
            outcome = _effect_new(project, intent, fingerprint, claim, trail, read)
            earlier = read.same_call_pending()
        else:
            return _answer(effect, intent, fingerprint, claim, trail, read)
    # Each earlier effect in its own transaction, under its own lock, after this one's.
    interrupted = [
        e for pk in earlier if (e := effect_interrupt(project=project, pk=pk, by=intent))
    ]
    if interrupted:
        keys = ", ".join(repr(e.key) for e in interrupted)
        outcome.reason += (
            f" An earlier attempt of the same tool call in this run ({keys}) was still pending: "
            "it is now in doubt, with an uncertain case."
        )
    return outcome


def effect_interrupt(*, project: Project, pk: int, by: Intent) -> Effect | None:
    """The effect's pending attempt was interrupted: the same run asked for the same tool
    call from another worker, under another key. Times the attempt out with an `uncertain`
    case; None when the effect no longer waits for that (a receipt, the sweep came first)."""
    with audit.trail(project.pk, "system:ledger") as trail:
        effect = (
            Effect.objects.select_for_update()
            .filter(project_id=project.pk, pk=pk, state=S.PENDING, run_id=by.run_id)
            .first()
        )
        if effect is None or effect.attempt_count == 0:
            return None
        trail.hold(effect)
        apply(effect, Event.INTERRUPTION, trail, attempt=effect.attempt_count, by_key=by.key)
        uncertain_case_open(
            effect,
            f"Run {by.run_id!r} asked for the same tool call again under key {by.key!r} while "
            f"attempt {effect.attempt_count} was pending: the effect may or may not have "
            "happened.",
            trail,
            cause="interruption",
            by_key=by.key,
        )
    return effect


# Read with the key's effect: its latest attempt, and its first receipt.
_BESIDE = [
    (Attempt, "WHERE project_id = e.project_id AND effect_id = e.id ORDER BY number DESC LIMIT 1"),
    (Receipt, "WHERE project_id = e.project_id AND effect_id = e.id ORDER BY received, id LIMIT 1"),
]


class _Read:
    """What an intent may need, read with the key's lock in one round trip: the effect,
    a key for it if it is new, the grant the intent names, the receipts that came before
    it, its latest attempt and first receipt, whether its target has a reconciler, and the
    run's pending effects that look like the same tool call under another key."""

    def __init__(self, project: Project, intent: Intent, fingerprint: str) -> None:
        self.project = project
        self.lock = lock = KeyLock(project, intent.key, _BESIDE)
        self.drawn = lock.key_drawn_if_new()
        grant_id = (intent.authority or {}).get("grant")
        self._grant = (
            lock.add(
                f"{rows.select_sql(Grant)} WHERE project_id = %s AND id = %s",
                [project.pk, grant_id],
            )
            if grant_id is not None
            else None
        )
        self._orphans = lock.add(
            f"{rows.select_sql(Receipt)} WHERE project_id = %s AND key = %s AND effect_id IS NULL "
            "ORDER BY received, id",
            [project.pk, intent.key],
        )
        self._reconciler = (
            lock.add(
                "SELECT 1 FROM durability_reconcilerconfig WHERE project_id = %s AND target = %s "
                "AND enabled",
                [project.pk, intent.target],
            )
            if intent.replay == Replay.RECONCILE.value
            else None
        )
        # Only an identified run and worker can tell a resumed process from a repeated call.
        self._same_call = (
            lock.add(
                "SELECT e.id FROM durability_effect e WHERE e.project_id = %s AND e.run_id = %s "
                "AND e.state = 'pending' AND e.attempt_count > 0 AND e.key <> %s "
                "AND e.kind = %s AND e.target = %s AND e.fingerprint = %s AND EXISTS ("
                "SELECT 1 FROM durability_attempt a WHERE a.project_id = e.project_id "
                "AND a.effect_id = e.id AND a.number = e.attempt_count AND a.worker <> '' "
                "AND a.worker <> %s) ORDER BY e.id LIMIT 10",
                [
                    project.pk,
                    intent.run_id,
                    intent.key,
                    intent.kind,
                    intent.target,
                    fingerprint,
                    intent.worker,
                ],
            )
            if intent.run_id and intent.worker
            else None
        )

    def same_call_pending(self) -> list[int]:
        """Pending effects of the intent's run with its kind, target and request, whose
        attempt another worker made: the same tool call, asked for under another key."""
        return [row[0] for row in self._same_call.rows] if self._same_call is not None else []

    def grant(self) -> Grant | None:
        row = self._grant.one() if self._grant is not None else None
        return rows.hydrate(Grant, row) if row is not None else None

    def orphans(self) -> list[Receipt]:
        return [rows.hydrate(Receipt, row) for row in self._orphans.rows]

    def latest_attempt(self) -> Attempt | None:
        return cast(Attempt | None, self.lock.found[0])

    def first_receipt(self) -> Receipt | Unread:
        """Unread when none was found: a receipt an operator's verdict stored while this
        intent waited for the effect's row is not in the snapshot it was read in."""
        return cast(Receipt | None, self.lock.found[1]) or UNREAD

    def reconciler(self) -> bool:
        return self._reconciler is not None and bool(self._reconciler.rows)


# -- a new key ---------------------------------------------------------------------------


def _effect_new(
    project: Project, intent: Intent, fingerprint: str, claim: str, trail: Trail, read: _Read
) -> Outcome:
    """Record a new effect as its grant check rules (the key is locked: no other writer
    can record it meanwhile)."""
    check = grant_check.authority_check(project=project, intent=intent, named=read.grant())
    event = ENTRY[check.ruling]
    effect = rows.new(
        Effect,
        pk=read.drawn.scalar(),
        project=project,
        key=intent.key,
        kind=intent.kind,
        target=intent.target,
        fingerprint=fingerprint,
        claim=claim,
        request=intent.request,
        replay=intent.replay,
        timeout_s=intent.timeout_s or project.effect_timeout_s,
        authority=intent.authority,
        grant=check.grant,
        amount=intent.amount.value if intent.amount else None,
        currency=intent.amount.currency if intent.amount else "",
    )
    attempt: Attempt | None = None
    if event == Event.INTENT:
        attempt = _attempt_begin(effect, intent)
    else:
        _place(effect, intent)
    authority: dict[str, Any] = {"grant": check.grant.pk} if check.grant else {}
    if check.rule:
        authority["rule"] = check.rule.value
    if check.policy:
        # The intent's audit entry keeps the policy that let an ungranted effect proceed.
        authority["policy"] = check.policy.value
    numbered: dict[str, Any] = {"attempt": attempt.number} if attempt else {}
    apply(effect, event, trail, **numbered, fingerprint=fingerprint, **authority)
    outcome = _ruled(effect, intent, check, attempt, authority, trail, read)
    adopted = evidence.orphans_adopt(project, effect, trail, read.orphans())
    if adopted is not None:
        _receipt_told(outcome, *adopted)
    return outcome


def _ruled(
    effect: Effect,
    intent: Intent,
    check: grant_check.Check,
    attempt: Attempt | None,
    authority: dict[str, Any],
    trail: Trail,
    read: _Read,
) -> Outcome:
    """What the grant check's ruling on a new effect opens, and the answer it gives."""
    if check.ruling == grant_check.Ruling.DENY:
        case = case_open(
            effect, Reason.AUTHORITY_DENIED, Severity.MEDIUM, check.reason, trail, **authority
        )
        return Outcome(Decision.DENIED, effect, check.reason, case=case, created=True)
    if check.ruling == grant_check.Ruling.APPROVAL:
        assert check.grant is not None
        approval = Approval.objects.create(
            project_id=effect.project_id,
            effect=effect,
            grant=check.grant,
            needed=check.approvers,
            context=_context_of(intent),
        )
        case = case_open(
            effect,
            Reason.APPROVAL_REQUIRED,
            Severity.MEDIUM,
            check.reason,
            trail,
            approval=approval.pk,
            approvers=check.approvers,
            **authority,
        )
        reason = check.reason + approval_where(approval)
        return Outcome(Decision.WAIT, effect, reason, case=case, created=True)
    assert attempt is not None
    trail.stage(attempt)
    outcome = Outcome(
        Decision.PROCEED,
        effect,
        "New effect: perform it, then send the receipt." + _reconciler_missing(effect, read),
        created=True,
    )
    if check.policy:
        outcome.reason += " " + check.reason
    # Under plain `audit` the effect row (no grant, the policy in its audit entry) is the
    # evidence the authority report lists; a case per effect only when the project asks.
    if check.policy == AuthorityPolicy.AUDIT_CASES:
        case_open(
            effect,
            Reason.UNAUTHORIZED_EFFECT,
            Severity.LOW,
            f"{effect.key!r} was attempted with no grant; the project's audit policy let it "
            "proceed.",
            trail,
            policy=check.policy.value,
        )
    return outcome


def _receipt_told(outcome: Outcome, receipt: Receipt, case: Case | None) -> None:
    """A new effect adopted receipts that arrived before its intent: it happened, so the
    answer is the rule's for the state the evidence left it in (`completed`, or `wait` for
    the approval it skipped, or `denied`), never `proceed`."""
    outcome.decision = decision_for(outcome.effect)
    outcome.receipt = receipt
    outcome.case = case or outcome.case
    told = (
        f"A receipt ({receipt}) arrived before this intent: "
        "the effect already happened; do not repeat it."
    )
    if outcome.decision == Decision.COMPLETED:
        outcome.reason = told
    else:
        outcome.reason = f"{told} {outcome.reason}"


def _reconciler_missing(effect: Effect, read: _Read) -> str:
    """Replay policy `reconcile` counts on a reconciler; without one the intent is still
    accepted (it may be configured before a timeout), and the agent is told."""
    if effect.replay != Replay.RECONCILE or read.reconciler():
        return ""
    return (
        f" No reconciler is configured for target {effect.target!r}: if this attempt times "
        "out, an operator must settle it."
    )


# -- a known key -------------------------------------------------------------------------


def _answer(
    effect: Effect, intent: Intent, fingerprint: str, claim: str, trail: Trail, read: _Read
) -> Outcome:
    """An intent for a recorded effect: the decision rule's answer, acted on."""
    if effect.fingerprint != fingerprint or effect.claim != claim:
        return _conflict(effect, intent, fingerprint, trail)
    latest = read.latest_attempt()
    # An effect recorded before projects had a default timeout gets it at its next attempt.
    effect.timeout_s = effect.timeout_s or read.project.effect_timeout_s
    if effect.state == S.PENDING and effect.attempt_count > 0:
        assert latest is not None
        carried_on = _attempt_resumed(effect, latest, intent, trail)
        if carried_on is not None:
            return carried_on
    if decision_for(effect) != Decision.PROCEED:
        return decide(effect, first_receipt=read.first_receipt())
    if effect.state == S.PENDING:
        return _first_attempt(effect, intent, trail)
    return _retry(effect, latest, intent, trail)


def _conflict(effect: Effect, intent: Intent, fingerprint: str, trail: Trail) -> Outcome:
    """The key was first recorded with another request or another authority claim: what
    was checked and approved is not what this intent would perform."""
    recorded, asked = grant_check.claim_recorded(effect), grant_check.claim_of(intent)
    differs = {k: [recorded[k], asked[k]] for k in asked if recorded[k] != asked[k]}
    if "amount" in differs:  # as pages show money (`50.00 EUR`), not as the claim holds it
        amount = intent.amount
        differs["amount"] = [
            None if effect.amount is None else grant_check.money(effect.amount, effect.currency),
            None if amount is None else grant_check.money(amount.value, amount.currency),
        ]
    if effect.fingerprint != fingerprint:
        # Both requests as stored (redacted): the fields that differ, or the fingerprints
        # when none does (a secret differed, the client's own fingerprint, a pruned request).
        fields = None if effect.payload_pruned else request_differs(effect.request, intent.request)
        differs |= fields or {"fingerprint": [effect.fingerprint, fingerprint]}
    # A claim whose digest differs while the columns agree differed in a redacted value.
    named = dict.fromkeys(_claim_field(k) for k in differs)
    what = ", ".join(named) or "authority"
    case = case_open(
        effect,
        Reason.KEY_REUSE_CONFLICT,
        Severity.HIGH,
        f"Key {effect.key!r} was reused with a different {what}.",
        trail,
        fingerprint=fingerprint,
        request=intent.request,
        run_id=intent.run_id,
        differs=differs,
    )
    return Outcome(
        Decision.CONFLICT,
        effect,
        f"Key {effect.key!r} was first recorded with a different {what}"
        + (
            f" (fingerprint {effect.fingerprint[:12]}…, this one {fingerprint[:12]}…)"
            if effect.fingerprint != fingerprint
            else ""
        )
        + "; do not perform it: what was checked and approved is the first intent's request "
        "and claim. Give a different effect its own key.",
        case=case,
    )


def _attempt_resumed(
    effect: Effect, current: Attempt, intent: Intent, trail: Trail
) -> Outcome | None:
    """An intent while an attempt is in progress: its own worker carries on with it (the
    answer); the same run in another process interrupted it (the effect times out, and
    the rule answers); anything else is left to the rule (None either way)."""
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
        apply(effect, Event.INTERRUPTION, trail, attempt=current.number)
        uncertain_case_open(
            effect,
            f"Run {intent.run_id!r} resumed while attempt {current.number} was pending: the "
            "effect may or may not have happened.",
            trail,
            cause="interruption",
        )
    return None


def _first_attempt(effect: Effect, intent: Intent, trail: Trail) -> Outcome:
    """The first intent after an approval makes the attempt the approval allowed."""
    attempt = _attempt_begin(effect, intent)
    effect.updated = attempt.started
    trail.stage(effect, *ATTEMPT_FIELDS)
    trail.stage(attempt)
    trail.add(AuditAction.ATTEMPT, effect=effect, attempt=attempt.number)
    return Outcome(Decision.PROCEED, effect, "Approved: perform the effect, then send the receipt.")


def _retry(effect: Effect, previous: Attempt | None, intent: Intent, trail: Trail) -> Outcome:
    """A new attempt at an effect whose last one failed, did not happen or may be replayed."""
    was = effect.state
    effect.late = False
    attempt = _attempt_begin(effect, intent)
    apply(effect, Event.RETRY, trail, attempt=attempt.number)
    trail.stage(attempt)
    uncertain = open_case_of(effect, Reason.UNCERTAIN)
    if uncertain is not None:
        case_close(uncertain, "retried", f"replay policy '{effect.replay}' allows a retry", trail)
    if previous is not None and (drift := context_drift(previous, attempt)):
        case_open(
            effect,
            Reason.VERSION_DRIFT,
            Severity.LOW,
            f"Attempt {attempt.number} runs under a different context than attempt "
            f"{previous.number}: {', '.join(drift)} changed.",
            trail,
            attempt=attempt.number,
            changes=drift,
        )
    return Outcome(
        Decision.PROCEED,
        effect,
        f"Attempt {attempt.number}: the previous attempt {was.replace('_', ' ')}; "
        "perform the effect, then send the receipt.",
    )


# -- attempts ------------------------------------------------------------------------------


def _context_of(intent: Intent) -> dict[str, Any]:
    return dict(intent.context)


def _place(effect: Effect, intent: Intent) -> None:
    """Where in a run and trace the intent was made, and who made it (the agent named, else
    the workflow), copied onto the effect's open cases if that changed; the caller saves
    the effect."""
    was = effect.case_names()
    effect.run_id = intent.run_id or effect.run_id
    effect.tool_call_id = intent.tool_call_id or ""
    effect.trace_id = intent.trace_id or ""
    effect.span_id = intent.span_id or ""
    context = _context_of(intent)
    effect.workflow = _named(context.get("workflow"))
    effect.agent = _named(context.get("agent")) or effect.workflow
    if not effect._state.adding and effect.case_names() != was:
        Case.objects.filter(project_id=effect.project_id, effect=effect, closed=None).update(
            **effect.case_names()
        )


def _named(value: Any) -> str:
    return value[:255] if isinstance(value, str) else ""


def _attempt_begin(effect: Effect, intent: Intent) -> Attempt:
    """Number, time and place the next attempt; the caller saves the effect."""
    now = timezone.now()
    effect.attempt_count += 1
    effect.deadline = now + timedelta(seconds=effect.timeout_s) if effect.timeout_s else None
    _place(effect, intent)
    return rows.new(
        Attempt,
        project_id=effect.project_id,
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
