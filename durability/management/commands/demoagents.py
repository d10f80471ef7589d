"""Bring the demo project to life: the fake provider, and the three agents as processes,
restarted when they crash. Without Redis it also runs the background schedule (deadline
sweeps, reconciler probes, alerts) that `manage.py worker` and `scheduler` would run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.accounts.members import apikey_create
from durability.cron import SCHEDULE
from durability.demo import DEMO_DIR, PROVIDER_PORT, repository
from durability.demo.agents import AGENTS, CRASHED
from durability.demo.provider import ProviderServer
from durability.ledger.jobs import sweep
from durability.models import Grant, Project

# A person refunds an order by hand at the provider now and then (the first after this).
DASHBOARD_FIRST, DASHBOARD_EVERY = 40.0, 240.0
# Seconds before an agent that died is started again (times --pace).
RESTART_AFTER = 2.0


@dataclass
class AgentProcess:
    name: str
    version: tuple[int, int]
    command: list[str]
    log: TextIO
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    restart_at: float = 0.0

    @property
    def version_name(self) -> str:
        return f"{self.version[0]}.{self.version[1]}.0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.command, "--version", self.version_name],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )


@dataclass
class Clock:
    """The scheduler's schedule (durability.cron), run here when there is no Redis; `pace` scales
    its intervals as it scales the agents' pauses."""

    pace: float
    due: dict[int, float] = field(default_factory=dict)

    def tick(self, now: float) -> None:
        for index, (job, every) in enumerate(SCHEDULE):
            if now >= self.due.get(index, 0.0):
                self.due[index] = now + every * self.pace
                job()


class Command(BaseCommand):
    help = "Run the demo's fake provider and simulated agents against a running Tallybook."
    # call_command(..., until=predicate) also stops once the predicate holds (the tests).
    stealth_options = ("until",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", default="demo")
        parser.add_argument("--url", default="", help="Tallybook's URL (default: SITE_URL)")
        parser.add_argument("--provider-port", type=int, default=PROVIDER_PORT)
        parser.add_argument(
            "--dir", type=Path, default=DEMO_DIR, help="where the agents keep their state"
        )
        parser.add_argument(
            "--seconds", type=float, default=0, help="stop after this long (default: never)"
        )
        parser.add_argument("--pace", type=float, default=1.0, help="multiplies the agents' pauses")

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(name=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']!r}: run `manage.py demo` first.")
        url = options["url"] or settings.SITE_URL
        _, api_key = apikey_create(project=project, actor="system:demoagents", name="demo agents")
        grant_ids = {
            g.name: g.pk for g in Grant.objects.filter(project=project, superseded_at=None)
        }
        state = options["dir"] / "agents"
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        try:
            provider = ProviderServer(options["provider_port"])
        except OSError as exc:
            raise CommandError(
                f"The demo's fake provider cannot listen on port {options['provider_port']}: "
                f"{exc.strerror or exc}. Seed again with another port (`manage.py demo "
                "--provider-port N`, then `manage.py demoagents --provider-port N`), or let "
                "`bin/demo` pick a free one."
            ) from exc
        provider.start()
        self._wait_for(url)
        # The agents' slow provider answers after a sweep: the scheduler's every 5 s, or this
        # command's own (at --pace) without Redis.
        sweep_every = dict(SCHEDULE)[sweep] * (1.0 if settings.REDIS_URL else options["pace"])
        agents = [
            self._agent(
                name,
                url,
                provider.url,
                options["dir"],
                api_key,
                grant_ids,
                options["pace"],
                sweep_every,
            )
            for name in AGENTS
        ]
        for agent in agents:
            agent.start()
        self.stdout.write(
            f"Agents at work: {', '.join(AGENTS)} (their logs: {state}/*.log); "
            f"fake provider on {provider.url}."
        )
        with _stop_on_signals() as stop:
            self._run(
                agents,
                provider,
                url,
                api_key,
                stop,
                options["seconds"],
                options["pace"],
                options.get("until"),
            )

    def _run(
        self,
        agents: list[AgentProcess],
        provider: ProviderServer,
        url: str,
        api_key: str,
        stop: StopRequest,
        seconds: float,
        pace: float,
        until: Callable[[], bool] | None = None,
    ) -> None:
        clock = None if settings.REDIS_URL else Clock(pace)
        started = time.monotonic()
        dashboard_at, manual = started + DASHBOARD_FIRST * pace, 0
        try:
            while not stop.requested:
                now = time.monotonic()
                if (seconds and now - started >= seconds) or (until is not None and until()):
                    break
                for agent in agents:
                    self._supervise(agent, now, pace)
                if clock is not None:
                    clock.tick(now)
                if now >= dashboard_at:
                    manual += 1
                    provider.dashboard_refund(url, api_key, manual)
                    dashboard_at = now + DASHBOARD_EVERY * pace
                time.sleep(0.5)
        finally:
            running = [a.process for a in agents if a.process and a.process.poll() is None]
            for process in running:
                process.terminate()  # each agent sends its last spans, then exits
            for process in running:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
            for agent in agents:
                agent.log.close()
            provider.shutdown()
            provider.server_close()

    def _agent(
        self,
        name: str,
        url: str,
        provider: str,
        directory: Path,
        api_key: str,
        grant_ids: dict[str, int],
        pace: float,
        sweep_every: float,
    ) -> AgentProcess:
        command = [
            sys.executable,
            "-m",
            "durability.demo.agents",
            name,
            "--url",
            url,
            "--provider",
            provider,
            "--state",
            str(directory / "agents" / name),
            "--repository",
            str(repository(directory)),
            "--grants",
            json.dumps(grant_ids),
            "--pace",
            str(pace),
            "--sweep-every",
            str(sweep_every),
        ]
        env = {**os.environ, "TALLYBOOK_API_KEY": api_key, "PYTHONUNBUFFERED": "1"}
        log = (directory / "agents" / f"{name}.log").open("a")
        return AgentProcess(name, (2, 4), command, log, env)

    def _supervise(self, agent: AgentProcess, now: float, pace: float) -> None:
        """Restart an agent that died: after a crash, the release bot comes back upgraded."""
        process = agent.process
        if process is None or process.poll() is None:
            if process is None and now >= agent.restart_at:
                agent.start()
            return
        agent.process, agent.restart_at = None, now + RESTART_AFTER * pace
        if agent.name == "release-bot":
            agent.version = (agent.version[0], agent.version[1] + 1)
        how = "crashed, as planned" if process.returncode == CRASHED else "stopped"
        at = datetime.now(UTC).strftime("%H:%M:%S")
        self.stdout.write(
            f"{at} {agent.name} {how} (exit {process.returncode}); restarting it as "
            f"version {agent.version_name}: it will resume its ticket."
        )

    def _wait_for(self, url: str, timeout: float = 90.0) -> None:
        """Wait until Tallybook answers, so that the agents do not start against nothing."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=5):
                    return
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise CommandError(f"Tallybook at {url} did not answer: {exc}") from exc
                time.sleep(0.5)


@dataclass
class StopRequest:
    requested: bool = False


@contextmanager
def _stop_on_signals() -> Iterator[StopRequest]:
    """SIGTERM and SIGINT ask the loop to stop (and the agents with it) while it runs."""
    stop = StopRequest()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.requested = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
