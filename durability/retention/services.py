"""Payload retention: the request of a settled effect and its receipts' data, removed once
the project's policy lets them go, keeping what makes the ledger provable.

Kept whatever the policy: the effect row (its key keeps deduplicating for as long as it
exists) with its fingerprint, the receipts with their external ids, every case, and every
audit entry's hash and data digest. The audit entries that carry the agent's own words
about the effect (a failure's error, a timeout's reason) lose their data too, through the
one path the database lets through (`durability_audit_prune`, migration 0023): the data is
replaced by the digest the entry's hash already covers, so the chain still verifies.

Effects are pruned in keyset batches of `batch`, each one transaction of bulk UPDATEs that
first locks its effects and verifies their chains: an effect whose chain does not verify
is refused (pruning it would hide the break), never pruned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from durability.audit import Trail, first_broken_in_chain, trail
from durability.models import (
    SETTLED_STATES,
    Archive,
    AuditAction,
    AuditEntry,
    Case,
    Effect,
    Project,
    Receipt,
    RetentionPolicy,
)

ACTOR = "system:retention"
# The audit entries whose data retention removes with the payloads: the agent's own words.
PRUNED_ACTIONS = (AuditAction.FAILURE, AuditAction.TIMEOUT)


class Refused(Exception):
    """Retention that would break a rule: said in a sentence that says why."""


@dataclass
class Pruned:
    """What one pass removed."""

    effects: int = 0
    receipts: int = 0
    entries: int = 0
    batches: int = 0
    # Entries hashed over their whole data (written before digests): their data stays.
    kept_whole: int = 0
    archive: Archive | None = None
    before: datetime | None = None


def archive_covering(project: Project) -> Archive | None:
    """The project's archive that covers the most: the latest `covers_until`."""
    archives = list(Archive.objects.filter(project=project))
    return max(archives, key=lambda a: a.covers_until, default=None)


def _due(project: Project, before: datetime) -> QuerySet[Effect]:
    """The project's settled effects last changed before `before` whose payloads are kept,
    none with an open case; in (updated, id) order (index effect_payload_due_idx)."""
    open_case = Case.objects.filter(project=project, effect=OuterRef("pk"), closed=None)
    return (
        Effect.objects.filter(
            project=project, state__in=SETTLED_STATES, payload_pruned=None, updated__lt=before
        )
        .exclude(Exists(open_case))
        .order_by("updated", "id")
    )


def _story_ended_before(when: datetime) -> Exists:
    """The effect's latest audit entry (its chain's head) is older than `when`."""
    head = AuditEntry.objects.filter(
        project=OuterRef("project_id"),
        effect=OuterRef("pk"),
        seq=OuterRef("audit_seq"),
        at__lt=when,
    )
    return Exists(head)


def payloads_prune(
    *, project: Project, now: datetime | None = None, batch: int = 1000, actor: str = ACTOR
) -> Pruned:
    """Prune the payloads the project's policy lets go, in batches of `batch` effects.

    With "require an archive first", only effects whose whole story an archive holds
    (their latest audit entry before its `covers_until`): none without one (Refused).
    Raises Refused at the first effect whose audit chain does not verify; the batches
    before it stay pruned. A query count per batch that does not grow with it.
    """
    policy = RetentionPolicy.of(project)
    done = Pruned()
    if policy.payload_days is None:
        return done
    now = now or timezone.now()
    done.before = before = now - timedelta(days=policy.payload_days)
    done.archive = archive = archive_covering(project)
    if policy.require_archive and archive is None:
        raise Refused(
            f"{project}: its policy prunes only what an archive holds, and it has no archive:"
            f" write one first (manage.py archive --project {project.name} --before DATE)."
        )
    covers = archive.covers_until if archive is not None else None
    due = _due(project, before)
    if covers is not None and policy.require_archive:
        due = due.filter(_story_ended_before(covers))
    after: tuple[datetime, int] | None = None
    while True:
        page = due
        if after is not None:
            page = due.filter(Q(updated__gt=after[0]) | Q(updated=after[0], id__gt=after[1]))
        rows = list(page.values_list("id", "updated")[:batch])
        if not rows:
            return done
        after = (rows[-1][1], rows[-1][0])
        with trail(project, actor) as t:
            # Locked, and checked again: a case may have opened, an entry come, since.
            held = due.filter(pk__in=[pk for pk, _ in rows]).select_for_update(
                no_key=True, of=("self",)
            )
            archived = (
                set(held.filter(_story_ended_before(covers)).values_list("id", flat=True))
                if covers is not None
                else set()
            )
            locked = {
                pk: (head, pk in archived) for pk, head in held.values_list("id", "audit_head")
            }
            if locked:
                _batch_prune(t, locked, archive, before, now, done)


