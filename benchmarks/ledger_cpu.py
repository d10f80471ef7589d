"""What the ledger's four POSTs cost in the web process's CPU: requests through Django's WSGI
handler in process (no HTTP server, no client), timed with `time.process_time`.

    .venv/bin/python benchmarks/ledger_cpu.py [--requests 2000] [--rounds 3] [--db tb_bench_cpu]
    .venv/bin/python benchmarks/ledger_cpu.py --profile intents   # cProfile, top 40
    .venv/bin/python benchmarks/ledger_cpu.py --callgrind 50      # instructions, under valgrind

Creates (dropping it first) the PostgreSQL database named by --db and migrates it. Each round
sends --requests effects through the handler as the web server would call it: for each, `POST
/api/v1/intents` (a new key), then `POST /api/v1/receipts`; and as many again whose intent is
followed by `POST /api/v1/failures` (definitive) or `POST /api/v1/timeouts`. It prints the
median over the rounds of the CPU milliseconds per request of each endpoint, and the
statements and round trips of one intent and one receipt. CPU time, not wall-clock time: on
a machine shared with other work it moves least, but it still moves with the load.
`--callgrind N` counts instead the instructions of N intents, then of their N receipts
(valgrind's callgrind, zeroed and dumped around each through its client requests): they do
not move with the load at all, the figure to compare two versions of the code by (about 4
minutes for N=50). `--code DIR` runs another checkout's code (an older commit's, exported)
with this harness, to compare the two in alternating runs.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://root@127.0.0.1:5432"
ENDPOINTS = ("intents", "receipts", "failures", "timeouts")


def _fresh_database(name: str, *, reuse: bool = False) -> bool:
    """Create the database `name` (dropped first, unless `reuse` and it exists); whether it
    was created."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        if (
            reuse
            and admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        ):
            return False
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    return True


def _against(args: argparse.Namespace) -> None:
    """This checkout and `args.against` in alternating runs of this harness, each in its own
    process on its own database: the medians of their rounds, side by side."""
    codes = {"this": ROOT, "against": args.against.resolve()}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        for name in codes:  # the first run of each creates and migrates it again
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}_{name}"')
    for run in range(args.runs):
        for name, code in codes.items():
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--json",
                    "--reuse",
                    "--code",
                    str(code),
                    "--db",
                    f"{args.db}_{name}",
                    "--requests",
                    str(args.requests),
                    "--rounds",
                    str(args.rounds),
                    "--prefix",
                    f"run{run}",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got[name].append(json.loads(out.splitlines()[-1])["cpu_ms"])
    print(f"{args.runs} alternating runs of {args.rounds} rounds of {args.requests} effects")
    print(f"{'CPU ms per request':24} {'this':>8} {'against':>8}")
    for endpoint in (*ENDPOINTS, "pair"):
        values = []
        for name in codes:
            runs = got[name]
            if endpoint == "pair":
                values.append(statistics.median(r["intents"] + r["receipts"] for r in runs))
            else:
                values.append(statistics.median(r[endpoint] for r in runs))
        print(f"{endpoint:24} {values[0]:8.3f} {values[1]:8.3f}  {values[0] / values[1]:5.2f}x")


def _environ(path: str, body: bytes, key: str) -> dict[str, Any]:
    """A WSGI environ as a WSGI server builds it for a keep-alive POST from the SDK."""
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "HTTP_USER_AGENT": "tallybook-sdk/1.0 Python/3.12",
        "HTTP_ACCEPT": "application/json",
        "HTTP_CONNECTION": "keep-alive",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }


class Harness:
    def __init__(self, key: str, grant: int) -> None:
        from django.core.handlers.wsgi import WSGIHandler

        self.application = WSGIHandler()
        self.key, self.grant = key, grant
        self.status = ""

    def _start(self, status: str, headers: list[tuple[str, str]], *_: Any) -> Any:
        self.status = status
        return None

    def post(self, path: str, document: dict[str, Any]) -> int:
        body = json.dumps(document).encode()
        result = self.application(_environ(path, body, self.key), self._start)
        try:
            for _chunk in result:
                pass
        finally:
            result.close()
        return int(self.status[:3])

    def intent(self, key: str, i: int) -> int:
        return self.post(
            "/api/v1/intents",
            {
                "key": key,
                "kind": "payment",
                "target": "stripe",
                "request": {"order": i, "amount": 1250},
                "timeout_s": 300,
                "context": {"workflow": "bench", "workflow_version": "1"},
                "authority": {"grant": self.grant},
            },
        )

    def receipt(self, key: str) -> int:
        return self.post(
            "/api/v1/receipts", {"key": key, "system": "stripe", "external_id": f"re_{key}"}
        )

    def failure(self, key: str) -> int:
        return self.post(
            "/api/v1/failures", {"key": key, "error": "card_declined", "definitive": True}
        )

    def timeout(self, key: str) -> int:
        return self.post("/api/v1/timeouts", {"key": key, "reason": "no answer in 300 s"})


