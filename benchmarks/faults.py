"""The fault script: Tallybook's production processes under PostgreSQL stops, Redis kills
and SIGKILLed workers, against a ground truth of what happened in the world.

    .venv/bin/python benchmarks/faults.py [--seconds 120] [--agents 4] [--every 8] [--no-flood]

Run as root (initdb refuses root: the private cluster runs as the `postgres` user) on a
machine with PostgreSQL 15+ binaries and redis-server. It starts, all on free ports and in a
temporary folder it removes afterwards:

- a private PostgreSQL cluster and a private Redis (no persistence, as production needs);
- this checkout's production processes: granian as the deploy unit starts it (2 workers),
  `manage.py worker` (2) and
  `manage.py scheduler`, restarted when they die as systemd would (deploy/systemd/);
- N agents (benchmarks/fault_agent.py, the SDK alone) refunding through a fake provider whose
  log is the ground truth, crashing now and then and restarted to resume.

Every --every seconds it does the next fault in turn: PostgreSQL stopped `-m fast` (then
started), Redis SIGKILLed (then started, empty), an rq worker SIGKILLed, a web worker
SIGKILLed (granian starts another), PostgreSQL stopped `-m immediate`, the scheduler
SIGKILLed, the web server reloaded (SIGHUP, `systemctl reload`: every worker replaced).

Then, the agents still running and no fault injected, the flood phase (unless --no-flood):
the agents' project (the victim) sends one-span OTLP requests to /v1/traces every --pace
seconds, alone for --alone seconds, then for --flood seconds while a second project, with its
own API key, floods /v1/traces from --flooders threads with maximum-size requests
(benchmarks/otlp_flood.py's bomb: 10,000 spans, gzip, inflating to just under 16 MiB), each
sent again as soon as it is answered (a second after a 429). It prints the flooding project's
answers by status and the victim's latency alone and under the flood (for people: no timing
decides the outcome), and counts the victim's requests refused (any non-2xx) or unanswered.

Then the agents are told to stop, finish their key and deliver their spooled receipts, and it
prints:

- lost: refunds the world performed whose effect the ledger does not hold as succeeded;
- duplicated: keys the world performed more than once;
- unexpected: effects the ledger holds as succeeded that the world never performed;
- acked but missing: intents and receipts answered 2xx that are not in the database;
- unplanned exits: web, worker or scheduler processes that died without being killed;
- victim refused or failed: the victim's OTLP requests not answered 2xx during the flood phase;

and exits 1 if any is not 0.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

# The flood's requests and senders, from the benchmark beside this script (the script's
# folder is first on sys.path).
otlp_flood = importlib.import_module("otlp_flood")
# The web server's command, the deploy unit's.
web_command = importlib.import_module("server").web_command
# The private clusters, beside it too.
clusters = importlib.import_module("clusters")
Postgres = clusters.Postgres
free_port = clusters.free_port

ROOT = Path(__file__).resolve().parent.parent
AGENT = Path(__file__).resolve().parent / "fault_agent.py"
SDK_SRC = ROOT / "sdk" / "src"
CRASHED = 70  # fault_agent.py's planned crash


def wait_until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


@dataclass
class Process:
    """One supervised process: started again whenever it exits (as Restart=always)."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    killed: bool = False
    unplanned_exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        self.killed = False

    def kill(self) -> None:
        assert self.popen is not None
        self.killed = True
        self.popen.send_signal(signal.SIGKILL)

    def supervise(self) -> None:
        assert self.popen is not None
        code = self.popen.poll()
        if code is None:
            return
        if not self.killed:
            self.unplanned_exits.append(code)
        self.start()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Redis:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.folder = folder
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_until(self._answers, 30, "redis-server")

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class Run:
    def __init__(self, options: argparse.Namespace, folder: Path) -> None:
        self.options = options
        self.folder = folder
        self.pg = Postgres(folder / "pg")
        self.redis = Redis(folder)
        self.web_port = free_port()
        self.env = {
            **os.environ,
            "DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "DB_CONN_MAX_AGE": "0",
            "LOG_LEVEL": "WARNING",
            "ALLOWED_HOSTS": "127.0.0.1",
            "SITE_URL": f"http://127.0.0.1:{self.web_port}",
            # Production settings, but on plain HTTP on 127.0.0.1 with no TLS proxy in front.
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
        }
        self.env.pop("DEBUG", None)
        python = sys.executable
        logs = folder / "logs"
        logs.mkdir()
        self.web = Process(
            "web",
            web_command(self.web_port, workers=2, access_log=False),
            self.env,
            logs / "web.log",
        )
        self.workers = [
            Process(f"worker{i}", [python, "manage.py", "worker"], self.env, logs / f"w{i}.log")
            for i in (1, 2)
        ]
        self.scheduler = Process(
            "scheduler", [python, "manage.py", "scheduler"], self.env, logs / "scheduler.log"
        )
        self.world = folder / "world.log"
        self.stop_file = folder / "stop"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.agent_crashes = 0
        self.faults: collections.Counter[str] = collections.Counter()

    @property
    def services(self) -> list[Process]:
        return [self.web, *self.workers, self.scheduler]

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def set_up(self) -> tuple[str, int]:
        """The agents' key and grant; the flooding project's key in self.flood_key."""
        self.pg.start()
        self.pg.create_database()
        self.redis.start()
        self.manage("migrate", "--verbosity", "0")
        printed = self.manage(
            "shell",
            "-c",
            "from durability.models import ApiKey, Grant, Project\n"
            "p = Project.objects.create(name='faults')\n"
            "g = Grant.objects.create(project=p, name='refunds', kinds=['payment'],"
            " targets=['fakepay'], granted_by='faults')\n"
            "f = Project.objects.create(name='flood')\n"
            "print(g.pk, ApiKey.issue(p)[1], ApiKey.issue(f)[1])",
        )
        grant, key, self.flood_key = printed.split()[-3:]
        for service in self.services:
            service.start()
        wait_until(self._web_answers, 60, "the web server")
        return key, int(grant)

    def _web_answers(self) -> bool:
        url = f"http://127.0.0.1:{self.web_port}/api/v1/openapi.json"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def agent_start(self, name: str, key: str, grant: int) -> None:
        home = self.folder / "agents" / name
        home.mkdir(parents=True, exist_ok=True)
        self.agents[name] = subprocess.Popen(
            [
                sys.executable,
                "-S",
                str(AGENT),
                "--url",
                f"http://127.0.0.1:{self.web_port}",
                "--key",
                key,
                "--grant",
                str(grant),
                "--name",
                name,
                "--dir",
                str(home),
                "--world",
                str(self.world),
                "--stop",
                str(self.stop_file),
                "--crash",
                str(self.options.crash),
            ],
            env={"PYTHONPATH": str(SDK_SRC), "PATH": os.environ.get("PATH", "")},
            stdout=(home / "out.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

    def supervise(self, key: str, grant: int) -> list[str]:
        """Start again what died; the agents that are done."""
        for service in self.services:
            service.supervise()
        done = []
        for name, agent in list(self.agents.items()):
            code = agent.poll()
            if code is None:
                continue
            if code == CRASHED:
                self.agent_crashes += 1
                self.agent_start(name, key, grant)
            else:
                done.append(name)
                if code != 0:
                    print(f"agent {name} exited {code}: see {self.folder}/agents/{name}")
        return done

    def fault(self, n: int) -> None:
        faults: list[tuple[str, Callable[[], None]]] = [
            ("postgres stopped (fast)", lambda: self._pg_down("fast")),
            ("redis killed", self._redis_down),
            ("rq worker killed", lambda: self.workers[n % 2].kill()),
            ("web worker killed", self._web_worker_kill),
            ("postgres stopped (immediate)", lambda: self._pg_down("immediate")),
            ("scheduler killed", self.scheduler.kill),
            ("web reloaded", self._web_reload),
        ]
        name, act = faults[n % len(faults)]
        print(f"{time.strftime('%H:%M:%S')} {name}", flush=True)
        act()
        self.faults[name] += 1

    def _pg_down(self, mode: str) -> None:
        self.pg.stop(mode)
        time.sleep(self.options.outage)
        self.pg.start()

    def _redis_down(self) -> None:
        self.redis.kill()
        time.sleep(self.options.outage)
        self.redis.start()

    def _web_worker_kill(self) -> None:
        assert self.web.popen is not None
        for pid in children(self.web.popen.pid)[:1]:
            os.kill(pid, signal.SIGKILL)

    def _web_reload(self) -> None:
        assert self.web.popen is not None
        self.web.popen.send_signal(signal.SIGHUP)

    def tear_down(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.kill()
        for service in self.services:
            service.stop()
        if self.redis.popen is not None and self.redis.popen.poll() is None:
            self.redis.kill()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg.stop("fast")


@dataclass
class Victim:
    """One-span OTLP requests sent every `pace` seconds until stopped; the time each took,
    alone or under the flood, and the answers that were not 2xx (or no answer at all)."""

    port: int
    key: str
    pace: float
    alone: list[float] = field(default_factory=list)
    flooded: list[float] = field(default_factory=list)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    flooding: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            started = time.monotonic()
            under_flood = self.flooding.is_set()
            body = otlp_flood.request(1, 20_000 + n)
            n += 1
            try:
                status, took = otlp_flood.post(self.port, self.key, body, False, timeout=120)
            except OSError as exc:
                self.refused[type(exc).__name__] += 1
                print(f"victim request: {exc!r}", flush=True)
            else:
                if 200 <= status < 300:
                    (self.flooded if under_flood else self.alone).append(took)
                else:
                    self.refused[str(status)] += 1
                    print(f"victim request answered {status}", flush=True)
            self.stop.wait(max(0.0, self.pace - (time.monotonic() - started)))


def flood_phase(run: Run, key: str, grant: int) -> dict[str, Any]:
    """The victim alone, then under the flood; the agents supervised all along."""
    options = run.options
    wait_until(run._web_answers, 60, "the web server")
    bombs = [otlp_flood.bomb(n) for n in range(options.flooders)]
    victim = Victim(run.web_port, key, options.pace)
    sender = threading.Thread(target=victim.run)

    def supervised(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            run.supervise(key, grant)
            time.sleep(0.2)

    print(f"{time.strftime('%H:%M:%S')} flood phase: the victim alone", flush=True)
    sender.start()
    try:
        supervised(options.alone)
        print(
            f"{time.strftime('%H:%M:%S')} flood phase: {options.flooders} senders flood",
            flush=True,
        )
        with otlp_flood.Flood(run.web_port, run.flood_key, bombs) as flood:
            victim.flooding.set()
            supervised(options.flood)
            victim.stop.set()
            sender.join()
    finally:
        victim.stop.set()
        sender.join()
    return {
        "bomb": f"{len(bombs[0]):,} bytes gzip, {len(gzip.decompress(bombs[0])):,} inflated",
        "answers": dict(sorted(flood.answers.items(), key=str)),
        "alone": victim.alone,
        "flooded": victim.flooded,
        "refused": dict(victim.refused),
    }


def tally(run: Run) -> dict[str, int]:
    performed = collections.Counter(
        line.split(" ", 1)[0] for line in run.world.read_text().splitlines() if line
    )
    with psycopg.connect(run.pg.url) as conn:
        states: dict[str, str] = dict(
            conn.execute(
                "SELECT e.key, e.state FROM durability_effect e"
                " JOIN durability_project p ON p.id = e.project_id WHERE p.name = 'faults'"
            ).fetchall()
        )
        receipts = set(conn.execute("SELECT key, external_id FROM durability_receipt").fetchall())
    acked_intents, acked_receipts = set(), set()
    server_errors = 0
    for acks in (run.folder / "agents").glob("*/acks.jsonl"):
        for line in acks.read_text().splitlines():
            ack = json.loads(line)
            if ack["status"] >= 500:
                server_errors += 1
            elif ack["endpoint"] == "intents":
                acked_intents.add(ack["key"])
            else:
                acked_receipts.add((ack["key"], ack["external_id"]))
    succeeded = {key for key, state in states.items() if state == "succeeded"}
    figures = {
        "effects performed in the world": len(performed),
        "effects the ledger holds": len(states),
        "intents acknowledged": len(acked_intents),
        "receipts acknowledged": len(acked_receipts),
        # Each retried by the SDK; while PostgreSQL is away.
        "5xx answers to the agents": server_errors,
        "lost": len(set(performed) - succeeded),
        "duplicated": sum(1 for count in performed.values() if count > 1),
        "unexpected": len(succeeded - set(performed)),
        "acked but missing": len(acked_intents - set(states)) + len(acked_receipts - receipts),
        "unplanned exits": sum(len(s.unplanned_exits) for s in run.services),
    }
    lost = sorted(set(performed) - succeeded)[:10]
    if lost:
        print("lost, first ten:", ", ".join(f"{k} ({states.get(k, 'absent')})" for k in lost))
    return figures


MUST_BE_ZERO = ("lost", "duplicated", "unexpected", "acked but missing", "unplanned exits")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120, help="how long faults go on")
    parser.add_argument("--agents", type=int, default=4, help="agent processes")
    parser.add_argument("--every", type=float, default=8, help="seconds between faults")
    parser.add_argument(
        "--outage", type=float, default=3, help="seconds PostgreSQL and Redis stay down"
    )
    parser.add_argument(
        "--crash",
        type=float,
        default=0.03,
        help="each agent's chance to crash at each of its two crash points",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--no-flood", action="store_true", help="no flood phase")
    parser.add_argument(
        "--alone", type=float, default=10, help="seconds the victim sends before the flood"
    )
    parser.add_argument("--flood", type=float, default=30, help="seconds the flood lasts")
    parser.add_argument("--flooders", type=int, default=20, help="concurrent flood senders")
    parser.add_argument(
        "--pace", type=float, default=0.5, help="seconds between the victim's requests"
    )
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tallybook-faults-"))
    os.chmod(folder, 0o755)
    run = Run(options, folder)
    try:
        key, grant = run.set_up()
        for i in range(options.agents):
            run.agent_start(f"agent{i}", key, grant)
        started = time.monotonic()
        next_fault, n = started + options.every, 0
        while time.monotonic() - started < options.seconds:
            run.supervise(key, grant)
            if time.monotonic() >= next_fault:
                run.fault(n)
                n, next_fault = n + 1, time.monotonic() + options.every
            time.sleep(0.2)
        print(f"{time.strftime('%H:%M:%S')} faults over", flush=True)
        flooded = None if options.no_flood else flood_phase(run, key, grant)
        print(f"{time.strftime('%H:%M:%S')} the agents finish their keys", flush=True)
        run.stop_file.touch()
        done: set[str] = set()
        deadline = time.monotonic() + 300
        while len(done) < len(run.agents) and time.monotonic() < deadline:
            done.update(run.supervise(key, grant))
            time.sleep(0.2)
        figures = tally(run)
        if flooded is not None:
            figures["victim refused or failed"] = sum(flooded["refused"].values())
    finally:
        run.tear_down()
        if not options.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"kept {folder}")
    print(f"faults: {dict(run.faults)}; agent crashes: {run.agent_crashes}")
    if flooded is not None:
        print(
            f"flood: {options.flooders} senders from project 'flood', {options.flood:.0f} s,"
            f" each request {otlp_flood.MAX_SPANS:,} spans, {flooded['bomb']}"
        )
        print(f"  the flooding project's answers: {flooded['answers']}")
        print(
            f"  victim alone ({len(flooded['alone'])} requests): "
            + otlp_flood.summary(flooded["alone"])
        )
        print(
            f"  victim under the flood ({len(flooded['flooded'])} requests): "
            + otlp_flood.summary(flooded["flooded"])
        )
        print(f"  victim refused or failed, by answer: {flooded['refused']}")
    for name, value in figures.items():
        print(f"{name:>32}: {value}")
    failed = [name for name in (*MUST_BE_ZERO, "victim refused or failed") if figures.get(name)]
    if failed:
        print("FAILED:", ", ".join(failed))
        return 1
    print(
        "OK: nothing lost, nothing performed twice, every acknowledged write stored"
        + ("" if flooded is None else ", the victim served through the flood")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
