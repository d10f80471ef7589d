"""The demo's agents: a refund bot, a release bot and a support bot.

Each runs as its own process (`python -m durability.demo.agents refund-bot …`), works
through numbered tickets, and makes its effects durable with `tallybook` exactly as
a real agent would. Its memory (the next ticket, the ticket in hand, tickets parked until
a person or a reconciler settles them) is a small JSON file, so that a process that dies
mid-ticket is restarted by `manage.py demoagents` and resumes that ticket, as a job queue
would redeliver it.

The first tickets walk through every scenario once, so the queue fills with every kind of
case within a couple of minutes; later ones are mostly uneventful, as in real life.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from tallybook import (
    EffectConflict,
    EffectDenied,
    EffectInDoubt,
    IntentNotRecorded,
    Tallybook,
    TallybookError,
)

from durability.demo import telemetry

log = logging.getLogger("durability.demo")
# What os._exit reports when an agent "crashes": the supervisor restarts it.
CRASHED = 70


class ProviderError(Exception):
    """The provider refused: nothing happened (a definitive failure)."""


def crash(why: str) -> None:
    """Die at once, as with SIGKILL: no receipt, no failure report, no flushed spans."""
    log.warning("crashing: %s", why)
    logging.shutdown()
    os._exit(CRASHED)


@dataclass
class Ticket:
    seq: int
    scenario: str
    run_id: str
    # True when the ticket is worked again: after a crash, or after waiting.
    resumed: bool = False
    # A parked ticket waits until the decision for this effect key is no longer `wait`.
    waiting_on: str = ""
    due: float = 0.0
    checks: int = 0


@dataclass
class Memory:
    """What an agent remembers across its crashes, in a JSON file."""

    path: Path
    seq: int = 0
    in_hand: Ticket | None = None
    parked: list[Ticket] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Memory:
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        in_hand = Ticket(**data["in_hand"]) if data["in_hand"] else None
        return cls(path, data["seq"], in_hand, [Ticket(**t) for t in data["parked"]])

    def save(self) -> None:
        data = {
            "seq": self.seq,
            "in_hand": asdict(self.in_hand) if self.in_hand else None,
            "parked": [asdict(t) for t in self.parked],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


def call(
    url: str, body: dict[str, Any], *, key: str = "", demo: dict[str, str] | None = None
) -> dict[str, Any]:
    """POST to the provider; `demo` steers its misbehaviour (X-Demo-<Name> headers)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    headers |= {f"X-Demo-{name.title()}": value for name, value in (demo or {}).items()}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        raise ProviderError(f"{exc.code}: {exc.read().decode(errors='replace')}") from exc


