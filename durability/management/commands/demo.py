"""Seed a fresh demo project: an operator, an API key, the agents' grants, reconcilers for
the fake provider and the local git repository, and a history of effects in every state
with a case of every reason. `manage.py demoagents` then brings it to life."""

from __future__ import annotations

import hashlib
import random
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser, OutputWrapper
from django.db import transaction
from django.utils import timezone

from durability.accounts.members import apikey_create, project_policy_set
from durability.authority import approvals, grants
from durability.demo import DEMO_DIR, PROVIDER_PORT, repository
from durability.demo.telemetry import MODEL
from durability.ledger import evidence, intents, machine, settling
from durability.ledger.commands import Amount, Failure, Intent, ReceiptEvidence, Timeout
from durability.models import (
    Approval,
    AuthorityPolicy,
    Effect,
    Grant,
    Membership,
    Project,
    ReconcilerConfig,
    Role,
    SignoffVerdict,
)
from trajectories import ingest, links

ACTOR = "system:demo"
OPERATOR = "user:operator"
# name -> (agent, kinds, targets, requires approval)
GRANTS = {
    "refunds": ("refund-bot", ["payment"], ["payments"], False),
    "large refunds": ("refund-bot", ["payment"], ["payments"], True),
    "releases": ("release-bot", ["commit", "deploy"], ["release-repo", "deployer"], False),
    "production deploys": ("release-bot", ["deploy"], ["deployer"], True),
    "support replies": ("support-bot", ["message"], ["chat"], False),
}


class Progress:
    """A progress bar on a terminal; one line at the end anywhere else."""

    WIDTH = 32

    def __init__(self, out: OutputWrapper, total: int, label: str) -> None:
        self.out, self.total, self.label, self.done = out, total, label, 0
        self.live = out.isatty()

    def advance(self) -> None:
        self.done += 1
        if self.live:
            filled = self.WIDTH * self.done // self.total
            bar = "█" * filled + "░" * (self.WIDTH - filled)
            self.out.write(f"\r{self.label} {bar} {self.done}/{self.total}", ending="")
            self.out.flush()

    def finish(self, summary: str) -> None:
        self.out.write(("\r" if self.live else "") + f"{self.label}: {summary}".ljust(70))


# What each kind of effect's tool is called in the seeded trajectories.
TOOLS = {"payment": "refund", "payout": "payout", "message": "send_message", "email": "send_email"}
TOOLS |= {"commit": "git_tag", "deploy": "deploy"}


