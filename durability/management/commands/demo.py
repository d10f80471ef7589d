from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from durability import machine
from durability.models import ApiKey, Effect, Membership, Project, Role
from durability.schemas import FailureIn, IntentIn, ReceiptIn, TimeoutIn

ACTOR = "system:demo"


class Command(BaseCommand):
    help = "Seed a fresh demo project with effects in every state; print the login and key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", default="demo")
        parser.add_argument("--username", default="operator")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            project = self._fresh_project(options["project"])
            password = secrets.token_urlsafe(9)
            user, _ = get_user_model().objects.get_or_create(username=options["username"])
            user.set_password(password)
            user.save()
            Membership.objects.create(project=project, user=user, role=Role.ADMIN)
            _, raw_key = ApiKey.issue(project, name="demo")
        self._seed(project)
        counts = {
            s: project.effects.filter(state=s).count()
            for s in sorted(set(project.effects.values_list("state", flat=True)))
        }
        self.stdout.write(f"Seeded project {project.name!r}: {counts}")
        self.stdout.write(f"Operator login: {user.get_username()} / {password}")
        self.stdout.write(f"API key: {raw_key}")

    def _fresh_project(self, name: str) -> Project:
        """A new project; an older one of that name keeps its audit trail under a new name."""
        old = Project.objects.filter(name=name).first()
        if old is not None:
            stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
            old.name = f"{name} (archived {stamp})"
            old.save(update_fields=["name"])
            Membership.objects.filter(project=old).delete()
        return Project.objects.create(name=name)

    def _seed(self, project: Project) -> None:
        def intent(key: str, **extra: Any) -> machine.Outcome:
            fields: dict[str, Any] = {
                "key": key,
                "kind": "payment",
                "target": "stripe",
                "request": {"order": key, "amount": 1250},
                "run_id": "refund-run-1",
                "worker": "demo-worker",
                "context": {"workflow": "refund-bot", "workflow_version": "2.3.0"},
            }
            fields.update(extra)
            return machine.intent_record(
                project=project, actor=ACTOR, intent=IntentIn.model_validate(fields)
            )

        def receipt(key: str, external_id: str) -> None:
            machine.receipt_record(
                project=project,
                actor=ACTOR,
                receipt=ReceiptIn(key=key, system="stripe", external_id=external_id),
            )

        def timeout(key: str) -> None:
            machine.timeout_record(
                project=project, actor=ACTOR, timeout=TimeoutIn(key=key, reason="no answer in 30s")
            )

        def settle(key: str, event: machine.Event, note: str) -> None:
            effect = Effect.objects.get(project=project, key=key)
            machine.effect_settle(
                project=project, effect_id=effect.pk, actor="user:operator", event=event, note=note
            )

        intent("refund:1001", timeout_s=3600)  # pending
        intent("refund:1002")
        receipt("refund:1002", "re_1002")  # succeeded
        intent("refund:1003")
        machine.failure_record(
            project=project,
            actor=ACTOR,
            failure=FailureIn(key="refund:1003", error="card_declined", definitive=True),
        )  # failed
        intent("refund:1004", timeout_s=30)
        timeout("refund:1004")  # timed_out, uncertain case
        intent("refund:1005")
        timeout("refund:1005")
        receipt("refund:1005", "re_1005")  # late success
        intent("refund:1006")
        timeout("refund:1006")
        settle("refund:1006", machine.Event.ATTEST_NOT_HAPPENED, "no refund in Stripe dashboard")
        intent("refund:1007")
        receipt("refund:1007", "re_1007")
        settle("refund:1007", machine.Event.COMPENSATE, "refund reversed by finance")
        intent("refund:1008")
        timeout("refund:1008")
        settle("refund:1008", machine.Event.ABANDON, "order cancelled upstream")
        intent("refund:1009")
        receipt("refund:1009", "re_1009a")
        receipt("refund:1009", "re_1009b")  # duplicate effect
        intent("refund:1010")
        intent("refund:1010", request={"order": "refund:1010", "amount": 9999})  # key reuse
        receipt("refund:9999", "re_9999")  # orphan receipt
        intent("refund:1011", worker="w1")
        machine.failure_record(
            project=project,
            actor=ACTOR,
            failure=FailureIn(key="refund:1011", error="HTTP 502", definitive=True),
        )
        intent(
            "refund:1011",
            worker="w2",
            context={"workflow": "refund-bot", "workflow_version": "2.4.0"},
        )  # version drift on the retry
        intent("refund:1012", timeout_s=1)
        # The sweep, as it will run two seconds from now, times it out.
        machine.deadlines_sweep(now=timezone.now() + timedelta(seconds=2))
