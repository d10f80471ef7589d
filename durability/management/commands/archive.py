from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.models import Project
from durability.retention.archive import archive_write


def _date(value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(
            f"--before {value!r} is not a date: give YYYY-MM-DD or an ISO 8601 time."
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Write what retention would remove from a project before a date as compressed JSON"
        " Lines: effects with their attempts, receipts and audit chains, the project's own"
        " chain, runs with their spans. Check it with verifyarchive."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="The project's name.")
        parser.add_argument(
            "--before", required=True, help="A date (UTC) or an ISO 8601 time: what is older."
        )
        parser.add_argument(
            "--out", help="The file to write (default: archive-<project>-<date>.jsonl.gz)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(name=options["project"]).first()
        if project is None:
            raise CommandError(f"No project is named {options['project']!r}.")
        before = _date(options["before"])
        out = Path(options["out"] or f"archive-{project.name}-{before:%Y%m%d}.jsonl.gz")
        if out.exists():
            raise CommandError(f"{out} exists already: an archive never overwrites a file.")
        archive = archive_write(project=project, before=before, out=out, actor="system:archive")
        self.stdout.write(
            f"{out}: {archive.effects} effects, {archive.entries} audit entries, {archive.runs}"
            f" runs and {archive.spans} spans before {before.isoformat()}; SHA-256"
            f" {archive.sha256}, recorded as archive {archive.pk}."
        )
