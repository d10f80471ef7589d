"""What the benchmarks that speak HTTP share: manage.py, a free port, the web server as the
deploy unit starts it (granian), the reports of their client processes, and the statistics
autovacuum would keep."""

from __future__ import annotations

import multiprocessing as mp
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "tallybook-web.service"


def deployed_command() -> list[str]:
    """The deploy unit's ExecStart, as argv (systemd's %% read as %)."""
    found = re.search(r"^ExecStart=(.*)$", UNIT.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{UNIT} has no ExecStart")
    return shlex.split(found[1].replace("%%", "%"))


def deployed(flag: str) -> int:
    """A number the web server is started with by the deploy unit (`--workers`,
    `--blocking-threads`): the benchmarks serve as production does unless told otherwise."""
    argv = deployed_command()
    if flag not in argv:
        raise SystemExit(f"{UNIT} starts granian without {flag}")
    return int(argv[argv.index(flag) + 1])


def web_command(
    port: int,
    *,
    workers: int | None = None,
    threads: int | None = None,
    log_config: Path | None = None,
    access_log: bool = True,
    access_format: str | None = None,
) -> list[str]:
    """The deploy unit's web server command run by this interpreter on 127.0.0.1:`port`: the
    same options, but for those given here (`threads`: granian's --blocking-threads)."""
    argv = deployed_command()
    if not argv[0].endswith("/granian"):
        raise SystemExit(f"{UNIT} does not start granian")
    argv = [sys.executable, "-m", "granian", *argv[1:]]
    given = {
        "--port": str(port),
        "--workers": None if workers is None else str(workers),
        "--blocking-threads": None if threads is None else str(threads),
        "--log-config": str(log_config or ROOT / argv[argv.index("--log-config") + 1]),
        "--access-log-fmt": access_format,
    }
    for flag, value in given.items():
        if value is not None:
            argv[argv.index(flag) + 1] = value
    if not access_log:
        at = argv.index("--access-log-fmt")
        del argv[at : at + 2]
        argv.remove("--access-log")
    return argv


def analyzed(dsn: str) -> None:
    """ANALYZE the database, as autovacuum does a table once 50 rows and 10% of it changed
    (within a minute). This machine's PostgreSQL runs with autovacuum off (CI's settings);
    a table never analyzed misleads the planner as it grows: an effect looked for by its key
    is then read through the project's (project, id) index, every effect of the project
    filtered. The benchmarks analyze before each round, so both paths meet the plans a
    production database has."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


def manage(env: dict[str, str], *args: str) -> str:
    """Run a management command against `env`'s database; its standard output."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A production process on plain HTTP on 127.0.0.1: no redirect to HTTPS, cookies over HTTP.
PLAIN_HTTP = {"SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0"}


@contextmanager
def web(env: dict[str, str], workers: int, threads: int | None = None) -> Iterator[int]:
    """Tallybook under granian on a free port, as the deploy unit starts it (no access log:
    it would fill the benchmark's output), once it answers; stopped on the way out. Blocking
    threads per worker as the deploy unit has them unless given."""
    port = free_port()
    env = {**env, **PLAIN_HTTP}
    server = subprocess.Popen(
        web_command(port, workers=workers, threads=threads, access_log=False), cwd=ROOT, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/openapi.json"):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(30)


def _ended(process: mp.Process) -> str:
    code = process.exitcode
    assert code is not None
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
    return f"benchmark worker {process.name} (pid {process.pid}) {how}"


def next_report(out: mp.Queue[Any], procs: Sequence[mp.Process]) -> Any:
    """The next report a worker puts on `out`. Should a worker end without it (an exception,
    its traceback printed above; a kill), SystemExit naming the worker and its exit code, the
    other workers stopped, instead of a wait for ever."""
    while True:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if not failed and any(p.exitcode is None for p in procs):
                continue
            for p in procs:
                p.terminate()
            if failed:
                raise SystemExit("; ".join(_ended(p) for p in failed)) from None
            raise SystemExit("the benchmark workers all exited with a report missing") from None


def join_workers(procs: Sequence[mp.Process]) -> None:
    """Wait for the workers to end; SystemExit naming any that failed."""
    for p in procs:
        p.join()
    if failed := [p for p in procs if p.exitcode != 0]:
        raise SystemExit("; ".join(_ended(p) for p in failed))
