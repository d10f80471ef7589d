"""The audit trail: append-only, hash-chained per project."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from durability import rows
from durability.models import (
    KEYS_VERSION_SQLITE_TRIGGERS,
    AuditAction,
    AuditEntry,
    Case,
    Effect,
    Project,
)

GENESIS = "0" * 64

# SQLite has no setting a trigger could read: its update trigger lets through the one shape
# of update that retention's pruning makes (durability.retention.services.audit_entries_prune,
# PostgreSQL's durability_audit_prune): data emptied, kept digest, pruned time set, nothing
# else changed, and only of an effect's failure or timeout entry (PRUNABLE_ACTIONS). Any
# other UPDATE is refused, and every DELETE but of a project being deleted's entries
# (durability.retention.projects; PostgreSQL's durability_audit_delete).
SQLITE_TRIGGERS = [
    "DROP TRIGGER IF EXISTS durability_audit_no_update",
    "DROP TRIGGER IF EXISTS durability_audit_no_update_but_prune",
    """CREATE TRIGGER IF NOT EXISTS durability_audit_no_update_but_prune_attempts
       BEFORE UPDATE ON durability_auditentry
       WHEN NOT (
           OLD.action IN ('failure', 'timeout') AND OLD.effect_id IS NOT NULL
           AND OLD.pruned IS NULL AND NEW.pruned IS NOT NULL
           AND OLD.data_digest <> '' AND NEW.data = '{}'
           AND NEW.id IS OLD.id AND NEW.project_id IS OLD.project_id AND NEW.seq IS OLD.seq
           AND NEW.at IS OLD.at AND NEW.actor IS OLD.actor AND NEW.action IS OLD.action
           AND NEW.effect_id IS OLD.effect_id AND NEW.case_id IS OLD.case_id
           AND NEW.from_state IS OLD.from_state AND NEW.to_state IS OLD.to_state
           AND NEW.data_digest IS OLD.data_digest AND NEW.prev_hash IS OLD.prev_hash
           AND NEW.hash IS OLD.hash
       )
       BEGIN SELECT RAISE(ABORT, 'durability_auditentry is append-only: UPDATE refused'); END""",
    "DROP TRIGGER IF EXISTS durability_audit_no_delete",
    """CREATE TRIGGER IF NOT EXISTS durability_audit_no_delete_but_deleting_project
       BEFORE DELETE ON durability_auditentry
       WHEN NOT EXISTS (
           SELECT 1 FROM durability_project
           WHERE id = OLD.project_id AND deleting IS NOT NULL
       )
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


# json.dumps with these arguments would build this encoder afresh on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def _canonical(value: Any) -> str:
    return _CANONICAL.encode(value)


def data_digest(data: Any) -> str:
    """SHA-256 of an entry's data as canonical JSON: what its hash covers in its place."""
    return hashlib.sha256(_canonical(data).encode()).hexdigest()


def entry_hash(entry: AuditEntry) -> str:
    """SHA-256 over the previous hash and the canonical JSON of the entry's content.

    The content names the data by its digest (`data_digest`), so that an entry whose data
    retention removed verifies from the digest it kept; an entry written before digests
    (`data_digest` empty) is hashed over its whole data, and cannot be pruned.
    """
    content = {
        "seq": entry.seq,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "action": entry.action,
        "effect": entry.effect_id,
        "case": entry.case_id,
        "from": entry.from_state,
        "to": entry.to_state,
    }
    if entry.data_digest:
        content["data_digest"] = entry.data_digest
    else:
        content["data"] = entry.data
    return hashlib.sha256((entry.prev_hash + _canonical(content)).encode()).hexdigest()


def entry_holds(entry: AuditEntry) -> bool:
    """The entry's data is the one its digest names, or, pruned, gone with the digest kept."""
    if entry.pruned is not None:
        return bool(entry.data_digest) and entry.data == {}
    return not entry.data_digest or entry.data_digest == data_digest(entry.data)


