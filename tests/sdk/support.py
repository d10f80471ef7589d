"""Helpers of the SDK tests: a real server process that can be stopped and started again,
and agent processes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).absolute().parent.parent.parent
# The SDK's own folder: put on sys.path alone, it is all an agent needs.
SDK_SRC = ROOT / "sdk" / "src"
AGENT = Path(__file__).absolute().parent / "agent.py"
# Quick retries, so that a test of a server that is away takes a second, not a minute.
FAST: dict[str, Any] = {"retries": 2, "backoff": 0.05, "max_backoff": 0.5, "timeout": 5.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Any, timeout: float = 15.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ServerProcess:
    """gunicorn serving the test database on a fixed loopback port; stop() and start() again."""

    def __init__(self, database_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "DATABASE_URL": database_url, "DB_CONN_MAX_AGE": "0"}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "durability.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=self.env,
        )
        wait_until(self._answers, 30, "the server to start")

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(15)
        self.process = None

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