class Agent:
    """The loop every bot shares: pick a ticket, work it, park what must wait."""

    name: ClassVar[str]
    # Its tickets' run ids start with this.
    prefix: ClassVar[str]
    # Seconds between tickets (times --pace).
    interval: ClassVar[float]
    # The scenarios of the first tickets, in order; then `weights` choose.
    script: ClassVar[list[str]]
    weights: ClassVar[dict[str, int]]

    def __init__(
        self,
        tb: Tallybook,
        trajectory: telemetry.Trajectory,
        provider: str,
        memory: Memory,
        *,
        version: str,
        pace: float,
        grants: dict[str, int],
        repository: Path,
        sweep_every: float = 5.0,
    ) -> None:
        self.tb, self.trajectory, self.provider = tb, trajectory, provider
        self.memory, self.version, self.pace = memory, version, pace
        self.grants, self.repository = grants, repository
        # Seconds between Tallybook's deadline sweeps, which time out what is past its deadline.
        self.sweep_every = sweep_every

    def authority(self, grant: str) -> dict[str, int]:
        return {"grant": self.grants[grant]}

    def next_ticket(self) -> Ticket:
        memory = self.memory
        if memory.in_hand is not None:
            memory.in_hand.resumed = True
            return memory.in_hand
        for ticket in [t for t in memory.parked if t.due <= time.time()]:
            memory.parked.remove(ticket)
            if self.still_waiting(ticket):
                self.park(ticket, ticket.waiting_on)
                continue
            ticket.resumed = True
            return ticket
        memory.seq += 1
        if memory.seq <= len(self.script):
            scenario = self.script[memory.seq - 1]
        else:
            scenario = random.choices(list(self.weights), list(self.weights.values()))[0]
        return Ticket(memory.seq, scenario, f"{self.prefix}-{memory.seq:04d}")

    def still_waiting(self, ticket: Ticket) -> bool:
        """Ask (without recording anything) whether the effect is still waiting."""
        if not ticket.waiting_on:
            return False
        try:
            self.tb.wait_for(ticket.waiting_on, timeout=0.01)
        except EffectInDoubt:
            return True
        except TallybookError as exc:
            log.warning("%s: cannot ask about %s: %s", ticket.run_id, ticket.waiting_on, exc)
            return True
        return False

    def park(self, ticket: Ticket, key: str) -> None:
        """Look at the ticket again later, less and less often."""
        ticket.waiting_on, ticket.checks = key, ticket.checks + 1
        ticket.due = time.time() + min(300.0, 10.0 * 2**ticket.checks) * self.pace
        self.memory.parked.append(ticket)

    def step(self) -> None:
        ticket = self.next_ticket()
        self.memory.in_hand = ticket
        self.memory.save()
        started, status = datetime.now(UTC), "ok"
        try:
            with self.tb.run(self.name, version=self.version, run_id=ticket.run_id):
                self.work(ticket)
        except EffectInDoubt as exc:
            # Waiting for a person or a reconciler: the interruption report names the case.
            log.info("%s waits: %s", ticket.run_id, exc)
            self.park(ticket, exc.key)
            status = "running"
        except (EffectDenied, EffectConflict) as exc:
            log.info("%s stopped: %s", ticket.run_id, exc)
            status = "error"
        except IntentNotRecorded as exc:
            log.warning("%s: not recorded, so not done; later: %s", ticket.run_id, exc)
            self.park(ticket, "")
            status = "running"
        except ProviderError as exc:
            log.info("%s: the provider refused: %s", ticket.run_id, exc)
            status = "error"
        self.trajectory.report(ticket.run_id, status, started, ended=status != "running")
        self.memory.in_hand = None
        self.memory.save()

    def work(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def crashing(self, ticket: Ticket, scenario: str) -> bool:
        """Whether this ticket dies at the scenario's crash point (never when resumed)."""
        return ticket.scenario == scenario and not ticket.resumed

    def forever(self) -> None:
        while True:
            self.step()
            time.sleep(self.interval * self.pace * random.uniform(0.6, 1.4))


class RefundBot(Agent):
    """Refunds orders through the payment provider, which a reconciler can ask."""

    name = "refund-bot"
    prefix = "RF"
    interval = 6.0
    # Seconds a refund may take before the sweep times it out.
    deadline = 4
    # How long past the deadline and the sweep after it the slow provider still answers: a
    # busy machine may run the sweep late.
    slow_margin = 3.0
    script = [
        "refund",
        "crash-after-refund",
        "slow-provider",
        "large-refund",
        "partial-refund",
        "card-closed",
        "crash-before-refund",
        "payout",
        "refund",
    ]
    weights = {
        "refund": 20,
        "crash-after-refund": 2,
        "crash-before-refund": 1,
        "slow-provider": 2,
        "large-refund": 2,
        "partial-refund": 1,
        "card-closed": 2,
        "payout": 1,
    }

    def work(self, ticket: Ticket) -> None:
        order = f"A-{4000 + ticket.seq}"
        amount = 2000 + (ticket.seq * 1733) % 16000  # cents
        if ticket.scenario == "large-refund":
            amount *= 10
        if ticket.scenario == "partial-refund":
            # A refund on record, then a second one for the same order under the same key.
            self.refund(ticket, order, amount)
            amount //= 2
        kind = "payout" if ticket.scenario == "payout" else "payment"
        self.refund(ticket, order, amount, kind=kind)

    def refund(self, ticket: Ticket, order: str, amount: int, kind: str = "payment") -> None:
        request = {"order": order, "amount": amount, "currency": "EUR"}
        task = f"Ticket {ticket.run_id}: the customer of order {order} asks for their money back."
        grant = "large refunds" if amount > 20000 else "refunds"
        with self.trajectory.run(ticket.run_id, task):
            call_id = self.trajectory.plan(task, "refund", request)
            with (
                self.trajectory.tool("refund", call_id, request),
                self.tb.effect(
                    f"refund:{order}",
                    kind=kind,
                    target="payments",
                    request=request,
                    replay="reconcile",
                    timeout_s=self.deadline,
                    tool_call_id=call_id,
                    authority=self.authority(grant),
                    definitive_on=(ProviderError,),
                ) as fx,
            ):
                if fx.completed:
                    return
                if self.crashing(ticket, "crash-before-refund"):
                    crash(f"{ticket.run_id} died before calling the provider")
                demo: dict[str, str] = {}
                if ticket.scenario == "slow-provider" and not ticket.resumed:
                    # Past the deadline and the next sweep: the sweep times the effect out
                    # first, and the refund is a late success (12 s at Tallybook's 5 s sweep).
                    delay = self.deadline + self.sweep_every + self.slow_margin
                    demo["delay"] = str(delay)
                if ticket.scenario == "card-closed":
                    demo["decline"] = "card_closed"
                refund = call(f"{self.provider}/refunds", request, key=fx.key, demo=demo)
                if self.crashing(ticket, "crash-after-refund"):
                    crash(f"{ticket.run_id} died after refund {refund['id']}, before its receipt")
                fx.receipt(
                    system="payments", external_id=refund["id"], observed_at=refund["created"]
                )


class ReleaseBot(Agent):
    """Releases the `web` service: a commit and a tag in git, then a deploy."""

    name = "release-bot"
    prefix = "REL"
    interval = 12.0
    script = [
        "release",
        "crash-after-deploy",
        "crash-after-tag",
        "production-release",
        "slow-deploy",
    ]
    weights = {
        "release": 20,
        "crash-after-tag": 1,
        "slow-deploy": 2,
        "production-release": 1,
        "crash-after-deploy": 1,
    }

    def work(self, ticket: Ticket) -> None:
        version = f"1.{ticket.seq}.0"
        environment = "production" if ticket.scenario == "production-release" else "staging"
        task = f"Release web {version} to {environment}."
        with self.trajectory.run(ticket.run_id, task):
            self.tag(ticket, version, task)
            self.deploy(ticket, version, environment, task)

    def tag(self, ticket: Ticket, version: str, task: str) -> None:
        request = {"service": "web", "version": version}
        call_id = self.trajectory.plan(task, "git_tag", request)
        with (
            self.trajectory.tool("git_tag", call_id, request),
            self.tb.effect(
                f"tag:web@{version}",
                kind="commit",
                target="release-repo",
                request=request,
                # The git reconciler can tell whether the tag exists.
                replay="reconcile",
                timeout_s=30,
                tool_call_id=call_id,
                authority=self.authority("releases"),
            ) as fx,
        ):
            if fx.completed:
                return
            sha = self.commit_and_tag(version)
            if self.crashing(ticket, "crash-after-tag"):
                crash(f"{ticket.run_id} died after tagging v{version}, before its receipt")
            fx.receipt(system="git", external_id=sha)

    def commit_and_tag(self, version: str) -> str:
        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(self.repository), *args],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            )
            return done.stdout.strip()

        tag = f"v{version}"
        if git("tag", "--list", tag):
            return git("rev-list", "-n", "1", tag)
        with (self.repository / "CHANGELOG.md").open("a") as changelog:
            changelog.write(f"- web {version}\n")
        git("add", "CHANGELOG.md")
        git("commit", "--quiet", "-m", f"Release web {version}")
        git("tag", tag)
        return git("rev-parse", "HEAD")

    def deploy(self, ticket: Ticket, version: str, environment: str, task: str) -> None:
        request = {"service": "web", "version": version, "environment": environment}
        call_id = self.trajectory.plan(task, "deploy", request)
        grant = "production deploys" if environment == "production" else "releases"
        with (
            self.trajectory.tool("deploy", call_id, request),
            self.tb.effect(
                f"deploy:web@{version}:{environment}",
                kind="deploy",
                target="deployer",
                request=request,
                # The deployer deduplicates on the Idempotency-Key we pass.
                replay="idempotent",
                timeout_s=60,
                tool_call_id=call_id,
                authority=self.authority(grant),
                definitive_on=(ProviderError,),
            ) as fx,
        ):
            if fx.completed:
                return
            slow = ticket.scenario == "slow-deploy" and not ticket.resumed
            delay = 25 * self.pace if slow else 0
            deployed = call(
                f"{self.provider}/deploys", request, key=fx.key, demo={"delay": str(delay)}
            )
            if self.crashing(ticket, "crash-after-deploy"):
                crash(f"{ticket.run_id} died after deploy {deployed['id']}, before its receipt")
            fx.receipt(system="deployer", external_id=deployed["id"])


