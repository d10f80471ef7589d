"""The desk's services: what an operator does to a case.

Each service is one transaction. Changes two operators may race on (resolving,
acknowledging, assigning) are a compare-and-swap on `Case.version`: the caller passes
the version it showed the operator, a conditional UPDATE bumps it, and of two
concurrent changes exactly one wins; the other gets `CaseChanged`. An effect's state
still changes only through the state machine (`settling.effect_settle`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from durability import audit
from durability.accounts.timezones import distance
from durability.desk import notifications
from durability.ledger import machine, settling
from durability.ledger.cases import case_close
from durability.ledger.commands import ReceiptEvidence
from durability.models import (
    ACKNOWLEDGED,
    AuditAction,
    AuditEntry,
    BulkAction,
    BulkVerb,
    Case,
    Comment,
    Effect,
    Membership,
    Project,
    Reason,
    Role,
    State,
    action_label,
    actor_named,
)


class Verdict(StrEnum):
    """An operator's answer to "did it happen?", and what was done about it."""

    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    COMPENSATED = "compensated"
    ABANDONED = "abandoned"


VERDICT_EVENTS = {
    Verdict.HAPPENED: machine.Event.ATTEST_HAPPENED,
    Verdict.NOT_HAPPENED: machine.Event.ATTEST_NOT_HAPPENED,
    Verdict.COMPENSATED: machine.Event.COMPENSATE,
    Verdict.ABANDONED: machine.Event.ABANDON,
}
V = Verdict
# The verdicts that settle a case of each reason (docs/operator-guide.md), offered when the
# state machine allows them from the effect's state. Only an uncertain case asks whether it
# happened; the other reasons' effects are already settled (or, for a key reuse, untouched),
# so their case is acknowledged once handled, or compensated where something happened that
# should not have. An approval is decided in the approvals inbox, never here.
REASON_VERDICTS: dict[Reason, frozenset[Verdict]] = {
    Reason.UNCERTAIN: frozenset({V.HAPPENED, V.NOT_HAPPENED, V.COMPENSATED, V.ABANDONED}),
    Reason.LATE_SUCCESS: frozenset({V.COMPENSATED}),
    Reason.DUPLICATE_EFFECT: frozenset({V.COMPENSATED}),
    Reason.KEY_REUSE_CONFLICT: frozenset(),
    Reason.ORPHAN_RECEIPT: frozenset(),
    Reason.VERSION_DRIFT: frozenset(),
    Reason.APPROVAL_REQUIRED: frozenset(),
    Reason.AUTHORITY_DENIED: frozenset(),
    Reason.UNAUTHORIZED_EFFECT: frozenset({V.COMPENSATED}),
    Reason.AUTHORITY_EXCEEDED: frozenset({V.COMPENSATED}),
}
# Cases whose effect is already in the right state: a person closes them once handled.
# An uncertain case needs a verdict, and an approval a decision, instead.
ACKNOWLEDGEABLE = frozenset(Reason) - {Reason.UNCERTAIN, Reason.APPROVAL_REQUIRED}
# Roles a case may be assigned to: people who can act on it.
ASSIGNABLE_ROLES = (Role.OPERATOR, Role.ADMIN)
VERDICT_WORDS = {
    V.HAPPENED: "it happened",
    V.NOT_HAPPENED: "it did not happen",
    V.COMPENSATED: "compensated",
    V.ABANDONED: "abandoned",
}


class CaseChanged(Exception):
    """The case changed since the operator saw it (or closed): their change was not made."""

    def __init__(self, case: Case) -> None:
        self.case = case
        last = (
            AuditEntry.objects.filter(project_id=case.project_id, case=case).order_by("-id").first()
        )
        if not case.is_open:
            resolution = getattr(case, "resolution", None)
            what = (
                f"{resolution.status.lower()}, by {actor_named(resolution.actor)}"
                if resolution
                else "it was closed"
            )
            when = case.closed
        elif last is not None:
            change = action_label(last.action).lower()
            what, when = f"{actor_named(last.actor)} made a change ({change})", last.at
        else:
            what, when = "someone else changed it", None
        ago = f" {distance(when, now=timezone.now())}" if when else ""
        super().__init__(
            f"Case #{case.pk} changed while you were looking at it: {what}{ago}. "
            "Your action was not applied; review the case as it is now."
        )


