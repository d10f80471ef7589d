"""Archives: what retention would remove, written as gzip-compressed JSON Lines before
anything is removed, and verified against the audit chains of the database it came from.

One line per record: the `archive` header (format, project, `before`, when), then each
`effect` of the project last changed before `before` with its attempts, receipts and its
whole audit chain, each `project_entry` of the project's own chain from before then, the
sections of `TALLYBOOK_ARCHIVE_SECTIONS` (trajectories' runs, each with its spans), and an
`end` line with the counts. The SHA-256 of the uncompressed lines is recorded in an
`Archive` row and in the `archive_written` audit entry, so a changed file is told apart
from the one written; each archived chain must end at the hash the database holds for its
last entry, so the archive proves what the (possibly pruned) chain once held.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import models
from django.db.models import Prefetch
from django.utils import timezone
from django.utils.module_loading import import_string

from durability.audit import first_broken_in_chain, trail
from durability.models import Archive, Attempt, AuditAction, AuditEntry, Effect, Project, Receipt

FORMAT = 1
CHUNK = 500
ENTRY_FIELDS = [
    "id",
    "project_id",
    "seq",
    "at",
    "actor",
    "action",
    "effect_id",
    "case_id",
    "from_state",
    "to_state",
    "data",
    "data_digest",
    "pruned",
    "prev_hash",
    "hash",
]

Section = Callable[[Project, datetime], Iterator[dict[str, Any]]]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):  # a span's and a trace's day are dates
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def row_of(obj: models.Model) -> dict[str, Any]:
    """Every stored column of a row, by attribute name."""
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _entry_row(entry: AuditEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in ENTRY_FIELDS}


def entry_of(row: dict[str, Any]) -> AuditEntry:
    """The (unsaved) audit entry an archived row describes."""
    values = dict(row)
    for name in ("at", "pruned"):
        if values[name] is not None:
            values[name] = datetime.fromisoformat(values[name])
    return AuditEntry(**values)


def _effects(project: Project, before: datetime) -> Iterator[dict[str, Any]]:
    effects = Effect.objects.filter(project=project, updated__lt=before).order_by("id")
    after = 0
    while chunk := list(
        effects.filter(id__gt=after).prefetch_related(
            Prefetch("attempts", Attempt.objects.filter(project=project)),
            Prefetch("receipts", Receipt.objects.filter(project=project)),
        )[:CHUNK]
    ):
        after = chunk[-1].pk
        chains: dict[int, list[dict[str, Any]]] = {}
        entries = AuditEntry.objects.filter(project=project, effect_id__in=[e.pk for e in chunk])
        for entry in entries.order_by("effect_id", "seq"):
            assert entry.effect_id is not None
            chains.setdefault(entry.effect_id, []).append(_entry_row(entry))
        for effect in chunk:
            yield {
                "type": "effect",
                **row_of(effect),
                "attempts": [row_of(a) for a in effect.attempts.all()],
                "receipts": [row_of(r) for r in effect.receipts.all()],
                "audit": chains.get(effect.pk, []),
            }


def _project_entries(project: Project, before: datetime) -> Iterator[dict[str, Any]]:
    entries = AuditEntry.objects.filter(project=project, effect=None, at__lt=before)
    for entry in entries.order_by("seq").iterator(2000):
        yield {"type": "project_entry", **_entry_row(entry)}


def archive_write(
    *, project: Project, before: datetime, out: Path, actor: str, now: datetime | None = None
) -> Archive:
    """Write the project's archive of everything before `before` to `out`; record it."""
    began = now or timezone.now()
    digest = hashlib.sha256()
    counts = {"effects": 0, "entries": 0, "runs": 0, "spans": 0}

    def lines() -> Iterator[dict[str, Any]]:
        yield {
            "type": "archive",
            "format": FORMAT,
            "project": project.name,
            "project_id": project.pk,
            "before": before,
            "began": began,
        }
        for effect in _effects(project, before):
            counts["effects"] += 1
            counts["entries"] += len(effect["audit"])
            yield effect
        for entry in _project_entries(project, before):
            counts["entries"] += 1
            yield entry
        for path in settings.TALLYBOOK_ARCHIVE_SECTIONS:
            section: Section = import_string(path)
            for record in section(project, before):
                counts["runs"] += record["type"] == "run"
                counts["spans"] += len(record.get("spans", ()))
                yield record
        yield {"type": "end", **counts}

    with gzip.open(out, "wb") as file:
        for record in lines():
            line = json.dumps(record, default=_plain, separators=(",", ":")).encode() + b"\n"
            digest.update(line)
            file.write(line)
    with trail(project, actor) as t:
        archive = Archive.objects.create(
            project=project,
            before=before,
            created=began,
            actor=actor,
            path=str(out),
            sha256=digest.hexdigest(),
            **counts,
        )
        t.add(
            AuditAction.ARCHIVE_WRITTEN,
            archive=archive.pk,
            sha256=archive.sha256,
            before=before.isoformat(),
            effects=counts["effects"],
            entries=counts["entries"],
            runs=counts["runs"],
            spans=counts["spans"],
        )
    return archive