class SupportBot(Agent):
    """Answers customers in the chat; the chat API does not deduplicate messages."""

    name = "support-bot"
    prefix = "SUP"
    interval = 5.0
    script = ["reply", "slow-chat", "edited-reply", "email-escalation", "reply"]
    weights = {"reply": 30, "slow-chat": 1, "edited-reply": 1, "email-escalation": 2}

    def work(self, ticket: Ticket) -> None:
        customer = f"C-{700 + ticket.seq % 40}"
        task = f"Ticket {ticket.run_id}: customer {customer} asks where their parcel is."
        text = f"Hello {customer}, your parcel left our warehouse today."
        with self.trajectory.run(ticket.run_id, task):
            if ticket.scenario == "email-escalation":
                self.email(ticket, customer, task)
                return
            self.reply(ticket, customer, text, task)
            if ticket.scenario == "edited-reply":
                # Editing the answer but keeping its key: the same key, another request.
                self.reply(ticket, customer, text + " Tracking: ZX-81.", task)

    def _send(self, body: dict[str, Any], key: str, delay: float = 0) -> dict[str, Any]:
        return call(f"{self.provider}/messages", body, key=key, demo={"delay": str(delay)})

    def reply(self, ticket: Ticket, customer: str, text: str, task: str) -> None:
        request = {"customer": customer, "text": text}
        call_id = self.trajectory.plan(task, "send_message", request)
        key = f"reply:{ticket.run_id}"
        options: dict[str, Any] = {
            "kind": "message",
            "target": "chat",
            "request": request,
            # Declared idempotent, though the chat API does not deduplicate: a retry after a
            # timeout may send the message twice, and Tallybook will notice.
            "replay": "idempotent",
            "timeout_s": 30,
            "tool_call_id": call_id,
            "authority": self.authority("support replies"),
        }
        first: Future[dict[str, Any]] | None = None
        with self.trajectory.tool("send_message", call_id, request):
            try:
                with self.tb.effect(key, **options) as fx:
                    if fx.completed:
                        return
                    slow = ticket.scenario == "slow-chat" and not ticket.resumed
                    pool = ThreadPoolExecutor(1)
                    first = pool.submit(self._send, request, key, 6 if slow else 0)
                    pool.shutdown(wait=False)
                    sent = first.result(timeout=2 if slow else 30)
                    fx.receipt(system="chat", external_id=sent["id"])
                    return
            except FutureTimeout:
                log.info("%s: the chat API did not answer in time; retrying", ticket.run_id)
            # The retry the replay policy allows: a second message.
            with self.tb.effect(key, **options) as fx:
                sent = self._send(request, key)
                fx.receipt(system="chat", external_id=sent["id"])
            # The first send answers after all: a second message, reported as one.
            late = first.result(timeout=60) if first else None
            if late is not None:
                self.tb.receipt(key, system="chat", external_id=late["id"])

    def email(self, ticket: Ticket, customer: str, task: str) -> None:
        request = {"customer": customer, "subject": "Your parcel", "to": "team@example.com"}
        call_id = self.trajectory.plan(task, "send_email", request)
        with (
            self.trajectory.tool("send_email", call_id, request),
            # No grant covers email: the demo's audit_cases policy lets it proceed, flagged.
            self.tb.effect(
                f"email:{ticket.run_id}",
                kind="email",
                target="mailer",
                request=request,
                timeout_s=30,
                tool_call_id=call_id,
            ) as fx,
        ):
            sent = call(f"{self.provider}/messages", request)
            fx.receipt(system="mailer", external_id=sent["id"])