def _timed(spent: list[float], act: Callable[[], int], status: int) -> None:
    start = time.process_time()
    got = act()
    spent.append(time.process_time() - start)
    assert got == status, (got, status)


def round_of(h: Harness, prefix: str, n: int) -> dict[str, float]:
    """CPU ms per request of each endpoint over `n` effects (and n/2 each for failures and
    timeouts, whose effects' intents count with the intents)."""
    spent: dict[str, list[float]] = {name: [] for name in ENDPOINTS}
    for i in range(n):
        key = f"{prefix}:{i}"
        _timed(spent["intents"], lambda: h.intent(key, i), 201)  # noqa: B023
        _timed(spent["receipts"], lambda: h.receipt(key), 201)  # noqa: B023
    for i in range(n // 2):
        key = f"{prefix}:f{i}"
        _timed(spent["intents"], lambda: h.intent(key, i), 201)  # noqa: B023
        _timed(spent["failures"], lambda: h.failure(key), 200)  # noqa: B023
        key = f"{prefix}:t{i}"
        _timed(spent["intents"], lambda: h.intent(key, i), 201)  # noqa: B023
        _timed(spent["timeouts"], lambda: h.timeout(key), 200)  # noqa: B023
    return {name: sum(values) / len(values) * 1000 for name, values in spent.items()}


CALLGRIND_HELPER = r"""
#include <valgrind/callgrind.h>
void tb_zero(void) { CALLGRIND_ZERO_STATS; }
void tb_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""


def _callgrind(args: argparse.Namespace) -> None:
    """Run this harness under callgrind (`--callgrind-child`) and print the instructions per
    intent and per receipt from its dumps."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ledger_cpu_") as tmp:
        helper = Path(tmp) / "callgrind_helper.so"
        source = Path(tmp) / "callgrind_helper.c"
        source.write_text(CALLGRIND_HELPER)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", helper, source], check=True)
        out = Path(tmp) / "callgrind.out"
        subprocess.run(  # created and migrated outside valgrind (minutes inside it)
            [sys.executable, __file__, "--db", args.db, "--reuse", "--requests", "2",
             "--rounds", "1", "--json", "--prefix", f"migrate{os.getpid()}"],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--db", args.db, "--reuse", "--code", str(args.code),
             "--prefix", args.prefix or f"cg{os.getpid()}", "--callgrind-child", str(helper),
             "--callgrind", str(args.callgrind)],
            check=True, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # the same sets' layouts each run
        )  # fmt: skip
        n = args.callgrind
        print(f"callgrind: instructions of {n} intents, then of their {n} receipts")
        for dump in sorted(Path(tmp).glob("callgrind.out.*")):
            text = dump.read_text()
            lines = text.splitlines()
            name = next(ln for ln in lines if ln.startswith("desc: Trigger:")).split()[-1]
            if name not in ("intents", "receipts"):
                continue
            instructions = int(next(ln for ln in lines if ln.startswith("summary:")).split()[1])
            print(f"POST /api/v1/{name:9} {instructions / n / 1e6:6.3f} M instructions per request")


def _callgrind_child(h: Harness, args: argparse.Namespace) -> None:
    """Under callgrind: counted, `args.callgrind` intents, then their receipts."""
    import ctypes

    helper = ctypes.CDLL(args.callgrind_child)
    # The warm process's objects out of the collector's way: a full collection falling in
    # one run's count and not in another's would cost more than most cuts save.
    gc.collect()
    gc.freeze()
    n, prefix = args.callgrind, args.prefix
    for endpoint, act in (
        ("intents", lambda i: h.intent(f"{prefix}:{i}", i)),
        ("receipts", lambda i: h.receipt(f"{prefix}:{i}")),
    ):
        helper.tb_zero()
        for i in range(n):
            act(i)
        helper.tb_dump(endpoint.encode())


