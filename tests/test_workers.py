"""The worker and the scheduler outlive Redis: killed and started again under them, they
reconnect on their own, and the deadline sweep goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import django_rq
import pytest
import redis
from django.utils import timezone

from durability.ledger import jobs as ledger_jobs
from durability.models import Effect, State
from durability.settings import redis_url_bounded
from tests.ledger.support import effect_in
from tests.sdk.support import database_url_of_tests, wait_until

ROOT = Path(__file__).resolve().parent.parent
# Generous: this machine is shared, and each bound is a condition's, never a speed's.
PATIENCE_S = 120


class RedisServer:
    """A private redis-server on a Unix socket in the test's folder, killed and started again
    on that socket: no other process can be given its address in between, as a TCP port
    could be."""

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", str(self.socket), "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        wait_until(self._answers, PATIENCE_S, "redis-server to start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(PATIENCE_S)
        self.process = None

    def _answers(self) -> bool:
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                return bool(client.ping())
        except redis.ConnectionError:
            return False


class Command:
    """`manage.py <name> <options>` in a process of its own; what it logs lands in a file."""

    def __init__(self, name: str, options: tuple[str, ...], env: dict[str, str], folder: Path):
        self.log = folder / f"{name}.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", name, *options],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def said(self, text: str) -> bool:
        assert self.process.poll() is None, f"it exited:\n{self.output()}"
        return text in self.output()

    def output(self) -> str:
        return self.log.read_text()

    def stopped(self) -> None:
        """Wait for it to end after a SIGTERM (a second one would make rq's worker stop cold)."""
        try:
            self.process.wait(PATIENCE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def private_redis(settings, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    settings.REDIS_URL = server.url
    bounded = redis_url_bounded(server.url)
    settings.RQ_QUEUES = {n: {**q, "URL": bounded} for n, q in settings.RQ_QUEUES.items()}
    yield server
    if server.process is not None:
        server.kill()


@pytest.fixture
def start(private_redis: RedisServer, tmp_path: Path) -> Iterator[object]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url_of_tests(),
        "REDIS_URL": private_redis.url,
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "INFO",
    }
    started: list[Command] = []

    def run(name: str, *options: str) -> Command:
        started.append(Command(name, options, env, tmp_path))
        return started[-1]

    yield run
    # All asked at once: each takes its time to say goodbye to Redis.
    for command in started:
        command.process.terminate()
    for command in started:
        command.stopped()


def scheduler(start) -> Command:
    """The scheduler sweeping every second rather than every five: it notices Redis is away
    when it next enqueues, and the sweep after a restart comes sooner."""
    return start("scheduler", "--pace", "0.2")


def noticed(command: Command) -> bool:
    """rq's worker retries by itself while idle; busy, it gives up and ours starts it again."""
    return command.said("could not connect to Redis") or command.said("lost Redis")


def overdue(project, key: str) -> Effect:
    effect = effect_in(project, State.PENDING, key=key, timeout_s=30)
    Effect.objects.filter(pk=effect.pk).update(deadline=timezone.now() - timedelta(minutes=1))
    return effect


def timed_out(effect: Effect) -> bool:
    effect.refresh_from_db()
    return effect.state == State.TIMED_OUT


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def test_the_worker_runs_jobs_enqueued_after_redis_came_back(project, private_redis, start):
    worker = start("worker")
    wait_until(lambda: worker.said("Listening on"), PATIENCE_S, "the worker to listen")

    private_redis.kill()
    wait_until(lambda: noticed(worker), PATIENCE_S, "the worker to notice")
    private_redis.start()
    late = overdue(project, "late")
    job = django_rq.get_queue("default").enqueue(ledger_jobs.sweep)

    wait_until(lambda: timed_out(late), PATIENCE_S, "the sweep enqueued after the restart")
    wait_until(lambda: job.get_status(refresh=True) == "finished", PATIENCE_S, "its result")
    assert job.return_value() == 1


def test_the_scheduler_keeps_the_deadline_sweep_going_after_redis_came_back(
    project, private_redis, start
):
    start("worker")
    sweeping = scheduler(start)
    first = overdue(project, "before")
    wait_until(lambda: timed_out(first), PATIENCE_S, "the scheduled sweep")

    private_redis.kill()
    wait_until(lambda: sweeping.said("lost Redis"), PATIENCE_S, "the scheduler to notice")
    private_redis.start()
    late = overdue(project, "after")

    wait_until(lambda: timed_out(late), PATIENCE_S, "a sweep scheduled after the restart")
    assert sweeping.process.poll() is None


def test_a_stopped_worker_and_scheduler_exit_while_redis_is_away(private_redis, start):
    worker, sweeping = start("worker"), scheduler(start)
    wait_until(lambda: worker.said("Listening on"), PATIENCE_S, "the worker to listen")
    wait_until(lambda: sweeping.said("registering birth"), PATIENCE_S, "the scheduler")
    private_redis.kill()
    wait_until(lambda: sweeping.said("lost Redis"), PATIENCE_S, "the scheduler to notice")

    for command in (worker, sweeping):
        command.process.terminate()
    for command in (worker, sweeping):
        assert command.process.wait(PATIENCE_S) == 0, command.output()


def test_a_worker_asked_to_stop_before_rq_installs_its_handlers_stops_cleanly(
    private_redis, monkeypatch
):
    """rq logs "Listening on" and takes the scheduler lock before it installs its signal
    handlers: a SIGTERM there (a deploy restarting workers) used to kill the worker
    outright, leaving its registration in Redis."""
    from django.core.management import call_command
    from rq import Worker

    def signalled_while_starting(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Worker, "_start_scheduler", signalled_while_starting)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        call_command("worker")
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)

    connection = redis.Redis.from_url(private_redis.url)
    assert Worker.all(connection=connection) == []
