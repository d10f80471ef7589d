from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.retention.archive import archive_verify


class Command(BaseCommand):
    help = (
        "Check an archive (manage.py archive) against this database: its content is the one"
        " recorded when it was written, and each audit chain in it verifies and ends at the"
        " hash the database holds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="The archive (.jsonl.gz).")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"{path} is not a file.")
        try:
            found = archive_verify(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"{path} is not a readable archive: {exc}.") from exc
        for problem in found.problems:
            self.stdout.write(f"{path}: {problem}")
        if found.problems:
            raise CommandError(f"{path}: the archive does not verify.", returncode=1)
        counts = found.counts
        self.stdout.write(
            f"{path}: archive {found.archive.pk if found.archive else '?'} of {found.project}:"
            f" {counts['effects']} effects, {counts['entries']} audit entries, {counts['runs']}"
            f" runs, {counts['spans']} spans; it verifies against the chains."
        )
