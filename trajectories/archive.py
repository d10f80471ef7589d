"""The runs and spans an archive holds (durability.retention.archive names this section in
`TALLYBOOK_ARCHIVE_SECTIONS`): read through the models by project and time, so that it
reads the same whatever tables hold the spans."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import models

from durability.models import Project
from trajectories.models import Run, Span

CHUNK = 200


def _row(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def runs_archived(project: Project, before: datetime) -> Iterator[dict[str, Any]]:
    """The project's runs started before `before`, oldest first, each with its spans that
    started before then."""
    runs = Run.objects.filter(project=project, started__lt=before).order_by("started", "id")
    after: tuple[datetime, int] | None = None
    while True:
        page = runs
        if after is not None:
            page = runs.filter(
                models.Q(started__gt=after[0]) | models.Q(started=after[0], id__gt=after[1])
            )
        chunk = list(page[:CHUNK])
        if not chunk:
            return
        after = (chunk[-1].started, chunk[-1].pk)
        spans: dict[int, list[dict[str, Any]]] = {}
        found = Span.objects.filter(
            project=project, start__lt=before, run_id__in=[run.pk for run in chunk]
        )
        for span in found.order_by("run_id", "start", "id"):
            spans.setdefault(span.run_id, []).append(_row(span))
        for run in chunk:
            yield {"type": "run", **_row(run), "spans": spans.get(run.pk, [])}