def _statements(h: Harness, prefix: str) -> dict[str, tuple[int, int]]:
    """Statements and round trips of one intent and one receipt (pipelines count once)."""
    from tests.round_trips import cost

    out = {}
    with cost() as spent:
        h.intent(f"{prefix}count:1", 1)
    out["intents"] = (len(spent.statements), spent.round_trips)
    with cost() as spent:
        h.receipt(f"{prefix}count:1")
    out["receipts"] = (len(spent.statements), spent.round_trips)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="effects per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", default="tb_bench_cpu")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose code runs")
    parser.add_argument("--profile", choices=ENDPOINTS, help="cProfile one endpoint instead")
    parser.add_argument("--profile-out", help="with --profile: save the stats (pstats) here")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    parser.add_argument("--against", type=Path, help="compare with this checkout's code")
    parser.add_argument("--runs", type=int, default=4, help="alternating runs for --against")
    parser.add_argument("--reuse", action="store_true", help="keep --db if it exists")
    parser.add_argument("--prefix", default="", help="of the effects' keys (with --reuse)")
    parser.add_argument("--callgrind", type=int, help="count instructions of this many effects")
    parser.add_argument("--callgrind-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        _against(args)
        return
    if args.callgrind and not args.callgrind_child:
        _callgrind(args)
        return

    created = _fresh_database(args.db, reuse=args.reuse)
    os.environ.update(
        DATABASE_URL=f"{PG}/{args.db}",
        DJANGO_SETTINGS_MODULE="durability.settings",
        DEBUG="0",
        LOG_LEVEL="ERROR",
        SECURE_SSL_REDIRECT="0",
        SESSION_COOKIE_SECURE="0",
        CSRF_COOKIE_SECURE="0",
    )
    os.environ.pop("REDIS_URL", None)  # as the HTTP benchmark runs its server
    sys.path.insert(0, str(args.code))
    os.chdir(args.code)
    import django

    django.setup()
    from django.core.management import call_command

    from durability.authority.grants import Terms, grant_create
    from durability.models import ApiKey, Project

    if created:
        call_command("migrate", verbosity=0)
    project, _ = Project.objects.get_or_create(name="bench-cpu")
    _, key = ApiKey.issue(project=project, name="bench")
    terms = Terms(name="bench", kinds=["payment"], targets=["stripe"])
    grant = grant_create(project=project, actor="system:bench", terms=terms).pk

    h = Harness(key, grant)
    prefix = args.prefix
    # imports, caches, prepared statements (fewer under valgrind: a request is ~50× slower)
    round_of(h, f"{prefix}warm", 10 if args.callgrind_child else 50)
    if args.callgrind_child:
        _callgrind_child(h, args)
        return
    if args.profile:
        profiler = cProfile.Profile(time.process_time)
        n = args.requests
        acts: dict[str, Callable[[int], int]] = {
            "intents": lambda i: h.intent(f"p:{i}", i),
            "receipts": lambda i: h.receipt(f"p:{i}"),
            "failures": lambda i: h.failure(f"p:{i}"),
            "timeouts": lambda i: h.timeout(f"p:{i}"),
        }
        if args.profile != "intents":
            for i in range(n):
                h.intent(f"p:{i}", i)
        act = acts[args.profile]
        profiler.enable()
        for i in range(n):
            act(i)
        profiler.disable()
        if args.profile_out:
            profiler.dump_stats(args.profile_out)
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(45)
        return
    rounds = [round_of(h, f"{prefix}r{r}", args.requests) for r in range(args.rounds)]
    medians = {name: statistics.median(r[name] for r in rounds) for name in ENDPOINTS}
    counted = _statements(h, prefix) if (args.code / "tests" / "round_trips.py").exists() else {}
    if args.json:
        print(json.dumps({"cpu_ms": medians, "statements": counted}))
        return
    print(f"{args.rounds} rounds of {args.requests} effects, code: {args.code}")
    for name in ENDPOINTS:
        print(f"POST /api/v1/{name:9} {medians[name]:6.3f} ms CPU per request")
    print(f"an intent and its receipt: {medians['intents'] + medians['receipts']:.3f} ms CPU")
    for name, (statements, trips) in counted.items():
        print(f"{name}: {statements} statements, {trips} round trips")


if __name__ == "__main__":
    main()