AGENTS: dict[str, type[Agent]] = {a.name: a for a in (RefundBot, ReleaseBot, SupportBot)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one demo agent until it is stopped.")
    parser.add_argument("agent", choices=sorted(AGENTS))
    parser.add_argument("--url", required=True, help="Tallybook's URL")
    parser.add_argument("--provider", required=True, help="the fake provider's URL")
    parser.add_argument("--state", type=Path, required=True, help="a folder for its memory")
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--grants", required=True, help="JSON: grant name -> id")
    parser.add_argument("--version", default="1.0.0")
    parser.add_argument("--pace", type=float, default=1.0, help="multiplies every pause")
    parser.add_argument(
        "--sweep-every", type=float, default=5.0, help="seconds between the deadline sweeps"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {args.agent} %(levelname)s %(message)s"
    )
    api_key = os.environ["TALLYBOOK_API_KEY"]
    provider = telemetry.tracer_provider(args.agent, args.version, args.url, api_key)
    args.state.mkdir(parents=True, exist_ok=True)
    agent = AGENTS[args.agent](
        Tallybook(args.url, api_key, spool=args.state / "spool", tracer_provider=provider),
        telemetry.Trajectory(provider, args.agent, args.version, args.url, api_key),
        args.provider,
        Memory.load(args.state / "memory.json"),
        version=args.version,
        pace=args.pace,
        grants=json.loads(args.grants),
        repository=args.repository,
        sweep_every=args.sweep_every,
    )
    # Stopped (SIGTERM from the supervisor, or Ctrl-C): deliver the spans still batched.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        agent.forever()
    finally:
        provider.shutdown()
        agent.tb.close()


if __name__ == "__main__":
    main()
