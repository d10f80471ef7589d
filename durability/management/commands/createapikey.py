from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from durability.accounts.members import apikey_create
from durability.models import Project


class Command(BaseCommand):
    help = "Create an API key for PROJECT (created if missing); the key is the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="Project name")
        parser.add_argument("--name", default="", help="A label for the key")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            project, created = Project.objects.get_or_create(name=options["project"])
            if project.deleting is not None:
                raise CommandError(f"{project.name!r} is being deleted: it takes no new keys.")
            key, raw = apikey_create(
                project=project, actor="system:createapikey", name=options["name"]
            )
        if created:
            self.stdout.write(f"Created project {project.name!r}.")
        self.stdout.write(f"API key {key.prefix}… for {project.name!r} (shown once):")
        self.stdout.write(raw)