class NotApplicable(Exception):
    """The action does not fit this case (its reason or its effect's state)."""


@dataclass(frozen=True)
class Evidence:
    """What an operator attests: where the effect is recorded, and how they know."""

    system: str
    external_id: str
    link: str = ""
    note: str = ""


def verdicts_for(case: Case) -> list[Verdict]:
    """The verdicts that settle the case's reason and that the state machine allows for its
    effect as it is now."""
    if case.effect is None or not case.is_open:
        return []
    state = State(case.effect.state)
    settle = REASON_VERDICTS[Reason(case.reason)]
    return [v for v in Verdict if v in settle and machine.can(state, VERDICT_EVENTS[v])]


def can_acknowledge(case: Case) -> bool:
    return case.is_open and case.reason in ACKNOWLEDGEABLE


def verdict_refusal(case: Case, verdict: Verdict) -> str:
    """Why a verdict is not offered for this case, in words a person says."""
    said = VERDICT_WORDS[verdict].capitalize()
    if verdict in REASON_VERDICTS[Reason(case.reason)]:
        state = case.effect.state if case.effect else "no effect"
        return f"“{said}” does not apply to a case whose effect is {state}."
    offered = [VERDICT_WORDS[v] for v in verdicts_for(case)]
    if can_acknowledge(case):
        offered.append("acknowledge")
    instead = f" Offered: {', '.join(offered)}." if offered else ""
    return f"“{said}” does not settle a case of reason {case.reason}.{instead}"


def _claim(*, project: Project, case_id: int, version: int) -> Case:
    """Take the case for one change, or raise `CaseChanged`.

    Locks the case's effect first, then the case (the state machine's order), so a
    receipt arriving at the same moment cannot deadlock with the operator.
    """
    effect_id = (
        Case.objects.filter(project=project, pk=case_id).values_list("effect_id", flat=True).get()
    )
    if effect_id is not None:
        machine.locked_by_id(project, effect_id)
    won = Case.objects.filter(pk=case_id, version=version, closed=None).update(
        version=F("version") + 1
    )
    case = Case.objects.select_related("effect", "assignee").get(pk=case_id)
    if not won:
        raise CaseChanged(case)
    return case


def _evidence_receipt(effect: Effect, evidence: Evidence) -> ReceiptEvidence:
    data = {k: v for k, v in (("link", evidence.link), ("note", evidence.note)) if v}
    return ReceiptEvidence(
        key=effect.key,
        system=evidence.system,
        external_id=evidence.external_id,
        data=data or None,
    )


def case_resolve(
    *,
    project: Project,
    case_id: int,
    version: int,
    actor: str,
    verdict: Verdict,
    note: str,
    evidence: Evidence | None = None,
) -> Case:
    """Settle the case's effect with a verdict and close the case.

    `happened` needs evidence, stored as an `operator_attested` receipt. The state
    machine also closes the effect's other cases that the verdict settles.
    """
    event = VERDICT_EVENTS[verdict]
    if verdict == Verdict.HAPPENED and evidence is None:
        raise NotApplicable("Saying it happened needs evidence: a system and an external id.")
    with audit.trail(project.pk, actor):
        case = _claim(project=project, case_id=case_id, version=version)
        if case.effect is None or verdict not in verdicts_for(case):
            raise NotApplicable(verdict_refusal(case, verdict))
        receipt = _evidence_receipt(case.effect, evidence) if evidence else None
        settling.effect_settle(
            project=project,
            effect_id=case.effect.pk,
            actor=actor,
            event=event,
            note=note,
            evidence=receipt,
        )
        # A compensation settles every case of the effect, the other verdicts its uncertain
        # ones: the only reason they are offered for.
        case.refresh_from_db()
    return case