@dataclass
class Trail:
    """One transaction's writes and audit entries, sent together at its end.

    An entry about an effect extends that effect's chain. The ledger's services lock the
    effect row first and `hold` it: its head is then the one in hand, moved with the row's
    other changes. An entry about an effect not held (or about none) extends the chain
    after the head read under the effect's (or the project's) row lock, FOR NO KEY UPDATE
    so inserts that reference it are not blocked.

    Rows `stage`d here are written once, with their final values, after the entries are
    chained: on PostgreSQL in one pipeline with the COMMIT, so the writes of an intent or a
    receipt cost one round trip (`durability.rows`).
    """

    project_id: int
    actor: str
    entries: list[AuditEntry] = field(default_factory=list)
    writes: rows.Writes = field(default_factory=rows.Writes)
    held: dict[int, Effect] = field(default_factory=dict)

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
            rows.new(
                AuditEntry,
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

    def hold(self, effect: Effect) -> None:
        """The effect's row is locked by this transaction (or new in it, with a key drawn):
        its chain head is the one in hand."""
        assert effect.pk is not None
        self.held[effect.pk] = effect

    def stage(self, row: Any, *fields: str) -> None:
        """Write `row` at the end: insert it if it was never saved, else update `fields`."""
        self.writes.stage(row, *fields)

    def append(self, *, commit: bool = False) -> None:
        """Chain the entries and send every staged write; with `commit` (the trail's own
        transaction, on PostgreSQL) the COMMIT goes in the same pipeline, so that the
        writes and the commit are one round trip, and Django's commit after it finds the
        transaction already closed."""
        assert transaction.get_connection().in_atomic_block, "audit must share the transaction"
        if self.entries:
            self._chain()
        self.writes.send(commit=commit)

    def _chain(self) -> None:
        now = timezone.now()
        chains: dict[int | None, list[AuditEntry]] = {}
        for entry in self.entries:
            # Foreign keys are hashed by id: take them from the objects, keyed by now.
            entry.effect_id = entry.effect.pk if entry.effect else None
            entry.case_id = entry.case.pk if entry.case else None
            entry.at = now
            chains.setdefault(entry.effect_id, []).append(entry)
        for effect_id, entries in chains.items():
            if effect_id is None:
                self._extend(Project.objects, self.project_id, entries)
            elif (effect := self.held.get(effect_id)) is not None:
                effect.audit_seq, effect.audit_head = _linked(
                    entries, effect.audit_seq, effect.audit_head
                )
                self.writes.stage(effect, "audit_seq", "audit_head")
            else:
                self._extend(Effect.objects.filter(project_id=self.project_id), effect_id, entries)
        for entry in self.entries:
            self.writes.stage(entry)
        self.entries = []

    @staticmethod
    def _extend(manager: Any, pk: int, entries: list[AuditEntry]) -> None:
        """Chain `entries` after the head stored on row `pk`, and move the head."""
        head = manager.select_for_update(no_key=True).only("audit_seq", "audit_head").get(pk=pk)
        seq, prev = _linked(entries, head.audit_seq, head.audit_head)
        manager.filter(pk=pk).update(audit_seq=seq, audit_head=prev)


def _linked(entries: list[AuditEntry], seq: int, prev: str) -> tuple[int, str]:
    """Number and hash `entries` after the head (seq, prev); the new head."""
    for entry in entries:
        seq += 1
        entry.seq, entry.prev_hash = seq, prev
        entry.data_digest = data_digest(entry.data)
        entry.hash = prev = entry_hash(entry)
    return seq, prev


@contextmanager
def trail(project: Project | int, actor: str) -> Iterator[Trail]:
    """One audited change: a transaction whose gathered entries and staged rows are
    written on a clean exit.

    An exception rolls the transaction back and writes nothing. Inside a caller's
    transaction this is a savepoint, and the writes still commit with the caller's. Its own
    transaction's BEGIN goes with its first statement, on PostgreSQL (`rows.begun_lazily`).
    """
    gathered = Trail(project.pk if isinstance(project, Project) else project, actor)
    connection = transaction.get_connection()
    own = not connection.in_atomic_block and connection.vendor == "postgresql"
    with transaction.atomic(), rows.begun_lazily() if own else nullcontext():
        yield gathered
        gathered.append(commit=own)


def first_broken_in_chain(entries: Iterable[AuditEntry], head: str | None) -> AuditEntry | None:
    """The first entry of one chain (in seq order, from its start) that does not verify, or
    its last if the chain does not end at `head`; None if it holds."""
    prev, expected_seq, last = GENESIS, 1, None
    for entry in entries:
        if (
            entry.seq != expected_seq
            or entry.prev_hash != prev
            or not entry_holds(entry)
            or entry_hash(entry) != entry.hash
        ):
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
        if (entry := first_broken_in_chain(chain, heads.get(effect_id))) is not None
    ]
    return min(broken, key=lambda e: e.pk) if broken else None