def _batch_prune(
    t: Trail,
    locked: dict[int, tuple[str, bool]],
    archive: Archive | None,
    before: datetime,
    now: datetime,
    done: Pruned,
) -> None:
    """Prune the locked effects (id: (chain head, archived)) once their chains verify."""
    entries = AuditEntry.objects.filter(project_id=t.project_id, effect_id__in=list(locked))
    entries = entries.order_by("effect_id", "seq")
    prune: list[int] = []
    for effect_id, chain in groupby(entries, key=lambda e: e.effect_id):
        assert effect_id is not None
        story = list(chain)
        broken = first_broken_in_chain(story, locked[effect_id][0])
        if broken is not None:
            raise Refused(
                f"Effect {effect_id}: its audit chain does not verify at entry {broken.pk}"
                f" (seq {broken.seq}); pruning its payload would hide the break, so nothing of"
                " it was pruned. Run manage.py verifyaudit, and restore the entry from a backup"
                " or an archive."
            )
        for entry in story:
            if entry.action in PRUNED_ACTIONS and entry.pruned is None and entry.data:
                if entry.data_digest:
                    prune.append(entry.pk)
                else:
                    done.kept_whole += 1
    archived = [pk for pk, (_, covered) in locked.items() if covered]
    unarchived = [pk for pk, (_, covered) in locked.items() if not covered]
    if archived:
        Effect.objects.filter(project_id=t.project_id, pk__in=archived).update(
            request=None, payload_pruned=now, payload_archive=archive
        )
    if unarchived:
        Effect.objects.filter(project_id=t.project_id, pk__in=unarchived).update(
            request=None, payload_pruned=now
        )
    receipts = Receipt.objects.filter(
        project_id=t.project_id, effect_id__in=list(locked), data_pruned=None
    ).update(data=None, data_pruned=now)
    entries_pruned = audit_entries_prune(prune, now=now)
    t.add(
        AuditAction.PAYLOADS_PRUNED,
        effects=len(locked),
        receipts=receipts,
        entries=entries_pruned,
        first=min(locked),
        last=max(locked),
        before=before.isoformat(),
        archive=archive.pk if archived and archive is not None else None,
        archived=len(archived),
    )
    done.effects += len(locked)
    done.receipts += receipts
    done.entries += entries_pruned
    done.batches += 1


def audit_entries_prune(entry_ids: Iterable[int], *, now: datetime) -> int:
    """Empty the data of these audit entries, each keeping the digest its hash covers: on
    PostgreSQL through `durability_audit_prune`, the one update its trigger lets through;
    on SQLite through the one shape of update its trigger lets through. The caller has
    verified their chains. Refused for an entry hashed over its whole data: emptying it
    would make its chain unverifiable."""
    ids = sorted(set(entry_ids))
    if not ids:
        return 0
    whole = list(
        AuditEntry.objects.filter(pk__in=ids, data_digest="").values_list("pk", flat=True)[:5]
    )
    if whole:
        raise Refused(
            f"Audit entries {', '.join(map(str, whole))} were hashed over their whole data"
            " (written before entries kept a digest of it): emptying their data would make"
            " their chains unverifiable, so they keep it."
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT durability_audit_prune(%s::bigint[], %s)", [ids, now])
            (count,) = cursor.fetchone()
        return int(count)
    return AuditEntry.objects.filter(pk__in=ids, pruned=None).update(data={}, pruned=now)
