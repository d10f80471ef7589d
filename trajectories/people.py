"""What a run waits on, and what people and reconcilers did to its effects: read from the
ledger's rows (approvals, cases, audit entries) through the run's effect links, so a run
page tells time spent waiting on a person from time spent working."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.urls import reverse

from durability.models import (
    Approval,
    ApprovalStatus,
    AuditAction,
    AuditEntry,
    Case,
    Reason,
    action_label,
)
from trajectories.models import Run, RunStatus

# The moments of a run's effects shown on its timeline: approvals, people's verdicts and
# the reconcilers' probes (the agent's own intents and receipts are its spans already).
EVENTS = [
    AuditAction.REQUIRE_APPROVAL,
    AuditAction.APPROVAL_SIGNED,
    AuditAction.APPROVE,
    AuditAction.DENY,
    AuditAction.CASE_OPENED,
    AuditAction.CASE_CLOSED,
    AuditAction.ATTEST_HAPPENED,
    AuditAction.ATTEST_NOT_HAPPENED,
    AuditAction.COMPENSATE,
    AuditAction.ABANDON,
    AuditAction.PROBE,
    AuditAction.PROBE_FOUND,
    AuditAction.PROBE_NOT_FOUND,
]
# A run shows at most this many of them, the latest.
MAX_EVENTS = 200


@dataclass(frozen=True)
class Wait:
    """A person a running run waits on: an open approval, else an open case."""

    what: str  # "approval" or "case"
    pk: int

    @property
    def url(self) -> str:
        return reverse(self.what, args=[self.pk])  # the "approval" and "case" pages


@dataclass(frozen=True)
class Event:
    at: datetime
    label: str
    actor: str
    effect_key: str
    effect_url: str
    case_id: int | None


def waits_of(project_id: int, runs: list[Run]) -> dict[int, Wait]:
    """What each running run of `runs` waits on, by run pk: two queries at most, whatever
    the number of runs or effects."""
    running = [r.pk for r in runs if r.status == RunStatus.RUNNING]
    if not running:
        return {}
    waits: dict[int, Wait] = {}
    approvals = (
        Approval.objects.filter(
            project_id=project_id, status=ApprovalStatus.OPEN, effect__link__run__in=running
        )
        .order_by("created", "pk")
        .values_list("effect__link__run", "pk")
    )
    for run_pk, pk in approvals:
        waits.setdefault(int(run_pk), Wait("approval", pk))
    cases = (
        Case.objects.filter(project_id=project_id, closed=None, effect__link__run__in=running)
        .exclude(reason=Reason.APPROVAL_REQUIRED)
        .order_by("opened", "pk")
        .values_list("effect__link__run", "pk")
    )
    for run_pk, pk in cases:
        waits.setdefault(int(run_pk), Wait("case", pk))
    return waits


def events_of(run: Run) -> list[Event]:
    """The approvals, verdicts and probes of the run's effects, oldest first: one query."""
    entries = (
        AuditEntry.objects.filter(
            project_id=run.project_id, effect__link__run=run, action__in=EVENTS
        )
        .select_related("effect")
        .only("at", "action", "actor", "case_id", "data", "effect__key", "effect__project_id")
        .order_by("-id")[:MAX_EVENTS]
    )
    return [
        Event(
            at=e.at,
            label=_label(e.action, e.data),
            actor=e.actor,
            effect_key=e.effect.key if e.effect else "",
            effect_url=e.effect.get_absolute_url() if e.effect else "",
            case_id=e.case_id,
        )
        for e in reversed(entries)
    ]


def _label(action: str, data: Any) -> str:
    label = action_label(action)
    if isinstance(data, dict):
        if action == AuditAction.APPROVAL_SIGNED and isinstance(data.get("verdict"), str):
            return f"{label}: {data['verdict']}"
        if action in (AuditAction.CASE_OPENED, AuditAction.CASE_CLOSED):
            said = data.get("reason") or data.get("action")
            if isinstance(said, str) and said:
                return f"{label}: {said}"
    return label
