"""Probing timed-out effects and acting on the answers: the rules of reconciliation.

`found` settles the effect as succeeded with a provider_confirmed receipt; `not_found`
settles it as not happened only once the reconciler's grace period has passed, and is
otherwise evidence for an operator; `unknown` changes nothing. `panel_context` is what the
probe panel shows, for its views and for the case page's `{% probe_panel %}` tag.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from durability import audit, inbound, redaction
from durability.accounts.roles import Access, Perm
from durability.ledger import settling
from durability.ledger.commands import ReceiptEvidence
from durability.ledger.machine import Event
from durability.models import (
    AuditAction,
    Effect,
    Probe,
    Receipt,
    ReconcilerConfig,
    State,
    Strength,
)
from durability.reconcilers.base import Answer, Found, NotFound, Unknown, reconciler_for

logger = logging.getLogger(__name__)

SCAN_ACTOR = "system:scan"
PANEL = "durability/reconcilers/_probe_panel.html"
HISTORY = 20
# How long the panel waits for a requested probe's answer before it stops polling.
WAIT_S = 60


def reconciler_config_of(effect: Effect) -> ReconcilerConfig | None:
    """The enabled reconciler of the effect's target, if its project has one."""
    return ReconcilerConfig.objects.filter(
        project_id=effect.project_id, target=effect.target, enabled=True
    ).first()


def panel_context(
    effect: Effect, access: Access | None, requested: datetime | None = None
) -> dict[str, Any]:
    """What the panel shows; `requested` is when an operator asked for a probe."""
    config = reconciler_config_of(effect)
    probes = list(
        effect.probes.filter(project_id=effect.project_id).order_by("-started", "-id")[:HISTORY]
    )
    waiting = (
        requested is not None
        and (timezone.now() - requested).total_seconds() < WAIT_S
        and not any(p.started >= requested for p in probes)
    )
    return {
        "effect": effect,
        "config": config,
        "probes": probes,
        "can_probe": bool(
            config
            and effect.state == State.TIMED_OUT
            and access is not None
            and access.can(Perm.RESOLVE)
        ),
        "waiting": waiting,
        "requested": requested.timestamp() if requested else "",
    }


def _ask(config: ReconcilerConfig, effect: Effect) -> Answer:
    """The reconciler's answer, redacted; a broken configuration or plug-in answers unknown.

    A provider's reply is text from outside like any other: its secrets go before the
    probe, its receipt, the notes or the audit entries can hold them.
    """
    answer: Answer
    try:
        answer = reconciler_for(config.kind, config.config).probe(effect)
    except Exception as exc:
        logger.exception("the %s reconciler failed on effect %s", config.kind, effect.pk)
        answer = Unknown(f"the {config.kind} reconciler failed: {exc}")
    extras = redaction.extras_of(effect.project)
    if isinstance(answer, Found):
        return replace(
            answer,
            system=redaction.distinct(
                answer.system, extras, Receipt._meta.get_field("system").max_length
            ),
            external_id=redaction.distinct(answer.external_id, extras),
            data=redaction.redact(answer.data, extras),
        )
    return replace(answer, detail=redaction.scrub_text(answer.detail, extras))


def absence_trusted_after(effect: Effect, config: ReconcilerConfig) -> datetime | None:
    """When a not_found answer about the effect's current attempt settles it, if ever.

    The grace period runs from the later of the attempt's deadline and the moment the
    effect timed out (the agent may give up before its deadline while the request is
    still in flight). While an effect is timed out, `updated` is that moment: only
    transitions write it.
    """
    if config.grace_s is None:
        return None
    attempt = effect.attempts.filter(
        project_id=effect.project_id, number=effect.attempt_count
    ).first()
    since = effect.updated
    if attempt is not None and attempt.deadline is not None:
        since = max(since, attempt.deadline)
    return since + timedelta(seconds=config.grace_s)


def effect_probe(*, effect_id: int, requested_by: str = SCAN_ACTOR) -> Probe | None:
    """Probe a timed-out effect with its target's reconciler and act on the answer.

    Returns None when there is nothing to ask: the effect is not timed out (any more)
    or its target has no enabled reconciler. The external system is asked outside any
    transaction; the answer is applied in one that locks the effect and re-checks that
    it is still the same timed-out attempt, so a probe run twice, or racing a receipt
    or an operator, records its answer and changes nothing.
    """
    effect = (
        Effect.objects.select_related("project").filter(pk=effect_id, state=State.TIMED_OUT).first()
    )
    if effect is None:
        return None
    config = reconciler_config_of(effect)
    if config is None:
        return None
    started = timezone.now()
    answer = _ask(config, effect)
    receipt: ReceiptEvidence | None = None
    if isinstance(answer, Found):
        try:
            receipt = _receipt_of(effect, answer)
        except ValueError as exc:
            answer = Unknown(f"the {config.kind} reconciler's answer cannot be recorded: {exc}")
    probe = Probe(
        project_id=effect.project_id,
        effect=effect,
        config=config,
        kind=config.kind,
        attempt=effect.attempt_count,
        requested_by=requested_by,
        started=started,
        finished=timezone.now(),
        answer=answer.answer,
        detail=answer.detail[:2000],
    )
    if isinstance(answer, Found):
        probe.evidence = {
            "system": answer.system,
            "external_id": answer.external_id,
            "observed_at": answer.observed_at.isoformat() if answer.observed_at else None,
            "data": answer.data,
        }
    with audit.trail(effect.project_id, requested_by) as trail:
        locked = Effect.objects.select_for_update().get(pk=effect.pk)
        if locked.state != State.TIMED_OUT or locked.attempt_count != effect.attempt_count:
            probe.detail += (
                f" (not applied: the effect is now {locked.state}, attempt {locked.attempt_count})"
            )
        else:
            _apply(locked, config, answer, receipt, probe)
        probe.save()
        trail.add(
            AuditAction.PROBE,
            effect=locked,
            probe=probe.pk,
            kind=config.kind,
            answer=probe.answer,
            settled=probe.settled,
        )
    return probe


