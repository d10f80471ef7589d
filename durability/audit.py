"""The audit trail: append-only, hash-chained per project."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from durability.models import (
    KEYS_VERSION_SQLITE_TRIGGERS,
    AuditAction,
    AuditEntry,
    Case,
    Effect,
    Project,
)

GENESIS = "0" * 64

SQLITE_TRIGGERS = [
    """CREATE TRIGGER IF NOT EXISTS durability_audit_no_update
       BEFORE UPDATE ON durability_auditentry
       BEGIN SELECT RAISE(ABORT, 'durability_auditentry is append-only: UPDATE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS durability_audit_no_delete
       BEFORE DELETE ON durability_auditentry
       BEGIN SELECT RAISE(ABORT, 'durability_auditentry is append-only: DELETE refused'); END""",
]


def sqlite_triggers_ensure(using: str = "default", **kwargs: Any) -> None:
    """Re-create the triggers on SQLite after migrations: the audit's append-only ones and
    the keys version's bumps (`KeysVersion`).

    SQLite alters a table by rebuilding it, which drops its triggers; PostgreSQL keeps
    those that migrations 0002 and 0015 created.
    """
    connection = connections[using]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            for statement in SQLITE_TRIGGERS + KEYS_VERSION_SQLITE_TRIGGERS:
                cursor.execute(statement)


def entry_hash(entry: AuditEntry) -> str:
    """SHA-256 over the previous hash and the canonical JSON of the entry's content."""
    content = {
        "seq": entry.seq,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "action": entry.action,
        "effect": entry.effect_id,
        "case": entry.case_id,
        "from": entry.from_state,
        "to": entry.to_state,
        "data": entry.data,
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256((entry.prev_hash + canonical).encode()).hexdigest()


@dataclass
class Trail:
    """Entries gathered during one transaction and appended to their chains at its end.

    An entry about an effect extends that effect's chain, under the effect's row lock
    (which the state machine already holds); an entry about no effect extends the
    project's chain, under the project's row lock (FOR NO KEY UPDATE, so inserts that
    reference the project are not blocked).
    """

    project_id: int
    actor: str
    entries: list[AuditEntry] = field(default_factory=list)

    def add(
        self,
        action: AuditAction,
        /,
        *,
        effect: Effect | None = None,
        case: Case | None = None,
        from_state: str = "",
        to_state: str = "",
        **data: Any,
    ) -> None:
        self.entries.append(
            AuditEntry(
                project_id=self.project_id,
                actor=self.actor,
                action=action,
                effect=effect,
                case=case,
                from_state=from_state,
                to_state=to_state,
                data=data,
            )
        )

    def append(self) -> None:
        if not self.entries:
            return
        assert transaction.get_connection().in_atomic_block, "audit must share the transaction"
        now = timezone.now()
        chains: dict[int | None, list[AuditEntry]] = {}
        for entry in self.entries:
            # Foreign keys are hashed by id: take them from the objects, saved by now.
            entry.effect_id = entry.effect.pk if entry.effect else None
            entry.case_id = entry.case.pk if entry.case else None
            entry.at = now
            chains.setdefault(entry.effect_id, []).append(entry)
        for effect_id, entries in chains.items():
            if effect_id is None:
                self._extend(Project.objects, self.project_id, entries)
            else:
                self._extend(Effect.objects, effect_id, entries)
        AuditEntry.objects.bulk_create(self.entries)
        self.entries = []

    @staticmethod
    def _extend(manager: Any, pk: int, entries: list[AuditEntry]) -> None:
        """Chain `entries` after the head stored on row `pk`, and move the head."""
        head = manager.select_for_update(no_key=True).only("audit_seq", "audit_head").get(pk=pk)
        seq, prev = head.audit_seq, head.audit_head
        for entry in entries:
            seq += 1
            entry.seq, entry.prev_hash = seq, prev
            entry.hash = prev = entry_hash(entry)
        manager.filter(pk=pk).update(audit_seq=seq, audit_head=prev)


@contextmanager
def trail(project: Project | int, actor: str) -> Iterator[Trail]:
    """One audited change: a transaction whose gathered entries are appended on a clean exit.

    An exception rolls the transaction back and appends nothing. Inside a caller's
    transaction this is a savepoint, and the entries still commit with the caller's.
    """
    gathered = Trail(project.pk if isinstance(project, Project) else project, actor)
    with transaction.atomic():
        yield gathered
        gathered.append()


def _first_broken_in_chain(entries: Iterable[AuditEntry], head: str | None) -> AuditEntry | None:
    prev, expected_seq, last = GENESIS, 1, None
    for entry in entries:
        if entry.seq != expected_seq or entry.prev_hash != prev or entry_hash(entry) != entry.hash:
            return entry
        prev, expected_seq, last = entry.hash, expected_seq + 1, entry
    # A chain that stops short of the head its row records has lost its tail.
    return last if head != prev else None


def first_broken_entry(project: Project) -> AuditEntry | None:
    """The earliest entry whose hash or link does not verify, or None if every chain holds.

    Walks each chain (one per effect, one for the project) in order and checks that it
    ends at the head its effect or project records.
    """
    heads: dict[int | None, str] = dict(
        Effect.objects.filter(project=project).values_list("pk", "audit_head")
    )
    # From the row, not the instance: the caller's copy may predate the latest appends.
    heads[None] = Project.objects.values_list("audit_head", flat=True).get(pk=project.pk)
    entries = AuditEntry.objects.filter(project=project).order_by("effect_id", "seq")
    broken = [
        entry
        for effect_id, chain in groupby(entries.iterator(2000), key=lambda e: e.effect_id)
        if (entry := _first_broken_in_chain(chain, heads.get(effect_id))) is not None
    ]
    return min(broken, key=lambda e: e.pk) if broken else None
