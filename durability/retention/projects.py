"""Deleting a project: at once, its keys revoked and its members and entrances gone; then,
in the background, its rows deleted in bounded batches, children first, the project last.

The tables are read from the models' relations, not listed: every model with a foreign
key to Project, or to a model that has one (a signoff, through its approval), so a table
added later is deleted with the rest. They go children first (a self-referencing table,
grants, newest first), BATCH rows a statement and a transaction; the audit trail through
`durability_audit_delete` (migration 0030), the one DELETE its trigger lets through, and
only for a project marked as being deleted; a partitioned table (spans) one partition at a
time, so that each statement reads one partition's index.

Idempotent and resumable: every batch commits on its own, so a run after a crash carries
on with what is left, and two runs at once take turns (an advisory lock per project). The
last transaction locks what is left of the project, deletes whatever a request
authenticated just before the revocation wrote meanwhile, then the project row: a write
after it fails its foreign key (the project is gone), and its key no longer authenticates.
That request is answered as its next one would be, with nothing stored (`project_gone`):
401 at the API's front door (`authorize`), 404 for a webhook's source and for a page (the
access helper's middleware); and no page shows a project being deleted (`roles`).
"""

from __future__ import annotations

import graphlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from django.apps import apps
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from durability.models import (
    ApiKey,
    AuditEntry,
    Membership,
    Project,
    ReconcilerConfig,
    WebhookSource,
)
from durability.retention.services import Refused

logger = logging.getLogger(__name__)

# Rows per DELETE statement, each its own transaction: short locks, bounded undo.
BATCH = 2000
# Advisory lock namespace of a project's deletion ("delp"), keyed by the project's id.
LOCK_CLASS = 0x64656C70


@dataclass(frozen=True)
class Owned:
    """A table of a project's rows: its model, and the lookup from a row to its project."""

    model: type[models.Model]
    path: str  # e.g. "project_id", "approval__project_id"
    newest_first: bool  # it references itself: a row goes before the row it names

    @property
    def label(self) -> str:
        return self.model._meta.label


@dataclass
class Deleted:
    """What one run deleted, by model label; `finished` once the project row is gone."""

    rows: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    finished: bool = False
    busy: bool = False  # another run holds the project's deletion

    def add(self, label: str, count: int) -> None:
        if count:
            self.rows[label] = self.rows.get(label, 0) + count
            self.batches += 1


def _project_path(model: type[models.Model], owned: dict[type[models.Model], str]) -> str | None:
    """The lookup from one of `model`'s rows to its project id, through its own foreign key
    to Project or through one to a model already in `owned`; None if it has neither."""
    relations = [
        f
        for f in model._meta.concrete_fields
        if isinstance(f, models.ForeignKey) and f.related_model is not None
    ]
    for f in relations:
        if f.related_model is Project:
            return f.attname
    for f in relations:
        target = f.related_model
        if target is not model and target in owned and not f.null:
            return f"{f.name}__{owned[target]}"
    return None


def owned_tables() -> list[Owned]:
    """Every table holding a project's rows, children before the rows they name."""
    owned: dict[type[models.Model], str] = {}
    candidates = [m for m in apps.get_models() if m is not Project]
    grew = True
    while grew:
        grew = False
        for model in candidates:
            if model not in owned and (path := _project_path(model, owned)) is not None:
                owned[model] = path
                grew = True
    # A model comes after every model whose rows name its rows.
    order: graphlib.TopologicalSorter[type[models.Model]] = graphlib.TopologicalSorter()
    self_referencing = set()
    for model in owned:
        order.add(model)
        for f in model._meta.concrete_fields:
            target = f.related_model if f.is_relation else None
            if target is model:
                self_referencing.add(model)
            elif target in owned:
                order.add(target, model)
    return [Owned(m, owned[m], m in self_referencing) for m in order.static_order()]


