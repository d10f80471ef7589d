"""The effect state machine: the table of allowed transitions and the one function that applies it.

`apply` is the only writer of `Effect.state`, for a new effect (the rows from None) as for a
recorded one. The ledger's services lock the effect row first (the helpers below), then
apply at most the transitions the table allows, in the transaction of their audit trail.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.db import transaction
from django.utils import timezone

from durability.audit import Trail
from durability.models import AuditAction, Effect, Project, State


class Event(StrEnum):
    INTENT = "intent"
    RETRY = "retry"
    RECEIPT = "receipt"
    FAILURE = "failure"  # definitive: the provider said nothing happened
    TIMEOUT = "timeout"  # reported by the agent, or an uncertain failure
    DEADLINE = "deadline"  # the sweep found the deadline passed
    INTERRUPTION = "interruption"  # the same run resumed in a new process
    PROBE_FOUND = "probe_found"
    PROBE_NOT_FOUND = "probe_not_found"  # a reconciler's absence, trusted after its grace period
    ATTEST_HAPPENED = "attest_happened"
    ATTEST_NOT_HAPPENED = "attest_not_happened"
    COMPENSATE = "compensate"
    ABANDON = "abandon"
    REQUIRE_APPROVAL = "require_approval"
    REFUSE = "refuse"
    APPROVE = "approve"
    DENY = "deny"


S = State
# (from state, event) -> to state. None is an effect not yet recorded.
TRANSITIONS: dict[tuple[State | None, Event], State] = {
    (None, Event.INTENT): S.PENDING,
    (None, Event.REQUIRE_APPROVAL): S.AWAITING_APPROVAL,
    (None, Event.REFUSE): S.DENIED,
    (S.AWAITING_APPROVAL, Event.APPROVE): S.PENDING,
    (S.AWAITING_APPROVAL, Event.DENY): S.DENIED,
    (S.PENDING, Event.RECEIPT): S.SUCCEEDED,
    (S.PENDING, Event.FAILURE): S.FAILED,
    (S.PENDING, Event.TIMEOUT): S.TIMED_OUT,
    (S.PENDING, Event.DEADLINE): S.TIMED_OUT,
    (S.PENDING, Event.INTERRUPTION): S.TIMED_OUT,
    # Evidence after the effect was given up on: a late success.
    (S.TIMED_OUT, Event.RECEIPT): S.SUCCEEDED,
    (S.FAILED, Event.RECEIPT): S.SUCCEEDED,
    (S.NOT_HAPPENED, Event.RECEIPT): S.SUCCEEDED,
    (S.ABANDONED, Event.RECEIPT): S.SUCCEEDED,
    (S.TIMED_OUT, Event.PROBE_FOUND): S.SUCCEEDED,
    (S.TIMED_OUT, Event.ATTEST_HAPPENED): S.SUCCEEDED,
    (S.TIMED_OUT, Event.ATTEST_NOT_HAPPENED): S.NOT_HAPPENED,
    (S.TIMED_OUT, Event.PROBE_NOT_FOUND): S.NOT_HAPPENED,
    # A new attempt where a retry is safe.
    (S.TIMED_OUT, Event.RETRY): S.PENDING,
    (S.FAILED, Event.RETRY): S.PENDING,
    (S.NOT_HAPPENED, Event.RETRY): S.PENDING,
    (S.SUCCEEDED, Event.COMPENSATE): S.COMPENSATED,
    (S.TIMED_OUT, Event.COMPENSATE): S.COMPENSATED,
    (S.SUCCEEDED, Event.ABANDON): S.ABANDONED,
    (S.TIMED_OUT, Event.ABANDON): S.ABANDONED,
}

# What a transition may change on an effect row.
EFFECT_MUTABLE_FIELDS = [
    "state",
    "updated",
    "late",
    "deadline",
    "attempt_count",
    "run_id",
    "tool_call_id",
    "trace_id",
    "span_id",
    "agent",
    "workflow",
]


class IllegalTransition(Exception):
    def __init__(self, effect: Effect, event: Event) -> None:
        self.effect, self.event = effect, event
        super().__init__(
            f"effect {effect.key!r} is {effect.state}; {event.value} is not allowed from there"
        )


class UnknownEffect(Exception):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no effect has the key {key!r} in this project")


def can(state: State | None, event: Event) -> bool:
    return (state, event) in TRANSITIONS


def apply(effect: Effect, event: Event, trail: Trail, **data: Any) -> None:
    """Move a locked effect along the table, or record an unsaved one, and audit the move.

    A new effect is inserted in a savepoint: an IntegrityError (another intent recorded
    the key first) leaves the caller's transaction and the trail as they were.
    """
    current = State(effect.state) if effect.pk else None
    target = TRANSITIONS.get((current, event))
    if target is None:
        raise IllegalTransition(effect, event)
    effect.state = target
    effect.updated = timezone.now()
    if current is None:
        with transaction.atomic():
            effect.save(force_insert=True)
    else:
        effect.save(update_fields=EFFECT_MUTABLE_FIELDS)
    trail.add(AuditAction(event), effect=effect, from_state=current or "", to_state=target, **data)


# -- locks: every service takes the effect's row lock before it reads the effect ----------


def _locked(project: Project, **unique: Any) -> Effect | None:
    """The effect of a unique lookup, locked, or None.

    No ORDER BY ... LIMIT 1 (`.first()`): with it the planner may walk the project's
    (project, id) index for a key that does not exist yet instead of the unique index.
    """
    try:
        return Effect.objects.select_for_update().get(project=project, **unique)
    except Effect.DoesNotExist:
        return None


def locked(project: Project, key: str) -> Effect:
    effect = _locked(project, key=key)
    if effect is None:
        raise UnknownEffect(key)
    return effect


def locked_by_id(project: Project, effect_id: int) -> Effect:
    effect = _locked(project, pk=effect_id)
    if effect is None:
        raise UnknownEffect(str(effect_id))
    return effect


def locked_or_key_locked(project: Project, key: str) -> Effect | None:
    """The effect with this key, locked; or, while it has none, a lock on the key itself.

    Writers of a key without an effect row are serialised on a transaction-level advisory
    lock, so an intent adopts every receipt committed before it and a receipt finds the
    effect of every intent committed before it. SQLite runs one writer at a time anyway.
    """
    effect = _locked(project, key=key)
    connection = transaction.get_connection()
    if effect is not None or connection.vendor != "postgresql":
        return effect
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))", [key, project.pk])
    return _locked(project, key=key)
