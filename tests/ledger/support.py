"""Helpers for the ledger specifications: effects driven into a state, and row counts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from durability.accounts import members
from durability.api.commands import intent_of
from durability.api.schemas import IntentIn
from durability.ledger import evidence, intents, settling
from durability.ledger.commands import Failure, ReceiptEvidence, Timeout
from durability.ledger.decisions import Outcome
from durability.ledger.evidence import EffectOutcome, ReceiptOutcome
from durability.ledger.machine import Event
from durability.models import (
    AuditEntry,
    AuthorityPolicy,
    Effect,
    Grant,
    Project,
    State,
)

ACTOR = "test:agent"
OPERATOR = "user:operator"


EVERYTHING = "test: every effect"


def everything(project: Project) -> Grant:
    """The project's catch-all grant. Intents made through the helpers name it unless the
    test passes `authority` (None for none), so that specifications not about authority
    run under a grant, whatever the project's policy for intents without one."""
    live = Grant.objects.filter(project=project, name=EVERYTHING, revoked=None).first()
    return live or Grant.objects.create(
        project=project, name=EVERYTHING, kinds=["*"], targets=["*"], granted_by="test"
    )


def cases_asked(project: Project) -> None:
    """The project asks for a case per intent that names no grant (`audit_cases`)."""
    members.project_policy_set(project=project, actor=OPERATOR, policy=AuthorityPolicy.AUDIT_CASES)


def intent(project: Project, key: str = "k1", **fields: Any) -> Outcome:
    """An intent recorded by `actor` (an agent's key by default) with the body's fields."""
    actor: str = fields.pop("actor", ACTOR)
    body: dict[str, Any] = {"key": key, "kind": "payment", "target": "stripe"}
    body.setdefault("request", {"amount": 1})
    body.update(fields)
    body.setdefault("authority", {"grant": everything(project).pk})
    return intents.intent_record(project=project, actor=actor, intent=intent_of(IntentIn(**body)))


def receipt(project: Project, key: str = "k1", external_id: str = "ext-1") -> ReceiptOutcome:
    return evidence.receipt_record(
        project=project,
        actor=ACTOR,
        receipt=ReceiptEvidence(key=key, system="stripe", external_id=external_id),
    )


def failure(project: Project, key: str = "k1", *, definitive: bool) -> EffectOutcome:
    return evidence.failure_record(
        project=project,
        actor=ACTOR,
        failure=Failure(key=key, error="HTTP 502", definitive=definitive),
    )


def timeout(project: Project, key: str = "k1") -> EffectOutcome:
    return evidence.timeout_record(
        project=project, actor=ACTOR, timeout=Timeout(key=key, reason="no answer in 30s")
    )


def settle(project: Project, key: str, event: Event, *, evidence: str = "") -> EffectOutcome:
    effect = Effect.objects.get(project=project, key=key)
    return settling.effect_settle(
        project=project,
        effect_id=effect.pk,
        actor=OPERATOR,
        event=event,
        note="checked the provider's dashboard",
        evidence=ReceiptEvidence(key=key, system="stripe", external_id=evidence)
        if evidence
        else None,
    )


def needs_approval(project: Project) -> Grant:
    """A grant under which every effect waits for one person's approval."""
    return Grant.objects.get_or_create(
        project=project,
        name="test: needs approval",
        granted_by="test",
        defaults={"kinds": ["*"], "targets": ["*"], "requires_approval": True},
    )[0]


def refusing(project: Project) -> Grant:
    """A grant that covers no kind of effect: the grant check refuses every intent under it."""
    return Grant.objects.get_or_create(
        project=project,
        name="test: nothing",
        granted_by="test",
        defaults={"kinds": [], "targets": ["*"]},
    )[0]


def effect_in(project: Project, state: State, key: str = "k1", **fields: Any) -> Effect:
    """An effect brought into `state` through the services, the way an agent and operator would."""
    if state == State.AWAITING_APPROVAL:
        fields.setdefault("authority", {"grant": needs_approval(project).pk})
    elif state == State.DENIED:
        fields.setdefault("authority", {"grant": refusing(project).pk})
    intent(project, key, **fields)
    if state == State.SUCCEEDED:
        receipt(project, key)
    elif state == State.FAILED:
        failure(project, key, definitive=True)
    elif state in (State.TIMED_OUT, State.NOT_HAPPENED, State.ABANDONED):
        timeout(project, key)
        if state == State.NOT_HAPPENED:
            settle(project, key, Event.ATTEST_NOT_HAPPENED)
        elif state == State.ABANDONED:
            settle(project, key, Event.ABANDON)
    elif state == State.COMPENSATED:
        receipt(project, key)
        settle(project, key, Event.COMPENSATE)
    effect = Effect.objects.get(project=project, key=key)
    assert effect.state == state
    return effect


def row_counts() -> dict[str, int]:
    """The number of rows of every table in the database."""
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        cursor.execute(
            " UNION ALL ".join(
                f"SELECT %s, count(*) FROM {connection.ops.quote_name(t)}" for t in tables
            ),
            tables,
        )
        return dict(cursor.fetchall())


def audit_of(effect: Effect) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(effect_id=effect.pk).order_by("seq"))


def later(seconds: float) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)
