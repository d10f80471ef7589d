"""The effect state machine: the table of allowed transitions and the one function that applies it.

`apply` is the only writer of `Effect.state`, for a new effect (the rows from None) as for a
recorded one. The ledger's services lock the effect row first (the helpers below, which the
trail then holds), then apply at most the transitions the table allows; the trail writes
the row, its audit entries and the rest of the transaction's rows together at its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from functools import cache
from typing import Any

from django.db import connection, models
from django.utils import timezone

from durability import rows
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
    """Move a locked effect along the table, or record a new one (its key drawn under the
    key's lock), and audit the move; the trail writes the row at its end."""
    # A new effect is written at the trail's end; once recorded here, the trail holds it.
    recorded = not effect._state.adding or trail.held.get(effect.pk) is effect
    current = State(effect.state) if recorded else None
    target = TRANSITIONS.get((current, event))
    if target is None:
        raise IllegalTransition(effect, event)
    effect.state = target
    effect.updated = timezone.now()
    trail.stage(effect, *EFFECT_MUTABLE_FIELDS)
    if current is None:
        trail.hold(effect)
    trail.add(AuditAction(event), effect=effect, from_state=current or "", to_state=target, **data)


# -- locks: every service takes the effect's row lock before it reads the effect ----------


def _effect_sql(where: str, beside: Sequence[Beside] = ()) -> str:
    """One effect (`e`) by a unique lookup, locked, with a row of each `beside` it. No
    ORDER BY ... LIMIT 1: with it the planner may walk the project's (project, id) index
    for a key that does not exist yet instead of the unique index."""
    return _effect_sql_written(where, tuple(beside), connection.vendor)


@cache
def _effect_sql_written(where: str, beside: tuple[Beside, ...], vendor: str) -> str:
    """`_effect_sql`'s text, written once per process for each lookup and vendor."""
    lock = " FOR UPDATE OF e" if connection.features.has_select_for_update else ""
    names = [rows.names_sql(Effect, "e")]
    joins = []
    for n, (model, rest) in enumerate(beside):
        names.append(rows.names_sql(model, f"b{n}"))
        table = model._meta.db_table
        if vendor == "postgresql":
            select = rows.select_sql(model)
            joins.append(f" LEFT JOIN LATERAL ({select} {rest}) b{n} ON true")
        else:  # SQLite has no LATERAL: the row by its key, found by the same subquery
            joins.append(
                f' LEFT JOIN "{table}" b{n} ON b{n}.id = (SELECT id FROM "{table}" {rest})'
            )
    return (
        f'SELECT {", ".join(names)} FROM "durability_effect" e{"".join(joins)} '
        f"WHERE e.project_id = %s AND e.{where}{lock}"
    )


# A row read with the key's effect, in the same statement: (its model, the rest of a
# `SELECT ... FROM <its table>` that finds at most one row for the effect `e`).
type Beside = tuple[type[models.Model], str]


class KeyLock:
    """What a service reads under one key's lock, in one round trip: a lock on the key
    itself, the key's effect locked (with the rows `beside` it), and whatever the service
    `add`s after them.

    Writers of a key are serialised on a transaction-level advisory lock whether or not it
    has an effect row yet, so an intent adopts every receipt committed before it, a receipt
    finds the effect of every intent committed before it, and a new effect's row is
    inserted by one writer only. SQLite runs one writer at a time anyway.

    A row read beside the effect is read in the statement's snapshot: if the effect's row
    was locked by a writer that does not take the key's lock (an operator's verdict), the
    effect is the one that writer committed but that row may predate it.
    """

    def __init__(self, project: Project, key: str, beside: Sequence[Beside] = ()) -> None:
        self.project, self.key = project, key
        self.batch = rows.Batch()
        if connection.vendor == "postgresql":
            self.batch.add(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))",
                [key, project.pk],
                carrier=True,
            )
        self._beside = [model for model, _ in beside]
        self._effect = self.batch.add(_effect_sql("key = %s", beside), [project.pk, key])
        self.found: list[models.Model | None] = [None] * len(beside)

    def add(self, sql: str, params: list[Any]) -> rows.Result:
        return self.batch.add(sql, params)

    def key_drawn_if_new(self) -> rows.Result:
        """A fresh effect key, drawn only when the key has no effect (after the lock)."""
        return self.batch.add(
            f"{rows.next_id_sql(Effect)} WHERE NOT EXISTS (SELECT 1 FROM durability_effect "
            "WHERE project_id = %s AND key = %s)",
            [self.project.pk, self.key],
        )

    def run(self, trail: Trail) -> Effect | None:
        """Send the reads; the key's effect, locked and held by the trail, or None. The rows
        beside it are then in `found`, in their order (None where there is none)."""
        self.batch.run()
        row = self._effect.one()
        if row is None:
            return None
        at = len(rows.columns(Effect))
        for n, model in enumerate(self._beside):
            width = len(rows.columns(model))
            part = row[at : at + width]
            # The primary key leads every select list: NULL when the join found no row.
            self.found[n] = rows.hydrate(model, part) if part[0] is not None else None
            at += width
        return _held(self.project, row[: len(rows.columns(Effect))], trail)


def _held(project: Project, row: Any, trail: Trail | None) -> Effect | None:
    """The locked effect of `row` (None: no row), which the trail then holds."""
    if row is None:
        return None
    effect = rows.hydrate(Effect, row)
    effect.project = project
    if trail is not None:
        trail.hold(effect)
    return effect


def _locked(project: Project, where: str, value: Any, trail: Trail | None) -> Effect | None:
    batch = rows.Batch()
    found = batch.add(_effect_sql(where), [project.pk, value])
    batch.run()
    return _held(project, found.one(), trail)


def locked(project: Project, key: str, trail: Trail | None = None) -> Effect:
    effect = _locked(project, "key = %s", key, trail)
    if effect is None:
        raise UnknownEffect(key)
    return effect


def locked_by_id(project: Project, effect_id: int, trail: Trail | None = None) -> Effect:
    effect = _locked(project, "id = %s", effect_id, trail)
    if effect is None:
        raise UnknownEffect(str(effect_id))
    return effect
