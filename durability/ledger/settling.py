"""Settling an effect: an operator's or a reconciler's verdict, and an approval's decision.

Who may give a verdict, and when an approval is final, is decided outside the ledger
(the desk, the reconcilers, the approvals service); they call these once it is.
"""

from __future__ import annotations

from django.utils import timezone

from durability import audit
from durability.ledger.cases import case_close, open_case_of
from durability.ledger.commands import ReceiptEvidence
from durability.ledger.evidence import EffectOutcome, receipt_row
from durability.ledger.machine import Event, IllegalTransition, apply, can, locked_by_id
from durability.models import Approval, ApprovalStatus, Project, Reason, State, Strength
from durability.redaction import extras_of, redact_input

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
    evidence: ReceiptEvidence | None = None,
) -> EffectOutcome:
    """An operator's or a reconciler's verdict on an effect, closing the cases it settles.

    `attest_happened` and `probe_found` need evidence, stored as a receipt of the
    matching strength; the terminal verdicts close every open case of the effect.
    """
    if event not in SETTLING_EVENTS:
        raise ValueError(f"{event} does not settle an effect")
    if event in EVIDENCE_STRENGTH and evidence is None:
        raise ValueError(f"{event} needs evidence")
    with audit.trail(project.pk, actor) as trail:
        effect = locked_by_id(project, effect_id, trail)
        if not can(State(effect.state), event):
            raise IllegalTransition(effect, event)
        if evidence is not None and event in EVIDENCE_STRENGTH:
            evidence = redact_input(evidence, extras_of(project))
            strength = EVIDENCE_STRENGTH[event]
            receipt = receipt_row(project, effect, evidence, strength, attempt=effect.attempt_count)
            receipt.save()
            apply(effect, event, trail, receipt=receipt.pk, note=note)
        else:
            apply(effect, event, trail, note=note)
        terminal = event in (Event.COMPENSATE, Event.ABANDON)
        settled = effect.cases.filter(project_id=effect.project_id, closed=None)
        if not terminal:
            settled = settled.filter(reason=Reason.UNCERTAIN)
        for case in settled:
            case_close(case, event.value, note, trail)
    return EffectOutcome(effect, None, changed=True)


def effect_approval_decide(
    *, project: Project, effect_id: int, actor: str, approve: bool, note: str
) -> EffectOutcome:
    """Release an effect awaiting approval (`pending`, no attempt yet: the agent's next
    intent makes it; `succeeded` if a receipt is already on record) or deny it, closing its
    `approval_required` case.

    Who may decide and how many must agree is the approvals service's business; it
    calls this once the decision is final.
    """
    with audit.trail(project.pk, actor) as trail:
        effect = locked_by_id(project, effect_id, trail)
        apply(effect, Event.APPROVE if approve else Event.DENY, trail, note=note)
        evidence = (
            effect.receipts.filter(project_id=effect.project_id).order_by("received", "id").first()
        )
        if approve and evidence is not None:
            # It happened before it was approved (its case says so): the approval settles
            # it, so that the agent's next intent is told `completed`, never `proceed`.
            apply(effect, Event.RECEIPT, trail, receipt=evidence.pk, approved_after=True)
        case = open_case_of(effect, Reason.APPROVAL_REQUIRED)
        if case is not None:
            case_close(case, "approved" if approve else "denied", note, trail)
        # Decided here without the approvals service's signatures: its approval is closed, so
        # that no inbox keeps asking for it.
        Approval.objects.filter(
            project_id=effect.project_id, effect=effect, status=ApprovalStatus.OPEN
        ).update(status=ApprovalStatus.CLOSED, decided=timezone.now())
    return EffectOutcome(effect, case, changed=True)
