"""Cases: opening one (or adding to the open one of the same reason) and closing one.

The one place a case is opened or closed; each runs in the caller's transaction and
appends to the caller's trail, after the caller locked the case's effect.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from durability.audit import Trail
from durability.models import AuditAction, Case, Effect, Reason, Receipt, Resolution, Severity


def open_case_of(effect: Effect, reason: Reason) -> Case | None:
    """The effect's open case of this reason; there is at most one (a unique index), found
    without `.first()`'s ORDER BY id, which could lead the planner away from that index."""
    try:
        case = Case.objects.get(effect=effect, reason=reason, closed=None)
    except Case.DoesNotExist:
        return None
    case.effect = effect  # the caller's (locked) instance, not a second read of it
    return case


def case_open(
    effect: Effect | None,
    reason: Reason,
    severity: Severity,
    summary: str,
    trail: Trail,
    *,
    receipt: Receipt | None = None,
    **detail: Any,
) -> Case:
    """Open a case in the trail's project, or add to the open case of the same reason on
    the same effect."""
    if effect is not None:
        case = open_case_of(effect, reason)
        if case is not None:
            case.detail.setdefault("repeats", []).append(detail)
            case.severity = max(case.severity, severity)
            case.version += 1
            case.save(update_fields=["detail", "severity", "version"])
            trail.add(AuditAction.CASE_REPEATED, effect=effect, case=case, reason=reason.value)
            return case
    case = Case.objects.create(
        project_id=trail.project_id,
        effect=effect,
        receipt=receipt,
        reason=reason,
        severity=severity,
        summary=summary,
        detail=detail,
        **(effect.case_names() if effect else {}),
    )
    trail.add(AuditAction.CASE_OPENED, effect=effect, case=case, reason=reason.value)
    return case


def uncertain_case_open(effect: Effect, summary: str, trail: Trail, **detail: Any) -> Case:
    """The effect's current attempt may or may not have happened: a person or a reconciler
    must find out."""
    attempt = effect.attempt_count
    return case_open(
        effect, Reason.UNCERTAIN, Severity.HIGH, summary, trail, attempt=attempt, **detail
    )


def case_close(case: Case, action: str, note: str, trail: Trail) -> None:
    """Close a case with its (immutable) resolution, in the caller's transaction and trail."""
    case.closed = timezone.now()
    case.version += 1
    case.save(update_fields=["closed", "version"])
    Resolution.objects.create(case=case, actor=trail.actor, action=action, note=note)
    trail.add(AuditAction.CASE_CLOSED, effect=case.effect, case=case, action=action, note=note)
