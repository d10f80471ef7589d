"""Intent + receipt pairs through HTTP (granian as deployed, on loopback) against the same
writes through raw psycopg, and the same over HTTP with the receipts in batches (as the SDK's
sender sends a spool), in alternating rounds on one PostgreSQL database.

    .venv/bin/python benchmarks/ledger_http_vs_psycopg.py [--pairs 4000] [--clients 8]

Prints the load average at the start and the end, effects/s for each path and their ratio to
raw, the p50/p99 latency of POST /intents under that load, and (on Linux, from /proc) the core
milliseconds an effect costs on each path, by whom: the whole machine, the web server,
PostgreSQL's backends of the run's database (raw's read by each client before it closes its
connection) and the clients, and
all three together against raw's; what the server spends on a request it refuses at
validation; then, at light load (one client, one keep-alive connection, --light pairs), the
p50/p99 of POST /intents and of POST /receipts. It creates (and drops at the start) the
database named by --db; `measure()` is the same run for benchmarks/run_all.py.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
# The HTTP benchmarks' shared helpers beside this script (its folder is first on sys.path).
server = importlib.import_module("server")
PG = "postgres://root@127.0.0.1:5432"


def _http_pairs(
    port: int, key: str, grant: int, prefix: str, count: int
) -> tuple[list[float], list[float]]:
    """`count` intent + receipt pairs on one keep-alive connection; the latencies of the
    intents and of the receipts, in seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    intents, receipts = [], []
    for i in range(count):
        effect_key = f"{prefix}:{i}"
        body = json.dumps(
            {
                "key": effect_key,
                "kind": "payment",
                "target": "stripe",
                "request": {"order": i, "amount": 1250},
                "timeout_s": 300,
                "context": {"workflow": "bench", "workflow_version": "1"},
                "authority": {"grant": grant},
            }
        )
        start = time.perf_counter()
        conn.request("POST", "/api/v1/intents", body, headers)
        response = conn.getresponse()
        response.read()
        intents.append(time.perf_counter() - start)
        assert response.status == 201, response.status
        start = time.perf_counter()
        conn.request(
            "POST",
            "/api/v1/receipts",
            json.dumps({"key": effect_key, "system": "stripe", "external_id": f"re_{prefix}_{i}"}),
            headers,
        )
        response = conn.getresponse()
        response.read()
        receipts.append(time.perf_counter() - start)
        assert response.status == 201, response.status
    conn.close()
    return intents, receipts


def _http_worker(
    port: int, key: str, grant: int, prefix: str, count: int, out: mp.Queue[list[float]]
) -> None:
    out.put(_http_pairs(port, key, grant, prefix, count)[0])


# Receipts per batch on the batched path: what an SDK's sender finds piled up in its spool
# when its agent performs effects faster than one round trip each.
BATCH = 20