@dataclass
class History:
    """The demo project's past, written through the state machine's services at the moments
    it would have happened (`time_machine` moves the clock), with the agents' trajectories."""

    project: Project
    grant_ids: dict[str, int]
    operator: User
    clock: time_machine.Traveller | None = None
    # The runs' and spans' events, sent together once the effects are written.
    events: list[dict[str, Any]] = field(default_factory=list)

    def later(self, seconds: float) -> None:
        """Let time pass within an episode: a provider's answer, a timeout, a person."""
        if self.clock is not None:
            self.clock.shift(timedelta(seconds=seconds))

    def intent(self, key: str, agent: str, kind: str, target: str, **extra: Any) -> Effect:
        grant = extra.pop("grant", None)
        run_id = f"history-{key}"
        request = extra.pop("request", {"ticket": key})
        fields: dict[str, Any] = {
            "key": key,
            "kind": kind,
            "target": target,
            "request": request,
            "run_id": run_id,
            "worker": f"{agent}-history",
            "context": {"workflow": agent, "workflow_version": "1.0.0", "model": MODEL},
            "authority": {"grant": self.grant_ids[grant]} if grant else None,
            "tool_call_id": self.trajectory(run_id, agent, TOOLS[kind], request),
        }
        fields.update(extra)
        self.later(random.uniform(1, 4))
        outcome = intents.intent_record(project=self.project, actor=ACTOR, intent=Intent(**fields))
        return outcome.effect

    def trajectory(self, run_id: str, agent: str, tool: str, arguments: dict[str, Any]) -> str:
        """The run's spans as the agents' telemetry sends them (durability/demo/telemetry.py):
        the agent's, the model request that asked for the tool call, and the tool call;
        returns the call's id."""
        call_id = "call_" + secrets.token_hex(8)
        trace_id = hashlib.sha256(run_id.encode()).hexdigest()[:32]
        root, model, tool_span = (secrets.token_hex(8) for _ in range(3))
        now = timezone.now()

        def moment(seconds: float) -> str:
            return (now + timedelta(seconds=seconds)).isoformat()

        task = f"{agent}: {run_id.removeprefix('history-')}"
        common = {"type": "span", "run_id": run_id, "trace_id": trace_id}
        events: list[dict[str, Any]] = [
            {
                "id": f"{run_id}:{call_id}:run",
                "type": "run",
                "run_id": run_id,
                "agent": agent,
                "workflow": agent,
                "workflow_version": "1.0.0",
                "status": "ok",
                "started": moment(0),
                "ended": moment(8),
                "trace_ids": [trace_id],
            },
            {
                **common,
                "id": f"{run_id}:{root}",
                "span_id": root,
                "kind": "agent",
                "name": f"invoke_agent {agent}",
                "start": moment(0),
                "end": moment(8),
                "status": "ok",
                "input": task,
            },
            {
                **common,
                "id": f"{run_id}:{model}",
                "span_id": model,
                "parent_span_id": root,
                "kind": "model",
                "name": f"chat {MODEL}",
                "start": moment(0.1),
                "end": moment(random.uniform(0.6, 1.0)),
                "status": "ok",
                "provider": "demo",
                "request_model": MODEL,
                "response_model": MODEL,
                "input_tokens": random.randint(300, 1200),
                "output_tokens": random.randint(20, 90),
                "input": [{"role": "user", "parts": [{"type": "text", "content": task}]}],
                "output": [
                    {
                        "role": "assistant",
                        "parts": [
                            {
                                "type": "tool_call",
                                "id": call_id,
                                "name": tool,
                                "arguments": arguments,
                            }
                        ],
                        "finish_reason": "tool_call",
                    }
                ],
            },
            {
                **common,
                "id": f"{run_id}:{tool_span}",
                "span_id": tool_span,
                "parent_span_id": root,
                "kind": "tool",
                "name": f"execute_tool {tool}",
                "start": moment(1),
                "end": moment(7),
                "status": "ok",
                "tool_call_id": call_id,
                "tool_name": tool,
                "input": arguments,
            },
        ]
        self.events += events
        return call_id

    def trajectories_send(self) -> None:
        """Store the runs and spans, in batches as the events API takes them, and link them
        to their effects (whatever order spans and effects arrive in, links hold)."""
        for start in range(0, len(self.events), 500):
            batch = self.events[start : start + 500]
            outcome = ingest.events_ingest(project=self.project, events=batch)
            links.links_refresh(project_id=self.project.pk, touched=outcome.touched)
        self.events.clear()

    def receipt(self, key: str, system: str, external_id: str, **extra: Any) -> None:
        self.later(random.uniform(1, 3))
        fields = {"key": key, "system": system, "external_id": external_id, **extra}
        evidence.receipt_record(
            project=self.project, actor=ACTOR, receipt=ReceiptEvidence(**fields)
        )

    def timeout(self, key: str) -> None:
        self.later(30)
        evidence.timeout_record(
            project=self.project, actor=ACTOR, timeout=Timeout(key=key, reason="no answer")
        )

    def settle(
        self,
        effect: Effect,
        event: machine.Event,
        note: str,
        evidence: ReceiptEvidence | None = None,
    ) -> None:
        settling.effect_settle(
            project=self.project,
            effect_id=effect.pk,
            actor=OPERATOR,
            event=event,
            note=note,
            evidence=evidence,
        )

    def refund(self, n: int, grant: str = "refunds", **extra: Any) -> Effect:
        request = {"order": f"H-{n}", "amount": 1000 + n * 37 % 9000, "currency": "EUR"}
        extra.setdefault("replay", "reconcile")
        return self.intent(
            f"refund:H-{n}",
            "refund-bot",
            "payment",
            "payments",
            grant=grant,
            request=request,
            **extra,
        )

    def reply(self, n: int, **extra: Any) -> Effect:
        request = {"customer": f"C-{n}", "text": "Your parcel is on its way."}
        return self.intent(
            f"reply:H-{n}",
            "support-bot",
            "message",
            "chat",
            grant="support replies",
            request=request,
            replay="idempotent",
            **extra,
        )

    def release(self, n: int) -> None:
        version = f"0.{n}.0"
        request = {"service": "web", "version": version}
        self.intent(
            f"tag:web@{version}",
            "release-bot",
            "commit",
            "release-repo",
            grant="releases",
            request=request,
            replay="reconcile",
        )
        self.receipt(f"tag:web@{version}", "git", secrets.token_hex(20))
        key = f"deploy:web@{version}:staging"
        self.intent(
            key,
            "release-bot",
            "deploy",
            "deployer",
            grant="releases",
            request={**request, "environment": "staging"},
            replay="idempotent",
        )
        self.receipt(key, "deployer", f"dep_{secrets.token_hex(6)}")

    def script(self) -> list[tuple[timedelta, Callable[[], None]]]:
        """Every episode of the past, in order, with how long ago it began: a week of routine
        work, then, over the last day, one of each kind of trouble."""
        routine: list[Callable[[], None]] = []
        for n in range(1, 31):
            routine.append(partial(self.done_refund, n))
            routine.append(partial(self.done_reply, n))
            if n % 3 == 0:
                routine.append(partial(self.release, n))
        trouble = [
            self.declined,
            self.uncertain_reply,
            self.late_success,
            self.not_happened,
            self.attested,
            self.compensated,
            self.abandoned,
            self.duplicate,
            self.key_reuse,
            self.orphan,
            self.version_drift,
            self.approved,
            self.denied,
            self.unauthorized,
            self.exceeded,
            self.awaiting_approval,
            # Last, minutes ago: its attempt's hour has not run out.
            self.pending_deploy,
        ]
        week, day = timedelta(days=7), timedelta(days=1)
        jitter = [timedelta(minutes=random.uniform(0, 90)) for _ in routine]
        past = [week - (week - day) * i / len(routine) - jitter[i] for i in range(len(routine))]
        last = len(trouble) - 1
        recent = [day - (day - timedelta(minutes=5)) * i / last for i in range(len(trouble))]
        return [*zip(past, routine, strict=True), *zip(recent, trouble, strict=True)]

    def done_refund(self, n: int) -> None:
        self.refund(n)
        self.receipt(f"refund:H-{n}", "payments", f"re_h{n}")

    def done_reply(self, n: int) -> None:
        self.reply(n)
        self.receipt(f"reply:H-{n}", "chat", f"msg_h{n}")

    def pending_deploy(self) -> None:
        self.intent(
            "deploy:web@0.99.0:staging",
            "release-bot",
            "deploy",
            "deployer",
            grant="releases",
            timeout_s=3600,
            replay="idempotent",
            request={"service": "web", "version": "0.99.0"},
        )

    def declined(self) -> None:
        self.refund(101)
        evidence.failure_record(
            project=self.project,
            actor=ACTOR,
            failure=Failure(key="refund:H-101", error="card_closed", definitive=True),
        )

    def uncertain_reply(self) -> None:
        self.intent(
            "reply:H-102",
            "support-bot",
            "message",
            "chat",
            grant="support replies",
            request={"customer": "C-102", "text": "Refund on its way."},
        )
        self.timeout("reply:H-102")

    def late_success(self) -> None:
        self.refund(103)
        self.timeout("refund:H-103")
        self.later(20 * 60)
        self.receipt("refund:H-103", "payments", "re_h103")

    def not_happened(self) -> None:
        effect = self.refund(104)
        self.timeout("refund:H-104")
        self.settle(effect, machine.Event.ATTEST_NOT_HAPPENED, "No such refund at the provider.")

    def attested(self) -> None:
        effect = self.refund(116)
        self.timeout("refund:H-116")
        found = ReceiptEvidence(key="refund:H-116", system="payments", external_id="re_h116")
        self.settle(effect, machine.Event.ATTEST_HAPPENED, "Found in the dashboard.", found)

    def compensated(self) -> None:
        effect = self.refund(105)
        self.receipt("refund:H-105", "payments", "re_h105")
        self.settle(effect, machine.Event.COMPENSATE, "Refunded twice by mistake; reversed.")

    def abandoned(self) -> None:
        effect = self.refund(106)
        self.timeout("refund:H-106")
        self.settle(effect, machine.Event.ABANDON, "Order cancelled upstream; nothing to do.")

    def duplicate(self) -> None:
        self.reply(107)
        self.receipt("reply:H-107", "chat", "msg_h107a")
        self.receipt("reply:H-107", "chat", "msg_h107b")

    def key_reuse(self) -> None:
        self.done_refund(108)
        self.intent(
            "refund:H-108",
            "refund-bot",
            "payment",
            "payments",
            grant="refunds",
            request={"order": "H-108", "amount": 1},
            replay="reconcile",
        )

    def orphan(self) -> None:
        self.receipt("refund:H-manual-1", "payments", "re_manual1")

    def version_drift(self) -> None:
        self.reply(110)
        evidence.failure_record(
            project=self.project,
            actor=ACTOR,
            failure=Failure(key="reply:H-110", error="HTTP 502", definitive=True),
        )
        self.reply(110, context={"workflow": "support-bot", "workflow_version": "1.1.0"})
        self.receipt("reply:H-110", "chat", "msg_h110")

    def awaiting_approval(self) -> None:
        self.refund(111, grant="large refunds")

    def approved(self) -> None:
        effect = self.refund(112, grant="large refunds")
        # Signed as a person signs it, so that the approval is decided, not left open.
        self.later(12 * 60)
        approvals.approval_sign(
            project=self.project,
            approval_id=Approval.objects.get(effect=effect).pk,
            user=self.operator,
            verdict=SignoffVerdict.APPROVE,
            reason="Customer is a long-standing account.",
        )
        self.refund(112, grant="large refunds")
        self.receipt("refund:H-112", "payments", "re_h112")

    def denied(self) -> None:
        self.intent(
            "payout:H-113",
            "refund-bot",
            "payout",
            "payments",
            grant="refunds",
            request={"order": "H-113", "iban": "DE00…"},
        )

    def unauthorized(self) -> None:
        self.intent(
            "email:H-114", "support-bot", "email", "mailer", request={"to": "team@example.com"}
        )
        self.receipt("email:H-114", "mailer", "mail_h114")

    def exceeded(self) -> None:
        self.refund(115, amount=Amount(Decimal("40.00"), "EUR"))
        self.receipt("refund:H-115", "payments", "re_h115", amount=Amount(Decimal("400.00"), "EUR"))


