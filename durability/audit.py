"""The audit trail: append-only, hash-chained per project."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from durability.models import AuditEntry, Case, Effect, Project

GENESIS = "0" * 64


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
    """Entries gathered during one transaction and appended to the chain at its end.

    Appending locks the project's chain head (FOR NO KEY UPDATE, so inserts that
    reference the project are not blocked); doing it last keeps that lock short.
    """

    project_id: int
    actor: str
    entries: list[AuditEntry] = field(default_factory=list)

    def add(
        self,
        action: str,
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
        head = (
            Project.objects.select_for_update(no_key=True)
            .only("audit_seq", "audit_head")
            .get(pk=self.project_id)
        )
        seq, prev = head.audit_seq, head.audit_head
        now = timezone.now()
        for entry in self.entries:
            seq += 1
            entry.seq, entry.at, entry.prev_hash = seq, now, prev
            # Foreign keys are hashed by id: make sure they are set from the objects.
            entry.effect_id = entry.effect.pk if entry.effect else None
            entry.case_id = entry.case.pk if entry.case else None
            entry.hash = prev = entry_hash(entry)
        AuditEntry.objects.bulk_create(self.entries)
        Project.objects.filter(pk=self.project_id).update(audit_seq=seq, audit_head=prev)
        self.entries = []


def first_broken_entry(project: Project) -> AuditEntry | None:
    """The first entry whose hash or link does not verify, or None if the chain holds."""
    prev, expected_seq = GENESIS, 1
    for entry in AuditEntry.objects.filter(project=project).order_by("seq").iterator(2000):
        if entry.seq != expected_seq or entry.prev_hash != prev or entry_hash(entry) != entry.hash:
            return entry
        prev, expected_seq = entry.hash, expected_seq + 1
    return None