def _partitions(table: str) -> list[str]:
    """The leaf partitions of a partitioned table (quoted as SQL needs); none for a plain
    table, or anywhere but PostgreSQL."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relid::regclass::text FROM pg_partition_tree(%s::regclass) WHERE isleaf",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _rows_of(owned: Owned, project_id: int) -> models.QuerySet[models.Model]:
    rows = owned.model._base_manager.filter(**{owned.path: project_id})
    return rows.order_by("-pk") if owned.newest_first else rows.order_by()


def _batch_delete(owned: Owned, project_id: int, batch: int) -> int:
    """Delete up to `batch` of the project's rows of the table, in one statement; how many.
    The caller holds the transaction."""
    model = owned.model
    partitions = _partitions(model._meta.db_table)
    if partitions:
        # A partitioned table names its project itself (spans: Span.project).
        column = next(f.column for f in model._meta.concrete_fields if f.attname == owned.path)
        deleted = 0
        with connection.cursor() as cursor:
            for partition in partitions:
                # Names from the catalogue, quoted by regclass; a partition's rows by ctid.
                cursor.execute(
                    f"DELETE FROM {partition} WHERE ctid = ANY(ARRAY("
                    f'SELECT ctid FROM {partition} WHERE "{column}" = %s LIMIT %s))',
                    [project_id, batch - deleted],
                )
                deleted += cursor.rowcount
                if deleted >= batch:
                    break
        return deleted
    if model is AuditEntry and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT durability_audit_delete(%s, %s)", [project_id, batch])
            (count,) = cursor.fetchone()
        return int(count)
    chosen = _rows_of(owned, project_id).values("pk")[:batch]
    return model._base_manager.filter(pk__in=chosen)._raw_delete(connection.alias)


def project_delete_begin(*, project: Project, actor: str, now: datetime | None = None) -> bool:
    """Mark the project as being deleted, in one transaction: its keys revoked (the keys
    version moves, so every process refuses them on its next request), its members removed
    (no page lists it any more), its webhook sources and reconcilers turned off. The rows
    are left to `project_delete`. True when it began now, False if it had already."""
    now = now or timezone.now()
    with transaction.atomic():
        if not Project.objects.filter(pk=project.pk, deleting=None).update(deleting=now):
            return False
        ApiKey.objects.filter(project=project, revoked_at=None).update(revoked_at=now)
        Membership.objects.filter(project=project).delete()
        WebhookSource.objects.filter(project=project).update(enabled=False)
        ReconcilerConfig.objects.filter(project=project).update(enabled=False)
    project.deleting = now
    logger.warning("project %s (%s) marked for deletion by %s", project, project.pk, actor)
    return True


@contextmanager
def _held(project_id: int) -> Iterator[bool]:
    """The session advisory lock of this project's deletion, if free (always, elsewhere than
    on PostgreSQL)."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, project_id])
        (got,) = cursor.fetchone()
    try:
        yield bool(got)
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, project_id])


def project_delete(
    *, project_id: int, batch: int = BATCH, budget_s: float | None = None
) -> Deleted:
    """Delete the rows of a project marked as being deleted, then the project; carries on
    from where a crashed run stopped. With `budget_s`, stops between batches once that many
    seconds have passed (`finished` stays False). A project not marked is refused (Refused);
    one already gone, or another run at work, is a no-op."""
    done = Deleted()
    deleting = Project.objects.filter(pk=project_id).values_list("deleting", flat=True).first()
    if deleting is None:
        if Project.objects.filter(pk=project_id).exists():
            raise Refused(
                f"Project {project_id} is not marked for deletion: delete it from the admin"
                " or with manage.py deleteproject, which revoke its keys first."
            )
        done.finished = True
        return done
    tables = owned_tables()
    end = None if budget_s is None else time.monotonic() + budget_s
    with _held(project_id) as held:
        if not held:
            done.busy = True
            return done
        for walk in range(WALKS):
            try:
                if not _tables_walk(tables, project_id, batch, end, done):
                    return done
                break
            except IntegrityError:
                # A row written meanwhile (a scheduled job's, or a request's in flight) names
                # a parent this batch deleted, and the check at its commit refused it: walk
                # the tables again from the children, which now holds that row too.
                if walk == WALKS - 1:
                    raise
                logger.warning("project %s: a row written meanwhile; walking again", project_id)
        with transaction.atomic():
            # Lock what is left (what a request in flight wrote, or holds), then the project
            # (an insert naming it holds a key-share lock until it commits): whatever those
            # writers committed is then seen and deleted, and any later one fails.
            for owned in tables:
                if not _partitions(owned.model._meta.db_table) and owned.model is not AuditEntry:
                    list(_rows_of(owned, project_id).select_for_update().values_list("pk"))
            list(Project.objects.select_for_update().filter(pk=project_id).values_list("pk"))
            for owned in tables:
                while count := _batch_delete(owned, project_id, batch):
                    done.add(owned.label, count)
            Project.objects.filter(pk=project_id)._raw_delete(connection.alias)
    done.finished = True
    logger.warning("project %s deleted: %s", project_id, done.rows)
    return done


# How many times a deletion walks its tables again after a row written meanwhile
# (`project_delete`) before it gives up until its next run.
WALKS = 5


def _tables_walk(
    tables: list[Owned], project_id: int, batch: int, end: float | None, done: Deleted
) -> bool:
    """Delete the project's rows table by table, children first; False if the budget ran
    out first."""
    for owned in tables:
        while True:
            with transaction.atomic():
                count = _batch_delete(owned, project_id, batch)
            done.add(owned.label, count)
            if end is not None and time.monotonic() > end:
                return False
            if count < batch:
                break
    return True


def projects_deleting() -> list[int]:
    """The projects marked as being deleted and not gone yet, oldest mark first."""
    marked = Project.objects.exclude(deleting=None).order_by("deleting", "pk")
    return list(marked.values_list("pk", flat=True))
