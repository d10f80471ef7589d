from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.models import Project
from durability.retention import projects

ACTOR = "system:deleteproject"


class Command(BaseCommand):
    help = (
        "Delete PROJECT and every row of it: its keys are revoked at once, then its rows are"
        " deleted in batches (what the admin's background deletion does, here and now)."
        " Run again after an interruption, it finishes the work."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="The project's name.")
        parser.add_argument(
            "--batch",
            type=int,
            default=projects.BATCH,
            help=f"Rows per statement and transaction (default {projects.BATCH}).",
        )
        parser.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask to type the project's name again.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1.")
        name = options["project"]
        project = Project.objects.filter(name=name).first()
        if project is None:
            raise CommandError(f"No project is named {name!r}.")
        if project.deleting is None:
            if options["interactive"]:
                typed = input(f"This deletes {name!r} and all its rows. Type its name: ")
                if typed != name:
                    raise CommandError("The name typed is not the project's: nothing deleted.")
            projects.project_delete_begin(project=project, actor=ACTOR)
            self.stdout.write(f"{name}: keys revoked, members removed; deleting its rows.")
        else:
            self.stdout.write(
                f"{name}: marked for deletion on {project.deleting:%Y-%m-%d %H:%M} UTC;"
                " carrying on."
            )
        done = projects.project_delete(project_id=project.pk, batch=options["batch"])
        if done.busy:
            raise CommandError(
                f"{name}: another run (a worker's job) is deleting it now; it will finish.",
                returncode=1,
            )
        counts = ", ".join(f"{count} {label}" for label, count in sorted(done.rows.items()))
        self.stdout.write(f"{name}: deleted, in {done.batches} batches: {counts or 'no rows'}.")
