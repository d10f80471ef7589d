"""Cases: opening one (or adding to the open one of the same reason) and closing one.

The one place a case is opened or closed; each runs in the caller's transaction and
appends to the caller's trail, after the caller locked the case's effect. A new case
joins its group of similar cases (`group_key_of`), which the grouped queue shows as one row.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.utils import timezone

from durability.audit import Trail
from durability.models import AuditAction, Case, Effect, Reason, Receipt, Resolution, Severity

# What changes from one occurrence of an error to the next (quoted values, ids, numbers),
# left out of its cause as an error tracker leaves it out of an issue's fingerprint.
_VARYING = re.compile(
    r"""'[^']*'|"[^"]*"|\b(?=\w*\d)[0-9a-z_.:-]{6,}\b|\d+""",
    re.IGNORECASE,
)
# The detail a case is opened with that names its cause, most telling first: the
# failure's error, how an uncertain case came about, the grant rule or rules, what drifted
# or differed, the audit policy that let an ungranted effect proceed.
_CAUSES = ("error", "cause", "rule", "rules", "changes", "differs", "policy")


def cause_of(detail: dict[str, Any], receipt: Receipt | None = None) -> str:
    """What caused a case, in words that repeat from one occurrence to the next."""
    for name in _CAUSES:
        value = detail.get(name)
        if isinstance(value, dict | list):
            return f"{name}: {', '.join(sorted(str(v) for v in value))}"
        if value:
            text = " ".join(_VARYING.sub("…", str(value)).lower().split())
            return f"{name}: {text[:200]}"
    if receipt is not None and detail.get("key"):
        return f"system: {receipt.system}"  # an orphan receipt: the system that sent it
    return ""


def group_key_of(
    reason: str,
    names: dict[str, str],
    grant_id: int | None,
    detail: dict[str, Any],
    receipt: Receipt | None = None,
) -> str:
    """The fingerprint of a case's group: its reason, its effect's kind and target, the
    agent and workflow that made it, the grant it ran under and its cause (`cause_of`).
    Never the key, the run or the time: cases that differ only in those are the same
    problem again."""
    parts = [
        reason,
        names.get("kind", ""),
        names.get("target", ""),
        names.get("agent", ""),
        names.get("workflow", ""),
        str(grant_id or ""),
        cause_of(detail, receipt),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def open_case_of(effect: Effect, reason: Reason) -> Case | None:
    """The effect's open case of this reason; there is at most one (a unique index), found
    without `.first()`'s ORDER BY id, which could lead the planner away from that index."""
    try:
        case = Case.objects.get(
            project_id=effect.project_id, effect=effect, reason=reason, closed=None
        )
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
            told: dict[str, Any] = {}
            if severity > case.severity:
                # The story tells the raise and what caused it (`story.Moment.raised`).
                told["raised"] = [Severity(case.severity).label, Severity(severity).label]
                told["because"] = (
                    "a receipt shows the effect happened" if receipt is not None else summary
                )
                case.severity = severity
            case.version += 1
            case.save(update_fields=["detail", "severity", "version"])
            trail.add(
                AuditAction.CASE_REPEATED, effect=effect, case=case, reason=reason.value, **told
            )
            return case
    names = effect.case_names() if effect else {}
    grant_id = effect.grant_id if effect else None
    case = Case.objects.create(
        project_id=trail.project_id,
        effect=effect,
        receipt=receipt,
        reason=reason,
        severity=severity,
        summary=summary,
        detail=detail,
        group_key=group_key_of(reason, names, grant_id, detail, receipt),
        **names,
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
    Resolution.objects.create(
        project_id=case.project_id, case=case, actor=trail.actor, action=action, note=note
    )
    trail.add(AuditAction.CASE_CLOSED, effect=case.effect, case=case, action=action, note=note)