def case_acknowledge(
    *, project: Project, case_id: int, version: int, actor: str, note: str
) -> Case:
    """Close a case whose effect is already in the right state, without changing it."""
    with audit.trail(project.pk, actor) as trail:
        case = _claim(project=project, case_id=case_id, version=version)
        if case.reason not in ACKNOWLEDGEABLE:
            raise NotApplicable(
                f"A case of reason {case.reason} needs a verdict, not an acknowledgement."
            )
        case_close(case, ACKNOWLEDGED, note, trail)
    return case


def assignable_members(project: Project) -> QuerySet[User]:
    """The project's members who may act on a case, by username."""
    return User.objects.filter(
        membership__project=project, membership__role__in=ASSIGNABLE_ROLES
    ).order_by("username")


def case_assign(
    *,
    project: Project,
    case_id: int,
    version: int,
    actor: str,
    assignee: User | None,
    notify: bool = True,
) -> Case:
    """Give the case to a member who can act on it, or to nobody; with `notify`, the
    assignee is emailed (after the commit) unless they took it themselves."""
    if (
        assignee is not None
        and not Membership.objects.filter(
            project=project, user=assignee, role__in=ASSIGNABLE_ROLES
        ).exists()
    ):
        raise NotApplicable(f"{assignee.get_username()} cannot act on this project's cases.")
    with audit.trail(project.pk, actor) as trail:
        case = _claim(project=project, case_id=case_id, version=version)
        was = case.assignee.get_username() if case.assignee else None
        case.assignee = assignee
        case.save(update_fields=["assignee"])
        trail.add(
            AuditAction.CASE_ASSIGNED,
            effect=case.effect,
            case=case,
            assignee=assignee.get_username() if assignee else None,
            was=was,
        )
        if notify:
            notifications.case_assigned(project, case, actor=actor)
    return case


def case_snooze(
    *,
    project: Project,
    case_id: int,
    version: int,
    actor: str,
    until: datetime | None,
    now: datetime | None = None,
) -> Case:
    """Take an open case out of the default queue until `until`, or (None) until a newer case
    joins its group; it comes back on its own (desk.queue.snoozed reads it at query time)."""
    now = now or timezone.now()
    if until is not None and until <= now:
        raise NotApplicable("A snooze ends in the future: choose a later time.")
    with audit.trail(project.pk, actor) as trail:
        case = _claim(project=project, case_id=case_id, version=version)
        case.snoozed_at, case.snoozed_until = now, until
        case.save(update_fields=["snoozed_at", "snoozed_until"])
        trail.add(
            AuditAction.CASE_SNOOZED,
            effect=case.effect,
            case=case,
            until=until.isoformat() if until else None,
            recurrence=until is None,
        )
    return case


def case_unsnooze(*, project: Project, case_id: int, version: int, actor: str) -> Case:
    """Bring a snoozed case back to the queue now."""
    with audit.trail(project.pk, actor) as trail:
        case = _claim(project=project, case_id=case_id, version=version)
        if case.snoozed_at is None:
            raise NotApplicable(f"Case #{case.pk} is not snoozed.")
        case.snoozed_at = case.snoozed_until = None
        case.save(update_fields=["snoozed_at", "snoozed_until"])
        trail.add(AuditAction.CASE_UNSNOOZED, effect=case.effect, case=case)
    return case


def case_comment(*, project: Project, case_id: int, actor: str, body: str) -> Comment:
    """Add a comment to a case, open or closed; the members it mentions (`@name`) are
    emailed after the commit. Comments never race: no version check."""
    with audit.trail(project.pk, actor) as trail:
        case = Case.objects.select_related("effect").get(project=project, pk=case_id)
        comment = Comment.objects.create(
            project_id=case.project_id, case=case, actor=actor, body=body
        )
        trail.add(AuditAction.CASE_COMMENTED, effect=case.effect, case=case, comment=comment.pk)
        notifications.comment_posted(project, case, comment)
    return comment


# -- many cases at once ------------------------------------------------------------------

# Per bulk transaction: short enough that progress moves and locks stay brief.
BULK_CHUNK = 50
# An unfinished bulk action this old is carried on by the scheduled pass: long enough that a
# job still at work rarely shares it (sharing is safe: its chunks take turns).
BULK_STALLED = timedelta(minutes=2)