def _receipt_of(effect: Effect, answer: Found) -> ReceiptEvidence:
    """The receipt a found answer is recorded as; ValueError naming the field if it cannot
    be one (a plug-in's time out of range, a text PostgreSQL cannot store): the answer is
    then unknown."""
    system = _text("system", answer.system, 100, strip=True)
    external_id = _text("external_id", answer.external_id, 255)
    observed_at = answer.observed_at
    if observed_at is not None:
        if not isinstance(observed_at, datetime):
            raise ValueError("observed_at: expected a datetime")
        try:
            observed_at = inbound.instant(observed_at)
        except ValueError as exc:
            raise ValueError(f"observed_at: {exc}") from None
    if (found := inbound.unstorable_at(answer.data)) is not None:
        raise ValueError(f"data: {found[2]}")
    try:
        json.dumps(answer.data, allow_nan=False, default=str)
    except ValueError:
        raise ValueError("data: numbers must be finite") from None
    return ReceiptEvidence(
        key=effect.key,
        system=system,
        external_id=external_id,
        observed_at=observed_at,
        data=answer.data,
    )


def _text(name: str, value: Any, longest: int, *, strip: bool = False) -> str:
    """A plug-in's text for a receipt's field: a string of 1 to `longest` characters that
    PostgreSQL can store (`system` is cut to its length, and stripped, as before)."""
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string")
    if strip:
        value = value[:longest].strip()
    if not 1 <= len(value) <= longest:
        raise ValueError(f"{name}: must have 1 to {longest} characters")
    try:
        return inbound.storable_text(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _apply(
    effect: Effect,
    config: ReconcilerConfig,
    answer: Answer,
    evidence: ReceiptEvidence | None,
    probe: Probe,
) -> None:
    """Settle the locked, still timed-out effect if the answer allows it."""
    actor = f"reconciler:{config.kind}"
    if isinstance(answer, Found):
        assert evidence is not None
        settling.effect_settle(
            project=effect.project,
            effect_id=effect.pk,
            actor=actor,
            event=Event.PROBE_FOUND,
            note=f"the {config.kind} reconciler found it: {answer.detail}",
            evidence=evidence,
        )
        probe.settled = Event.PROBE_FOUND.value
        probe.receipt = effect.receipts.filter(
            project_id=effect.project_id,
            system=evidence.system,
            external_id=evidence.external_id,
            strength=Strength.PROVIDER_CONFIRMED,
        ).first()
    elif isinstance(answer, NotFound):
        trusted = absence_trusted_after(effect, config)
        if trusted is None:
            probe.detail += "; absence is not trusted for this target: an operator decides"
        elif probe.finished < trusted:
            probe.detail += f"; absence will be trusted from {trusted:%Y-%m-%d %H:%M:%S} UTC"
        else:
            settling.effect_settle(
                project=effect.project,
                effect_id=effect.pk,
                actor=actor,
                event=Event.PROBE_NOT_FOUND,
                note=f"the {config.kind} reconciler found no trace after the "
                f"{config.grace_s}s grace period: {answer.detail}",
            )
            probe.settled = Event.PROBE_NOT_FOUND.value


def probes_due(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Ids of timed-out effects to probe: their target has an enabled reconciler, and no
    probe asked about their current attempt within the reconciler's `interval_s`.

    One query per enabled reconciler (there are few); oldest effects first.
    """
    now = now or timezone.now()
    due: list[int] = []
    for config in ReconcilerConfig.objects.filter(enabled=True).order_by("pk"):
        recent = Probe.objects.filter(
            project_id=config.project_id,
            effect=OuterRef("pk"),
            attempt=OuterRef("attempt_count"),
            started__gt=now - timedelta(seconds=config.interval_s),
        )
        due += (
            Effect.objects.filter(
                project_id=config.project_id, target=config.target, state=State.TIMED_OUT
            )
            .exclude(Exists(recent))
            .order_by("id")
            .values_list("pk", flat=True)[: limit - len(due)]
        )
        if len(due) >= limit:
            break
    return due
