"""`manage.py partitions [--days N]`: create the span partitions ahead, drop the expired ones."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from trajectories import retention


class Command(BaseCommand):
    help = (
        "Create the span partitions of the days ahead and drop those wholly older than every "
        "project's span retention (its policy, else TALLYBOOK_SPAN_RETENTION_DAYS), deleting "
        "the spans of projects that keep theirs for less, with the runs left empty; what the "
        "scheduler runs hourly. --days N: one horizon for every project instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, help="keep spans this many days (0 or more)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["days"] is not None and options["days"] < 0:
            raise CommandError("--days: expected 0 or more")
        if options["days"] is None:
            report = retention.partitions_upkeep()
            created = report.created
        else:
            created = retention.partitions_create()
            report = retention.drop_expired(days=options["days"])
        self.stdout.write(f"horizon {report.horizon}: created {len(created)} partitions")
        self.stdout.write(
            f"dropped {len(report.dropped)} partitions ({', '.join(report.dropped) or 'none'}); "
            f"deleted {report.rows_deleted} rows of the default partitions, "
            f"{report.traces_deleted} traces, {report.runs_deleted} runs"
        )
