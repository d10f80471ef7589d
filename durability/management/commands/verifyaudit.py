from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.audit import first_broken_entry
from durability.models import AuditEntry, Project


class Command(BaseCommand):
    help = "Check each project's audit hash chain and name the first broken entry."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", help="Check only the project of this name.")

    def handle(self, *args: Any, **options: Any) -> None:
        projects = Project.objects.order_by("name")
        if options["project"]:
            projects = projects.filter(name=options["project"])
            if not projects.exists():
                raise CommandError(f"No project is named {options['project']!r}.")
        broken = []
        for project in projects:
            count = AuditEntry.objects.filter(project=project).count()
            entry = first_broken_entry(project)
            if entry is None:
                self.stdout.write(f"{project.name}: {count} entries, the chain holds.")
                continue
            broken.append(project.name)
            about = f"effect {entry.effect_id}, " if entry.effect_id else ""
            self.stdout.write(
                f"{project.name}: BROKEN at entry {entry.pk} ({about}seq {entry.seq}, "
                f"{entry.action} by {entry.actor} at {entry.at.isoformat()})."
            )
        if broken:
            raise CommandError(f"Broken audit chain in: {', '.join(broken)}.", returncode=1)