def bulk_eligible(cases: QuerySet[Case], verb: BulkVerb) -> QuerySet[Case]:
    """The open cases among `cases` that `verb` can act on."""
    cases = cases.filter(closed=None)
    if verb == BulkVerb.NOT_HAPPENED:
        # The one reason that verdict settles (REASON_VERDICTS), where the machine allows it.
        return cases.filter(reason=Reason.UNCERTAIN, effect__state=State.TIMED_OUT)
    if verb == BulkVerb.ACKNOWLEDGE:
        return cases.filter(reason__in=ACKNOWLEDGEABLE)
    return cases


def bulk_start(
    *,
    project: Project,
    actor: str,
    verb: BulkVerb,
    case_ids: Iterable[int],
    note: str,
    assignee: User | None = None,
) -> BulkAction:
    """Record a bulk action over these cases; `bulk_run` then carries it out."""
    ids = list(case_ids)
    with audit.trail(project.pk, actor) as trail:
        bulk = BulkAction.objects.create(
            project=project,
            actor=actor,
            verb=verb,
            note=note,
            assignee=assignee,
            case_ids=ids,
            total=len(ids),
        )
        trail.add(
            AuditAction.BULK_STARTED,
            bulk=bulk.pk,
            verb=verb.value,
            total=len(ids),
            note=note,
            assignee=assignee.get_username() if assignee else None,
        )
    return bulk


def _bulk_one(bulk: BulkAction, case: Case) -> bool:
    """Apply the bulk action to one case at its current version; False if it was skipped."""
    project = bulk.project
    try:
        with transaction.atomic():
            if bulk.verb == BulkVerb.ASSIGN:
                case_assign(
                    project=project,
                    case_id=case.pk,
                    version=case.version,
                    actor=bulk.actor,
                    assignee=bulk.assignee,
                    # One email for the whole action when it finishes, not one per case.
                    notify=False,
                )
            elif bulk.verb == BulkVerb.NOT_HAPPENED:
                case_resolve(
                    project=project,
                    case_id=case.pk,
                    version=case.version,
                    actor=bulk.actor,
                    verdict=Verdict.NOT_HAPPENED,
                    note=bulk.note,
                )
            else:
                case_acknowledge(
                    project=project,
                    case_id=case.pk,
                    version=case.version,
                    actor=bulk.actor,
                    note=bulk.note,
                )
    except (CaseChanged, NotApplicable, machine.IllegalTransition):
        return False
    return True


def bulks_stalled() -> list[int]:
    """Unfinished bulk actions confirmed more than BULK_STALLED ago: their job was lost
    (Redis went away, a worker was killed) or is still at work; `bulk_run` may take either."""
    since = timezone.now() - BULK_STALLED
    stalled = BulkAction.objects.filter(finished=None, created__lt=since).order_by("created")
    return list(stalled.values_list("pk", flat=True))


def bulk_run(*, bulk_id: int) -> BulkAction:
    """Carry out a bulk action from where it stopped; a no-op once finished.

    Each chunk holds the bulk row's lock, so two runs of one action (a job delivered
    twice) take turns and never act on a case twice.
    """
    while True:
        with transaction.atomic():
            bulk = BulkAction.objects.select_for_update().select_related("project").get(pk=bulk_id)
            position = bulk.done + bulk.skipped
            if position >= bulk.total:
                if bulk.finished is None:
                    bulk.finished = timezone.now()
                    bulk.save(update_fields=["finished"])
                    if bulk.verb == BulkVerb.ASSIGN:
                        notifications.bulk_assigned(bulk)
                return bulk
            chunk = bulk.case_ids[position : position + BULK_CHUNK]
            found = Case.objects.filter(project=bulk.project, pk__in=chunk, closed=None)
            cases = {c.pk: c for c in found}
            for case_id in chunk:
                case = cases.get(case_id)
                if case is not None and _bulk_one(bulk, case):
                    bulk.done += 1
                else:
                    bulk.skipped += 1
            bulk.save(update_fields=["done", "skipped"])
