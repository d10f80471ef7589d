"""Helpers of the SDK tests: a real server process that can be stopped and started again,
and agent processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).absolute().parent.parent.parent
# The SDK's own folder: put on sys.path alone, it is all an agent needs.
SDK_SRC = ROOT / "sdk" / "src"
AGENT = Path(__file__).absolute().parent / "agent.py"
# Quick retries, so that a test of a server that is away takes a second, not a minute; an
# intent budget that a busy machine's slow answer stays within (the default, 2 s, is an agent's:
# a test whose server answers must not fail because the machine is loaded).
FAST: dict[str, Any] = {
    "retries": 2,
    "backoff": 0.05,
    "max_backoff": 0.5,
    "timeout": 30.0,
    "intent_budget": 30.0,
}


def wait_until(predicate: Any, timeout: float = 15.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def alongside(act: Callable[[], None], timeout: float = 120.0) -> Iterator[None]:
    """Run `act` in a thread of its own (a person at the desk) while the block runs.

    The thread's database connection is closed when it ends; the block's end waits for it
    (up to `timeout` seconds) and raises what it raised.
    """
    raised: list[BaseException] = []

    def run() -> None:
        try:
            act()
        except BaseException as exc:
            raised.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout)
    assert not thread.is_alive(), f"the thread running {act.__name__} did not finish"
    if raised:
        raise raised[0]


class ServerProcess:
    """gunicorn serving the test database on a loopback port; stop() and start() again.

    The port is this object's from its creation to close(): gunicorn is handed a socket
    bound here, and while the server is stopped a socket that does not listen keeps the port
    (a client is refused, as by any server away) so that nobody else is given it. Should the
    port be taken all the same, the next start is on a new one: read `url` after start().
    """

    def __init__(self, database_url: str, *, access_log: Path | None = None) -> None:
        self.env = {**os.environ, "DATABASE_URL": database_url, "DB_CONN_MAX_AGE": "0"}
        # gunicorn's access log, one line per request: the answering worker's pid, the
        # method, the path and the status.
        self.logging = (
            ["--access-logfile", str(access_log), "--access-logformat", "%(p)s %(m)s %(U)s %(s)s"]
            if access_log is not None
            else []
        )
        self.process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = self._bind(0)
        self.port = self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._socket is None:
            self._socket = self._bind(0)
        self.port = self._socket.getsockname()[1]
        fd = self._socket.fileno()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "durability.wsgi",
                "--bind",
                f"fd://{fd}",
                "--workers",
                "2",
                "--log-level",
                "warning",
                *self.logging,
            ],
            cwd=ROOT,
            env=self.env,
            pass_fds=[fd],
        )
        wait_until(self._answers, 30, "the server to start")

    def stop(self) -> None:
        assert self.process is not None and self._socket is not None
        self.process.terminate()
        self.process.wait(15)
        self.process = None
        # Ours listens still (it is gunicorn's): swap it for one that only holds the port.
        self._socket.close()
        try:
            self._socket = self._bind(self.port)
        except OSError:
            self._socket = None  # taken in between: start() binds a new port

    def close(self) -> None:
        if self.process is not None:
            self.stop()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    @staticmethod
    def _bind(port: int) -> socket.socket:
        held = socket.socket()
        # The stopped server's connections in TIME_WAIT do not keep us from its port.
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind(("127.0.0.1", port))
        except OSError:
            held.close()
            raise
        return held

    def _answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "the server died"
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/openapi.json", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def database_url_of_tests() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST']}:{s['PORT'] or 5432}/{s['NAME']}"


def run_agent(url: str, key: str, spool: Path, ledger: Path, *args: str) -> tuple[int, Any]:
    """Run tests/sdk/agent.py without site-packages (the SDK needs none); its exit code and
    the JSON line it printed."""
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            str(AGENT),
            "--url",
            url,
            "--key",
            key,
            "--spool",
            str(spool),
            "--ledger",
            str(ledger),
            *args,
        ],
        env={**os.environ, "PYTHONPATH": str(SDK_SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else done.stderr


def find_python(version: str) -> Path:
    """An interpreter of `version` ("3.10"): pyenv's, else one on PATH. Fails if none."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
    if on_path := shutil.which(f"python{version}"):
        candidates.append(Path(on_path))
    for candidate in candidates:
        done = subprocess.run([candidate, "--version"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.startswith(f"Python {version}."):
            return candidate
    raise AssertionError(f"no Python {version} here: the SDK's package is tested on it")