def _http_batched_worker(
    port: int, key: str, grant: int, prefix: str, count: int, out: mp.Queue[list[float]]
) -> None:
    """`count` intents one by one, their receipts BATCH at a time (POST /receipts/batch)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    waiting: list[dict[str, str]] = []
    for i in range(count):
        effect_key = f"{prefix}:{i}"
        body = {
            "key": effect_key,
            "kind": "payment",
            "target": "stripe",
            "request": {"order": i, "amount": 1250},
            "timeout_s": 300,
            "context": {"workflow": "bench", "workflow_version": "1"},
            "authority": {"grant": grant},
        }
        conn.request("POST", "/api/v1/intents", json.dumps(body), headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 201, response.status
        waiting.append({"key": effect_key, "system": "stripe", "external_id": f"re_{effect_key}"})
        if len(waiting) == BATCH or i == count - 1:
            conn.request(
                "POST", "/api/v1/receipts/batch", json.dumps({"receipts": waiting}), headers
            )
            response = conn.getresponse()
            results = json.loads(response.read())["results"]
            assert response.status == 207 and {r["status"] for r in results} == {201}, results
            waiting = []
    conn.close()
    out.put([])


def _one(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    row: tuple[Any, ...] | None = cur.fetchone()
    assert row is not None
    return row


def _audit(
    cur: psycopg.Cursor[Any],
    project_id: int,
    action: str,
    effect_id: int,
    from_state: str,
    to_state: str,
) -> None:
    """The same chained audit append the server does: read the effect's chain head, insert,
    move the head."""
    cur.execute(
        "SELECT audit_seq, audit_head FROM durability_effect WHERE id = %s FOR NO KEY UPDATE",
        (effect_id,),
    )
    seq, prev = _one(cur)
    seq += 1
    digest = hashlib.sha256(f"{prev}{seq}{action}{effect_id}".encode()).hexdigest()
    cur.execute(
        "INSERT INTO durability_auditentry (project_id, seq, at, actor, action, effect_id, "
        "case_id, from_state, to_state, data, data_digest, prev_hash, hash) "
        "VALUES (%s, %s, now(), 'bench', %s, %s, NULL, %s, %s, '{}', %s, %s, %s)",
        (project_id, seq, action, effect_id, from_state, to_state, EMPTY_DIGEST, prev, digest),
    )
    cur.execute(
        "UPDATE durability_effect SET audit_seq = %s, audit_head = %s WHERE id = %s",
        (seq, digest, effect_id),
    )


# The digest of an entry's empty data, which the ledger's entries store beside it.
EMPTY_DIGEST = hashlib.sha256(b"{}").hexdigest()


def _raw_worker(
    dsn: str, project_id: int, grant: int, prefix: str, count: int, out: mp.Queue[list[float]]
) -> None:
    authority = json.dumps({"grant": grant})
    with psycopg.connect(dsn) as conn:
        for i in range(count):
            key = f"{prefix}:{i}"
            request = json.dumps({"order": i, "amount": 1250})
            fingerprint = hashlib.sha256(request.encode()).hexdigest()
            claim = hashlib.sha256(f"payment|stripe|{authority}".encode()).hexdigest()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "SELECT id FROM durability_effect WHERE project_id = %s AND key = %s "
                    "FOR UPDATE",
                    (project_id, key),
                )
                cur.execute(
                    "INSERT INTO durability_effect (project_id, key, kind, target, fingerprint, "
                    "request, replay, state, late, timeout_s, deadline, authority, run_id, "
                    "tool_call_id, trace_id, span_id, attempt_count, created, updated, audit_seq, "
                    "audit_head, currency, grant_id, claim, agent, workflow) VALUES (%s, %s, "
                    "'payment', 'stripe', %s, %s, 'never', 'pending', false, 300, "
                    "now() + interval '300 seconds', %s, '', '', '', '', 1, now(), now(), 0, "
                    "repeat('0', 64), '', %s, %s, 'bench', 'bench') "
                    "RETURNING id",
                    (project_id, key, fingerprint, request, authority, grant, claim),
                )
                (effect_id,) = _one(cur)
                cur.execute(
                    "INSERT INTO durability_attempt (project_id, effect_id, number, started, "
                    "deadline, context, run_id, worker, trace_id, span_id) VALUES (%s, %s, 1, "
                    "now(), now() + interval '300 seconds', %s, '', '', '', '')",
                    (
                        project_id,
                        effect_id,
                        json.dumps({"workflow": "bench", "workflow_version": "1"}),
                    ),
                )
                cur.execute(
                    "SELECT id FROM durability_receipt WHERE project_id = %s AND key = %s "
                    "AND effect_id IS NULL",
                    (project_id, key),
                )
                _audit(cur, project_id, "intent", effect_id, "", "pending")
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "SELECT id, state FROM durability_effect WHERE project_id = %s AND key = %s "
                    "FOR UPDATE",
                    (project_id, key),
                )
                effect_id, _ = _one(cur)
                cur.execute(
                    "SELECT id FROM durability_receipt WHERE project_id = %s AND key = %s AND "
                    "system = 'stripe' AND external_id = %s",
                    (project_id, key, f"re_{key}"),
                )
                cur.execute(
                    "INSERT INTO durability_receipt (project_id, effect_id, key, system, "
                    "external_id, observed_at, data, strength, attempt, trace_id, span_id, late, "
                    "received, currency, target) VALUES (%s, %s, %s, 'stripe', %s, NULL, NULL, "
                    "'agent_reported', NULL, '', '', false, now(), '', '')",
                    (project_id, effect_id, key, f"re_{key}"),
                )
                cur.execute(
                    "UPDATE durability_effect SET state = 'succeeded', updated = now() "
                    "WHERE id = %s",
                    (effect_id,),
                )
                _audit(cur, project_id, "receipt", effect_id, "pending", "succeeded")
        # Before the connection closes and its backend ends with what it spent.
        out.put([backend_seconds(conn)])


def _refused_worker(port: int, key: str, count: int, out: mp.Queue[list[float]]) -> None:
    """`count` intents refused at validation (a 400 after the key and the body were read):
    what serving a request costs before the ledger does anything."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps({"key": "k", "kind": "payment", "target": "stripe", "timeout_s": "300"})
    for _ in range(count):
        conn.request("POST", "/api/v1/intents", body, headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 400, response.status
    conn.close()
    out.put([])


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY = (0, 1, 2, 5, 6, 7)  # /proc/stat: user, nice, system, irq, softirq, steal


def core_seconds(db: str = "") -> dict[str, float]:
    """CPU seconds used so far: by the whole machine, by the web server (granian), by the
    PostgreSQL backends serving database `db` (the server is shared: other databases' backends
    and its own background processes are not this run's), and by this process's finished
    children (the clients). A backend that has ended is gone from /proc: raw's clients read
    their own backend's before they close (`backend_seconds`). Empty where there is no /proc
    (not Linux)."""
    if not os.path.exists("/proc/stat"):
        return {}
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    used = {"machine": sum(int(fields[i]) for i in _BUSY) / _TICK, "server": 0.0, "postgres": 0.0}
    backend = f" {db} ".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                times = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = (
            "server"
            if b"granian" in b" ".join(command[:4])
            else "postgres"
            if command[0].startswith(b"postgres:") and backend in command[0]
            else None
        )
        if kind is not None:
            used[kind] += (int(times[11]) + int(times[12])) / _TICK
    children = os.times()
    used["clients"] = children.children_user + children.children_system
    return used


def backend_seconds(conn: psycopg.Connection[Any]) -> float:
    """The CPU seconds the backend of `conn` has used (0 where there is no /proc)."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/stat") as f:
            times = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(times[11]) + int(times[12])) / _TICK


def _spent(before: dict[str, float], after: dict[str, float], into: dict[str, float]) -> None:
    for name, value in after.items():
        into[name] = into.get(name, 0.0) + value - before.get(name, 0.0)


def _run(
    target: Callable[..., None],
    args_of: Callable[[int], tuple[object, ...]],
    clients: int,
    cpu: dict[str, float] | None = None,
    db: str = "",
) -> tuple[float, list[float]]:
    """Run `clients` workers at once; the wall time and their latencies. With `cpu`, adds
    the core seconds spent meanwhile (`core_seconds`) to it."""
    before = core_seconds(db) if cpu is not None else {}
    out: mp.Queue[list[float]] = mp.Queue()
    procs = [mp.Process(target=target, args=(*args_of(c), out)) for c in range(clients)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    latencies = []
    for _ in procs:
        latencies.extend(server.next_report(out, procs))
    server.join_workers(procs)
    elapsed = time.perf_counter() - start
    if cpu is not None:
        _spent(before, core_seconds(db), cpu)
    return elapsed, latencies


GRANT = """
from durability.authority.grants import Terms, grant_create
from durability.models import Project
for name in ("bench-http", "bench-raw"):
    project = Project.objects.get(name=name)
    terms = Terms(name="bench", kinds=["payment"], targets=["stripe"])
    print(grant_create(project=project, actor="system:bench", terms=terms).pk)
"""


def percentile(values: list[float], q: float) -> float:
    """The q-th quantile (0 < q < 1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(len(ordered) * q + 0.5) - 1))]