@dataclass
class Verified:
    """What `archive_verify` found: the archive it is, and every problem, in file order."""

    project: str = ""
    archive: Archive | None = None
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def archive_verify(path: Path) -> Verified:
    """Check an archive against the database: its content is the one an `archive_written`
    entry recorded, each archived chain verifies from its start, and ends at the hash the
    database holds for that entry (pruned or not)."""
    found = Verified()
    digest = hashlib.sha256()
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    seen = {"effects": 0, "entries": 0, "runs": 0, "spans": 0}
    effects: list[tuple[int, list[AuditEntry]]] = []
    project_chain: list[AuditEntry] = []
    with gzip.open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            digest.update(line)
            record = json.loads(line)
            kind = record.get("type")
            if number == 1:
                if kind != "archive" or record.get("format") != FORMAT:
                    found.problems.append("The first line is not an archive's header.")
                    return found
                header = record
            elif kind == "effect":
                seen["effects"] += 1
                seen["entries"] += len(record["audit"])
                effects.append((record["id"], [entry_of(e) for e in record["audit"]]))
            elif kind == "project_entry":
                seen["entries"] += 1
                record.pop("type")
                project_chain.append(entry_of(record))
            elif kind == "run":
                seen["runs"] += 1
                seen["spans"] += len(record.get("spans", ()))
            elif kind == "end":
                end = record
    if header is None:
        found.problems.append("The archive is empty.")
        return found
    found.project = header["project"]
    if end is None:
        found.problems.append("The archive has no end line: it was cut short.")
    elif {k: end.get(k) for k in seen} != seen:
        found.problems.append(f"The end line counts {end}, the archive holds {seen}.")
    found.counts = seen
    sha = digest.hexdigest()
    found.archive = Archive.objects.filter(project_id=header["project_id"], sha256=sha).first()
    recorded = AuditEntry.objects.filter(
        project_id=header["project_id"], action=AuditAction.ARCHIVE_WRITTEN, data__sha256=sha
    ).exists()
    if found.archive is None or not recorded:
        found.problems.append(
            f"No archive of this content (SHA-256 {sha}) was recorded for project"
            f" {header['project']!r}: the file was changed after it was written, or comes"
            " from another database."
        )
    for start in range(0, len(effects), CHUNK):
        chunk = effects[start : start + CHUNK]
        _chains_check(chunk, header["project_id"], found.problems)
    if project_chain:
        _chains_check([(None, project_chain)], header["project_id"], found.problems)
    return found


def _chains_check(
    chains: Sequence[tuple[int | None, list[AuditEntry]]], project_id: int, problems: list[str]
) -> None:
    """Each chain verifies from its start and ends at the database's hash for its last entry."""
    ids = [effect_id for effect_id, _ in chains if effect_id is not None]
    stored = AuditEntry.objects.filter(project_id=project_id)
    stored = stored.filter(effect_id__in=ids) if ids else stored.filter(effect=None)
    hashes: dict[tuple[int | None, int], str] = {
        (e, s): h for e, s, h in stored.values_list("effect_id", "seq", "hash")
    }
    for effect_id, chain in chains:
        about = f"effect {effect_id}" if effect_id is not None else "the project's own chain"
        if not chain:
            problems.append(f"The archive holds no audit entry of {about}.")
            continue
        broken = first_broken_in_chain(chain, chain[-1].hash)
        if broken is not None:
            problems.append(
                f"The archived chain of {about} does not verify at entry {broken.pk}"
                f" (seq {broken.seq}): the archive was changed."
            )
        elif hashes.get((effect_id, chain[-1].seq)) != chain[-1].hash:
            problems.append(
                f"The archived chain of {about} ends at seq {chain[-1].seq} with a hash the"
                " database's chain does not hold there."
            )