def repository_fresh(path: Path) -> None:
    """An empty git repository with one commit, for the release bot and the git reconciler."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "--quiet", "--initial-branch=main")
    git("config", "user.name", "release-bot")
    git("config", "user.email", "release-bot@example.com")
    (path / "CHANGELOG.md").write_text("# web\n\n")
    git("add", "CHANGELOG.md")
    git("commit", "--quiet", "-m", "Start the changelog")


class Command(BaseCommand):
    help = "Seed a fresh demo project with a history in every state; print the login and key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", default="demo")
        parser.add_argument("--username", default="operator")
        parser.add_argument("--provider-port", type=int, default=PROVIDER_PORT)
        parser.add_argument(
            "--dir", type=Path, default=DEMO_DIR, help="where the demo keeps its git repository"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            project = self._fresh_project(options["project"])
            # An operator, who works the queue, and an admin, who also manages the project.
            people = {
                role: self._person(project, name, role)
                for role, name in ((Role.OPERATOR, options["username"]), (Role.ADMIN, "admin"))
            }
            _, raw_key = apikey_create(project=project, actor="system:demo", name="demo")
            # The demo shows every case reason, so its support bot's ungranted emails open
            # the `unauthorized_effect` cases a project asks for with this policy.
            project_policy_set(project=project, actor=ACTOR, policy=AuthorityPolicy.AUDIT_CASES)
            grant_ids = self._grants(project)
            self._reconcilers(project, options["provider_port"], repository(options["dir"]))
        repository_fresh(repository(options["dir"]))
        operator, _ = people[Role.OPERATOR]
        history = History(project, grant_ids, operator)
        episodes = history.script()
        progress = Progress(self.stdout, len(episodes), "Seeding the demo's history")
        now = timezone.now()
        for ago, episode in episodes:
            with time_machine.travel(now - ago, tick=True) as history.clock:
                episode()
            progress.advance()
        history.clock = None
        history.trajectories_send()
        progress.finish(f"{project.effects.count()} effects, {project.cases.count()} cases.")
        for role, (user, password) in people.items():
            self.stdout.write(f"{role.capitalize()} login: {user.get_username()} / {password}")
        self.stdout.write(f"API key: {raw_key}")

    def _person(self, project: Project, username: str, role: Role) -> tuple[User, str]:
        """A member of the demo project with a fresh password."""
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        # The demo prints emails about cases on the console: give its people an address.
        user.email = user.email or f"{username}@example.com"
        user.save()
        Membership.objects.create(project=project, user=user, role=role)
        return user, password

    def _fresh_project(self, name: str) -> Project:
        """A new project; an older one of that name keeps its audit trail under a new name."""
        old = Project.objects.filter(name=name).first()
        if old is not None:
            stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
            old.name = f"{name} (archived {stamp})"
            old.save(update_fields=["name"])
            Membership.objects.filter(project=old).delete()
            # Its reconcilers would keep asking a provider that no longer knows its effects.
            ReconcilerConfig.objects.filter(project=old).update(enabled=False)
        return Project.objects.create(name=name)

    def _grants(self, project: Project) -> dict[str, int]:
        made: dict[str, int] = {}
        for name, (agent, kinds, targets, approval) in GRANTS.items():
            terms = grants.Terms(
                name=name,
                principal=agent,
                kinds=kinds,
                targets=targets,
                requires_approval=approval,
                note="Seeded by the demo.",
            )
            grant: Grant = grants.grant_create(project=project, actor=ACTOR, terms=terms)
            made[name] = grant.pk
        return made

    def _reconcilers(self, project: Project, port: int, git_repository: Path) -> None:
        ReconcilerConfig.objects.create(
            project=project,
            target="payments",
            kind="http",
            config={
                "url": f"http://127.0.0.1:{port}/refunds?idempotency_key={{key}}",
                "external_id_path": "data.0.id",
                "status_path": "data.0.status",
                "found": ["succeeded"],
                "absent_means_not_found": True,
                "observed_at_path": "data.0.created",
                "timeout_s": 5,
            },
            # Two minutes after a timeout, the provider's "no such refund" is trusted.
            grace_s=120,
            interval_s=10,
        )
        ReconcilerConfig.objects.create(
            project=project,
            target="release-repo",
            kind="git",
            config={
                "repository": str(git_repository),
                "tag": "v{request[version]}",
                "timeout_s": 10,
            },
            interval_s=10,
        )