def measure(
    *,
    pairs: int,
    clients: int,
    workers: int,
    rounds: int,
    light: int,
    db: str,
    threads: int | None = None,
) -> dict[str, Any]:
    """The whole run on a fresh database `db`: effects/s of both paths over `rounds`
    alternating rounds, the intents' latencies under that load, then `light` pairs from one
    client; and what `verifyaudit` says of the HTTP project's chain afterwards."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}"')
        admin.execute(f'CREATE DATABASE "{db}"')
    dsn = f"{PG}/{db}"
    env = {**os.environ, "DATABASE_URL": dsn, "DEBUG": "0", "LOG_LEVEL": "ERROR"}
    env.pop("REDIS_URL", None)
    server.manage(env, "migrate", "--verbosity", "0")
    key = server.manage(env, "createapikey", "bench-http").strip().splitlines()[-1]
    server.manage(env, "createapikey", "bench-raw")
    http_grant, raw_grant = (int(n) for n in server.manage(env, "shell", "-c", GRANT).split()[-2:])
    with psycopg.connect(dsn) as conn:
        (raw_project,) = _one(
            conn.execute("SELECT id FROM durability_project WHERE name = 'bench-raw'")
        )

    threads = server.deployed("--blocking-threads") if threads is None else threads
    per_round = max(1, pairs // clients // rounds)
    pairs = per_round * clients * rounds

    http_time = raw_time = batched_time = 0.0
    latencies: list[float] = []
    http_cpu: dict[str, float] = {}
    batched_cpu: dict[str, float] = {}
    load_start = os.getloadavg()
    raw_cpu: dict[str, float] = {}
    refused_cpu: dict[str, float] = {}
    with server.web(env, workers, threads) as port:
        # Warm up each worker's imports and connections.
        _run(_http_worker, lambda c: (port, key, http_grant, f"warm{c}", 20), workers)
        # The paths alternate in rounds, so that both meet the same load on the machine.
        for r in range(rounds):
            server.analyzed(dsn)
            elapsed, lat = _run(
                _http_worker,
                lambda c: (port, key, http_grant, f"h{r}.{c}", per_round),  # noqa: B023
                clients,
                http_cpu,
                db,
            )
            http_time += elapsed
            latencies.extend(lat)
            elapsed, backends = _run(
                _raw_worker,
                lambda c: (dsn, raw_project, raw_grant, f"r{r}.{c}", per_round),  # noqa: B023
                clients,
                raw_cpu,
                db,
            )
            raw_time += elapsed
            # Raw's backends ended with their clients: what they spent, as each client read
            # it (on top of any other backend of the database: none while raw runs).
            raw_cpu["postgres"] = raw_cpu.get("postgres", 0.0) + sum(backends)
            elapsed, _ = _run(
                _http_batched_worker,
                lambda c: (port, key, http_grant, f"b{r}.{c}", per_round),  # noqa: B023
                clients,
                batched_cpu,
                db,
            )
            batched_time += elapsed
        refused = per_round * 2  # as many requests per client as a round's pairs have
        _run(_refused_worker, lambda c: (port, key, refused), clients, refused_cpu, db)
        light_intents, light_receipts = _http_pairs(port, key, http_grant, "light", light)
    audit = subprocess.run(
        [sys.executable, "manage.py", "verifyaudit", "--project", "bench-http"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    return {
        "pairs": pairs,
        "rounds": rounds,
        "clients": clients,
        "workers": workers,
        "threads": threads,
        "http_rate": pairs / http_time,
        "raw_rate": pairs / raw_time,
        "batched_rate": pairs / batched_time,
        "batch": BATCH,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "loaded_p50": statistics.median(latencies),
        "loaded_p99": percentile(latencies, 0.99),
        "light": light,
        "intent_p50": statistics.median(light_intents),
        "intent_p99": percentile(light_intents, 0.99),
        "receipt_p50": statistics.median(light_receipts),
        "receipt_p99": percentile(light_receipts, 0.99),
        # Core milliseconds per pair (per request for `refused_cpu`), by whom they were spent.
        "http_cpu": {name: 1000 * spent / pairs for name, spent in http_cpu.items()},
        "batched_cpu": {name: 1000 * spent / pairs for name, spent in batched_cpu.items()},
        "raw_cpu": {name: 1000 * spent / pairs for name, spent in raw_cpu.items()},
        "refused_cpu": {
            name: 1000 * spent / (refused * clients) for name, spent in refused_cpu.items()
        },
        "verifyaudit": (audit.stdout + audit.stderr).strip(),
        "verifyaudit_ok": audit.returncode == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=4000, help="intent+receipt pairs per path")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client processes")
    parser.add_argument(
        "--workers",
        type=int,
        default=server.deployed("--workers"),
        help="granian worker processes (default: deploy/systemd's)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=server.deployed("--blocking-threads"),
        help="granian blocking threads per worker, the threads that run Django (default: "
        "deploy/systemd's)",
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="alternating HTTP / raw / batched rounds"
    )
    parser.add_argument("--light", type=int, default=1000, help="pairs from one client")
    parser.add_argument("--db", default="tb_bench_ledger")
    options = parser.parse_args()
    m = measure(
        pairs=options.pairs,
        clients=options.clients,
        workers=options.workers,
        threads=options.threads,
        rounds=options.rounds,
        light=options.light,
        db=options.db,
    )
    print(
        f"pairs per path: {m['pairs']} in {m['rounds']} alternating rounds, client processes: "
        f"{m['clients']}, granian workers: {m['workers']} x {m['threads']} blocking threads, "
        f"cores: {os.cpu_count()}"
    )
    load = f"{m['load_start'][0]:.2f}, {m['load_start'][1]:.2f}, {m['load_start'][2]:.2f}"
    print(f"load average at the start: {load}")
    print(f"HTTP (intent + receipt):  {m['http_rate']:8.0f} effects/s")
    print(f"raw psycopg, same writes: {m['raw_rate']:8.0f} effects/s")
    print(f"ratio HTTP / raw:         {m['http_rate'] / m['raw_rate']:8.2f}")
    print(
        f"HTTP, receipts in batches of {m['batch']}: {m['batched_rate']:8.0f} effects/s, "
        f"ratio to raw {m['batched_rate'] / m['raw_rate']:.2f}"
    )
    print(
        f"POST /api/v1/intents latency: p50 {m['loaded_p50'] * 1000:.2f} ms, "
        f"p99 {m['loaded_p99'] * 1000:.2f} ms"
    )
    print(f"light load, one client, keep-alive, {m['light']} pairs:")
    print(
        f"  POST /api/v1/intents:  p50 {m['intent_p50'] * 1000:.2f} ms, "
        f"p99 {m['intent_p99'] * 1000:.2f} ms"
    )
    print(
        f"  POST /api/v1/receipts: p50 {m['receipt_p50'] * 1000:.2f} ms, "
        f"p99 {m['receipt_p99'] * 1000:.2f} ms"
    )
    if m["http_cpu"]:
        print(
            "core ms per effect (machine: every process on it; all: server + postgres + "
            "clients; server: granian):"
        )
        raw_all = _all(m["raw_cpu"])
        for path in ("http", "batched", "raw"):
            spent = m[f"{path}_cpu"]
            print(
                f"  {path:7} machine {spent['machine']:6.2f}  all {_all(spent):5.2f} "
                f"({_all(spent) / raw_all:.2f}x raw's)  server {spent['server']:5.2f}  "
                f"postgres {spent['postgres']:5.2f}  clients {spent['clients']:5.2f}"
            )
        spent = m["refused_cpu"]
        print(
            f"  a request refused at validation (no ledger work): server {spent['server']:.2f}, "
            f"clients {spent['clients']:.2f} core ms"
        )
    load = f"{m['load_end'][0]:.2f}, {m['load_end'][1]:.2f}, {m['load_end'][2]:.2f}"
    print(f"load average at the end: {load}")
    print(m["verifyaudit"])


def _all(spent: dict[str, float]) -> float:
    """Core ms of every process a path involves: the server, PostgreSQL and the clients."""
    return spent["server"] + spent["postgres"] + spent["clients"]


if __name__ == "__main__":
    main()
