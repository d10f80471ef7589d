"""The decision an intent for a recorded effect gets (docs/concepts.md, "Decision"), written once.

`decision_for` is the rule; `decide` adds the sentence the agent reads and is the dry
run (the API's and the desk's "what would an intent get now?"). `intent_record` acts on
the same rule for an intent that arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from durability.ledger.cases import open_case_of
from durability.models import Approval, Case, Decision, Effect, Reason, Receipt, Replay, State
from durability.site import site_url

S = State
# Replay policies under which a timed-out effect may be attempted again without a person.
RETRYABLE_AFTER_TIMEOUT = frozenset({Replay.SAFE, Replay.IDEMPOTENT})

# The decision by state, where the state alone decides (see `decision_for`).
BY_STATE = {
    S.SUCCEEDED: Decision.COMPLETED,
    S.FAILED: Decision.PROCEED,
    S.NOT_HAPPENED: Decision.PROCEED,
    S.AWAITING_APPROVAL: Decision.WAIT,
    S.DENIED: Decision.DENIED,
    # An operator closed these for good: the agent must not perform them again.
    S.COMPENSATED: Decision.DENIED,
    S.ABANDONED: Decision.DENIED,
}


class Unread:
    """Not read by the caller: read it here."""


UNREAD = Unread()


@dataclass
class Outcome:
    """What an intent (or a dry run of one) is answered."""

    decision: Decision
    effect: Effect
    reason: str
    receipt: Receipt | None = None
    case: Case | None = None
    created: bool = False


def decision_for(effect: Effect) -> Decision:
    """The rule: a pending effect proceeds only before its first attempt (it was just
    approved), a timed-out one only if its replay policy allows a blind retry."""
    state = State(effect.state)
    if state == S.PENDING:
        return Decision.PROCEED if effect.attempt_count == 0 else Decision.WAIT
    if state == S.TIMED_OUT:
        retryable = effect.replay in RETRYABLE_AFTER_TIMEOUT
        return Decision.PROCEED if retryable else Decision.WAIT
    return BY_STATE[state]


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "no deadline"


def decide(effect: Effect, *, first_receipt: Receipt | None | Unread = UNREAD) -> Outcome:
    """The decision a new intent for this (already recorded) effect would get now, and why.

    Records nothing; reads the effect's first receipt (unless the caller read it with the
    effect), open case or approval as its state calls for.
    """
    outcome = Outcome(decision_for(effect), effect, "")
    state, n = effect.state, effect.attempt_count
    if state == S.SUCCEEDED:
        outcome.receipt = receipt = (
            effect.receipts.filter(project_id=effect.project_id).order_by("received", "id").first()
            if isinstance(first_receipt, Unread)
            else first_receipt
        )
        where = str(receipt) if receipt else "a receipt"
        outcome.reason = f"Already done: {where} is on record; do not repeat the effect."
    elif state in (S.FAILED, S.NOT_HAPPENED):
        why = "failed with no effect" if state == S.FAILED else "was settled as not happened"
        outcome.reason = f"Attempt {n} {why}: a new attempt may be made."
    elif state == S.TIMED_OUT:
        outcome.case = open_case_of(effect, Reason.UNCERTAIN)
        outcome.reason = (
            f"Attempt {n} timed out and replay policy '{effect.replay}' allows a retry."
            if outcome.decision == Decision.PROCEED
            else f"Attempt {n} timed out with an unknown outcome and replay policy "
            f"'{effect.replay}' forbids a blind retry; an operator or a reconciler must "
            "settle the case first."
        )
    elif state == S.PENDING:
        outcome.reason = (
            "Approved: perform the effect, then send the receipt."
            if outcome.decision == Decision.PROCEED
            else f"Attempt {n} is in progress (deadline {when(effect.deadline)}); wait for its "
            "receipt or its deadline."
        )
    elif state == S.AWAITING_APPROVAL:
        approval = Approval.objects.filter(project_id=effect.project_id, effect=effect).first()
        outcome.case = open_case_of(effect, Reason.APPROVAL_REQUIRED)
        outcome.reason = "The effect awaits a person's approval." + (
            approval_where(approval) if approval else ""
        )
    elif state == S.DENIED:
        outcome.reason = _denial(effect)
    else:
        outcome.reason = (
            f"An operator closed this effect as {state}; use a new key to perform it again."
        )
    return outcome


def approval_where(approval: Approval) -> str:
    return f" Wait for approval {approval.pk}: {site_url()}{approval.get_absolute_url()}"


def _denial(effect: Effect) -> str:
    """Why a denied effect was denied: the grant rule, or the person who refused approval."""
    case = (
        effect.cases.filter(
            project_id=effect.project_id,
            reason__in=[Reason.AUTHORITY_DENIED, Reason.APPROVAL_REQUIRED],
        )
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
