"""Approvals: people's go-ahead for effects whose grant requires it.

An approval is decided by the first `deny`, or by `needed` approvals from different
people (the same person twice is refused). The decision itself is the state machine's
(settling.effect_approval_decide); this module says who may sign and when it is final.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from durability import audit
from durability.ledger import settling
from durability.models import (
    Approval,
    ApprovalStatus,
    AuditAction,
    Effect,
    Project,
    Signoff,
    SignoffVerdict,
    State,
)


class SignoffRefused(Exception):
    """The approval cannot take this person's verdict; the message says why."""


@dataclass
class SignoffOutcome:
    approval: Approval
    signoff: Signoff
    # True once the approval is decided and the effect released or denied.
    final: bool


def approval_sign(
    *, project: Project, approval_id: int, user: User, verdict: SignoffVerdict, reason: str
) -> SignoffOutcome:
    """Record one person's verdict and, when it is final, apply it to the effect.

    Locks the effect row first, then the approval, in the state machine's order, so
    two people signing at once are taken one after the other.
    """
    actor = f"user:{user.get_username()}"
    found = Approval.objects.filter(project=project, pk=approval_id).only("effect_id").first()
    if found is None:
        raise SignoffRefused(f"No approval {approval_id} in {project}.")
    _close_if_stale(found)
    with transaction.atomic():
        effect = Effect.objects.select_for_update().get(pk=found.effect_id)
        approval = Approval.objects.select_for_update().get(pk=approval_id)
        approval.effect = effect
        if approval.status == ApprovalStatus.CLOSED:
            raise SignoffRefused(f"Approval {approval.pk} is closed: {approval.closed_why}.")
        if approval.status != ApprovalStatus.OPEN:
            raise SignoffRefused(f"Approval {approval.pk} was already decided: {approval.status}.")
        if approval.signoffs.filter(user=user).exists():
            raise SignoffRefused(
                "You have already signed this approval; the next approval must come from "
                "someone else."
            )
        signoff = Signoff.objects.create(
            approval=approval, user=user, verdict=verdict, reason=reason
        )
        approvals = approval.signoffs.filter(verdict=SignoffVerdict.APPROVE).count()
        final = verdict == SignoffVerdict.DENY or approvals >= approval.needed
        # Appended before the decision below, so the effect's chain shows the sign-off first.
        with audit.trail(project, actor) as trail:
            trail.add(
                AuditAction.APPROVAL_SIGNED,
                effect=effect,
                approval=approval.pk,
                verdict=verdict.value,
                reason=reason,
                approvals=approvals,
                needed=approval.needed,
            )
        if final:
            approval.status = (
                ApprovalStatus.DENIED if verdict == SignoffVerdict.DENY else ApprovalStatus.APPROVED
            )
            approval.decided = timezone.now()
            approval.save(update_fields=["status", "decided"])
            settling.effect_approval_decide(
                project=project,
                effect_id=effect.pk,
                actor=actor,
                approve=verdict == SignoffVerdict.APPROVE,
                note=reason,
            )
    return SignoffOutcome(approval, signoff, final)


def _close_if_stale(approval: Approval) -> None:
    """Close an approval left open though its effect no longer awaits one (decided through the
    state machine directly, before settling.effect_approval_decide closed it itself)."""
    with transaction.atomic():
        effect = Effect.objects.select_for_update().get(pk=approval.effect_id)
        if effect.state != State.AWAITING_APPROVAL:
            Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.OPEN).update(
                status=ApprovalStatus.CLOSED, decided=timezone.now()
            )


def approvals_shown() -> QuerySet[Approval]:
    """Approvals with what their pages show, in a fixed number of queries."""
    return Approval.objects.select_related("effect__link__run", "grant").prefetch_related(
        Prefetch("signoffs", queryset=Signoff.objects.select_related("user").order_by("id"))
    )


def approvals_of(project: Project) -> QuerySet[Approval]:
    """A project's approvals with what their pages show."""
    return approvals_shown().filter(project=project)


def inbox(project: Project) -> list[Approval]:
    """Open approvals, oldest first: the ones waiting longest come first."""
    return list(approvals_of(project).filter(status=ApprovalStatus.OPEN).order_by("created", "id"))


def recently_decided(project: Project, limit: int = 20) -> list[Approval]:
    return list(
        approvals_of(project).exclude(status=ApprovalStatus.OPEN).order_by("-decided")[:limit]
    )
