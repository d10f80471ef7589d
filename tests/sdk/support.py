"""Helpers of the SDK tests: a real server process that can be stopped and started again,
and agent processes."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

from django.db import connection

from benchmarks.server import web_command

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
    """granian serving the test database on a loopback port, as the deploy unit does (two
    workers, unless asked for fewer); stop() and start() again, or restart() it as
    `systemctl reload` does; close() kills it.

    The port is this object's from its creation to close(): while the server is stopped a
    socket that does not listen keeps it (a client is refused, as by any server away) so that
    nobody else is given it. granian binds the port itself (each worker its own socket, with
    SO_REUSEPORT), so the holder lets it go just before a start: should someone take it in
    that instant, granian exits and the start is tried again on a new port (read `url` after
    start()).
    """

    def __init__(
        self,
        database_url: str,
        *,
        access_log: Path | None = None,
        workers: int = 2,
        keep_connections: bool = False,
    ) -> None:
        self.env = {**os.environ, "DATABASE_URL": database_url, "DB_CONN_MAX_AGE": "0"}
        if keep_connections:
            # The deploy's default instead (DB_CONN_MAX_AGE unset: 60 s): each blocking thread
            # keeps its connection, and a request pays for no new PostgreSQL backend (measured
            # here: ~5 ms of CPU and ~14 ms of wall time per request on a loaded machine).
            del self.env["DB_CONN_MAX_AGE"]
        # The deploy unit's two; one where a test needs no second (each loads Django: a
        # second of CPU on a machine the tests share).
        self.workers = workers
        # The access log, one line per request: the answering worker's pid, the method,
        # the path and the status.
        self.access_log = access_log
        self.process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = self._bind(0)
        self.port = self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        for _ in range(5):
            if self._socket is None:
                self._socket = self._bind(0)
            self.port = self._socket.getsockname()[1]
            self._socket.close()
            self._socket = None
            # A session of its own: close() ends the server and its workers together.
            self.process = subprocess.Popen(
                self._command(), cwd=ROOT, env=self.env, start_new_session=True
            )
            try:
                wait_until(self._answers, 60, "the server to start")
                return
            except ServerDied:
                self.process = None
        raise AssertionError("the server did not start on five ports in turn")

    def restart(self) -> None:
        """Replace every worker while the port stays open (`systemctl reload`: SIGHUP);
        returns once the server answers from new workers only."""
        assert self.process is not None
        before = set(self.worker_pids())
        self.process.send_signal(signal.SIGHUP)
        wait_until(
            lambda: (
                len(set(self.worker_pids()) - before) == 2 and not before & set(self.worker_pids())
            ),
            120,
            "the workers to be replaced",
        )

    def worker_pids(self) -> list[int]:
        assert self.process is not None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()]

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(30)
        self.process = None
        try:
            self._socket = self._bind(self.port)
        except OSError:
            self._socket = None  # taken in between: start() binds a new port

    def close(self) -> None:
        """The end of a test's server: killed with its workers (SIGKILL), not stopped as
        stop() does (a test that means to stop it gracefully calls stop()). A graceful stop
        here would only cost time, up to the deploy unit's --workers-kill-timeout (25 s) where
        a worker does not stop (a worker granian started in place of a killed one)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
            self.process = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _command(self) -> list[str]:
        """The deploy unit's command, with self.workers workers and the access log to
        self.access_log if asked (pid, method, path, status), else none."""
        if self.access_log is None:
            return web_command(self.port, workers=self.workers, access_log=False)
        config = json.loads((ROOT / "deploy" / "granian-logging.json").read_text())
        config["handlers"]["access"] = {
            "formatter": "access",
            "class": "logging.FileHandler",
            "filename": str(self.access_log),
        }
        logging = self.access_log.with_suffix(".logging.json")
        logging.write_text(json.dumps(config))
        return web_command(
            self.port,
            workers=self.workers,
            log_config=logging,
            access_format="%(method)s %(path)s %(status)d",
        )

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
        assert self.process is not None
        if self.process.poll() is not None:
            raise ServerDied(f"the server exited with {self.process.returncode}")
        # Any answer (a redirect to HTTPS too, when the settings ask for it), not followed.
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            connection.request("GET", "/api/v1/openapi.json")
            return connection.getresponse().status in (200, 301)
        except OSError:
            return False
        finally:
            connection.close()


class ServerDied(AssertionError):
    """The server process exited (its port taken, or a failure its stderr shows)."""


def access_lines(log: Path) -> list[list[str]]:
    """The access log of a ServerProcess: (pid, method, path, status) per request answered."""
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def worker_connections(server: ServerProcess) -> list[http.client.HTTPConnection]:
    """A keep-alive connection to each of the server's two workers (a connection stays with the
    worker that accepted it; which one does is the kernel's pick): new ones are opened until
    both workers have answered one. Needs the server's access log, which says who answered."""
    log = server.access_log
    assert log is not None, "the server keeps no access log"
    kept: dict[str, http.client.HTTPConnection] = {}
    for n in range(200):
        # A path of its own, so that its line is found whatever else the log holds (a line
        # of another request, the server's start for one, may be written after this one's).
        probe = f"/api/v1/worker-probe-{n}"
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("GET", probe)
        connection.getresponse().read()

        def answered(probe: str = probe) -> list[str]:
            return [line[0] for line in access_lines(log) if line[2:3] == [probe]]

        wait_until(lambda: answered() != [], 30, "the access log")  # noqa: B023
        pid = answered()[0]
        if pid in kept:
            connection.close()
        else:
            kept[pid] = connection
        if len(kept) == 2:
            return list(kept.values())
    raise AssertionError("200 connections in turn were all accepted by one worker")


def post_login(
    connection: http.client.HTTPConnection,
    username: str,
    password: str,
    headers: dict[str, str] | None = None,
) -> int:
    """A fresh browser session (its own cookies) on `connection`'s worker that gets the login
    form and submits it (both with `headers`, a proxy's); the answer's status."""
    connection.request("GET", "/login/", headers=headers or {})
    page = connection.getresponse()
    html = page.read().decode()
    cookies = SimpleCookie()
    for header in page.headers.get_all("Set-Cookie") or []:
        cookies.load(header)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    form = {"csrfmiddlewaretoken": token[1], "username": username, "password": password}
    connection.request(
        "POST",
        "/login/",
        body=urllib.parse.urlencode(form),
        headers={
            **(headers or {}),
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": "; ".join(f"{name}={morsel.value}" for name, morsel in cookies.items()),
        },
    )
    answer = connection.getresponse()
    answer.read()
    return answer.status


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
