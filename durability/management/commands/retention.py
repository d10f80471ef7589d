from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.models import Project
from durability.retention import services


class Command(BaseCommand):
    help = (
        "Prune the request and receipt data of settled effects that each project's retention"
        " policy lets go (the scheduler does it hourly)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", help="Only the project of this name.")
        parser.add_argument(
            "--batch", type=int, default=1000, help="Effects per transaction (default 1000)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1.")
        projects = Project.objects.order_by("name")
        if options["project"]:
            projects = projects.filter(name=options["project"])
            if not projects.exists():
                raise CommandError(f"No project is named {options['project']!r}.")
        refused = []
        for project in projects:
            try:
                done = services.payloads_prune(project=project, batch=options["batch"])
            except services.Refused as exc:
                refused.append(project.name)
                self.stdout.write(f"{project.name}: REFUSED. {exc}")
                continue
            if done.before is None:
                self.stdout.write(f"{project.name}: payloads are kept for ever.")
                continue
            line = (
                f"{project.name}: pruned {done.effects} effects, {done.receipts} receipts and"
                f" {done.entries} audit entries settled before {done.before:%Y-%m-%d %H:%M} UTC,"
                f" in {done.batches} batches"
            )
            if done.kept_whole:
                line += (
                    f"; {done.kept_whole} audit entries keep their data: they were hashed over"
                    " it whole, before entries kept a digest, and emptying them would break"
                    " their chains"
                )
            self.stdout.write(line + ".")
        if refused:
            raise CommandError(f"Retention refused in: {', '.join(refused)}.", returncode=1)
