"""Run by test_sqlite.py in a process of its own on a fresh SQLite database (the demo's):
fills a project and prints what the search finds, as JSON, for each text of the JSON list
in the environment variable SEARCH_TEXTS."""

from __future__ import annotations

import json
import os

from django.apps import apps
from django.conf import settings
from django.core.management import call_command

# The schema from the models, the migrations set aside (as Django's TEST {"MIGRATE": False}
# does): on SQLite the same tables, columns, foreign keys, triggers and post_migrate rows as
# the migrations make, less django_migrations and two composite-key unique indexes, in 0.3 s
# where migrating takes 8 s (Django's rendering of each migration's models). Migrating a
# SQLite database is tests/api/test_quickstart.py's.
settings.MIGRATION_MODULES = {app.label: None for app in apps.get_app_configs()}
call_command("migrate", run_syncdb=True, verbosity=0)

from durability.models import Case, Effect, Project, Reason, Receipt, Severity  # noqa: E402
from durability.search.queries import search  # noqa: E402
from trajectories.models import Run, RunTrace  # noqa: E402

project = Project.objects.create(name="demo")
other = Project.objects.create(name="other")
for owner in (project, other):
    for n, key in enumerate(["refund:7", "refund:70", "audit:1"]):
        effect = Effect.objects.create(
            project=owner,
            key=key,
            kind="payment",
            target="fakepay",
            agent="refund-bot",
            request={"about": "refund:7", "customer": "Ana.Lopez@example.com"} if n == 2 else {},
        )
        Receipt.objects.create(
            project=owner, effect=effect, key=key, system="fakepay", external_id=f"re_{n}_50%"
        )
    Case.objects.create(
        project=owner,
        effect=Effect.objects.get(project=owner, key="refund:70"),
        reason=Reason.UNCERTAIN,
        severity=Severity.HIGH,
        summary="Attempt 1 timed out",
    )
    made = Run.objects.create(project=owner, run_id="ticket-5521", agent="refund-bot")
    RunTrace.objects.create(project=owner, trace_id="4bf92f3577b34da6a3ce929d0e0e4736", run=made)

print(
    json.dumps(
        {
            q: {
                kind: [[str(found.row), found.matched] for found in results.found]
                for kind, results in search(project, q).items()
            }
            for q in json.loads(os.environ["SEARCH_TEXTS"])
        }
    )
)
