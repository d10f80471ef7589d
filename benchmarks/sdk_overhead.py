"""What one SDK effect block (intent + receipt) costs the agent, against a loopback server.

    .venv/bin/python benchmarks/sdk_overhead.py [--effects 1000] [--workers 4]

Starts granian on a fresh PostgreSQL database (--db, dropped and created), then times,
on one thread and interleaved (so that all three see the same load on the machine):
  - `with tb.effect(...) as fx: fx.receipt(...)`: what an agent waits for per effect:
    the intent's round trip and the fsynced spool write of the receipt, which the
    background sender delivers while the agent carries on;
  - the same two POSTs over a raw keep-alive http.client connection;
  - the spool alone: write, fsync and delete one receipt file;
and prints the median and p99 of each, the SDK's own share (the median difference; below
zero when the receipt's round trip, now off the agent's path, outweighs the SDK's work),
and how long the sender took to deliver the last receipts once the blocks were done.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from tallybook import Tallybook

ROOT = Path(__file__).resolve().parent.parent
# The HTTP benchmarks' shared helpers beside this script (its folder is first on sys.path).
server = importlib.import_module("server")


def intent(key: str, n: int) -> dict[str, object]:
    return {"key": key, "kind": "payment", "target": "fakepay", "request": {"order": n}}


def timed(count: int, *ways: Callable[[int], None]) -> list[list[float]]:
    """The latencies of each way, taking turns: way 1 on n, way 2 on n, ..., then n + 1."""
    latencies: list[list[float]] = [[] for _ in ways]
    for n in range(count):
        for way, one in zip(latencies, ways, strict=True):
            started = time.perf_counter()
            one(n)
            way.append(time.perf_counter() - started)
    return latencies


def sdk_block(tb: Tallybook, prefix: str) -> Callable[[int], None]:
    def one(n: int) -> None:
        with tb.effect(
            f"{prefix}:{n}", kind="payment", target="fakepay", request={"order": n}
        ) as fx:
            fx.receipt(system="fakepay", external_id=f"re_{prefix}_{n}")

    return one


def spool_only(tb: Tallybook) -> Callable[[int], None]:
    def one(n: int) -> None:
        tb.spool.done(tb.spool.put("receipts", {"key": f"spool:{n}", "system": "x"}))

    return one


def raw_pair(port: int, api_key: str, prefix: str) -> Callable[[int], None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    def post(path: str, body: dict[str, object]) -> None:
        conn.request("POST", path, json.dumps(body), headers)
        response = conn.getresponse()
        response.read()
        assert response.status < 300, response.status

    def one(n: int) -> None:
        post("/api/v1/intents", intent(f"{prefix}:{n}", n))
        post(
            "/api/v1/receipts",
            {"key": f"{prefix}:{n}", "system": "fakepay", "external_id": f"re_{prefix}_{n}"},
        )

    return one


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:6.2f} ms   p99 {p99 * 1000:6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=1000)
    parser.add_argument(
        "--workers", type=int, default=server.deployed("--workers"), help="granian workers"
    )
    parser.add_argument("--db", default="tb_sdk_bench")
    parser.add_argument("--pg", default="postgres://root@127.0.0.1:5432")
    options = parser.parse_args()

    with psycopg.connect(f"{options.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{options.db}"')
        admin.execute(f'CREATE DATABASE "{options.db}"')
    env = {**os.environ, "DATABASE_URL": f"{options.pg}/{options.db}"}
    env.pop("REDIS_URL", None)  # background work inline: nothing is left queued behind
    server.manage(env, "migrate", "--verbosity", "0")
    api_key = server.manage(env, "createapikey", "bench").strip().splitlines()[-1]
    with (
        server.web(env, options.workers) as port,
        tempfile.TemporaryDirectory() as spool,
        Tallybook(f"http://127.0.0.1:{port}", api_key, spool=spool) as tb,
    ):
        timed(200, sdk_block(tb, "warm-sdk"), raw_pair(port, api_key, "warm-raw"))
        sdk, raw, spooled = timed(
            options.effects,
            sdk_block(tb, "sdk"),
            raw_pair(port, api_key, "raw"),
            spool_only(tb),
        )
        started = time.perf_counter()
        assert tb.flush(60), "the receipts were not delivered"
        drained = time.perf_counter() - started

    print(
        f"{options.effects} effects, one thread, granian workers: {options.workers}, "
        f"cores: {os.cpu_count()}"
    )
    print(f"SDK effect block (intent + spooled receipt): {ms(sdk)}")
    print(f"raw http.client intent + receipt POSTs:      {ms(raw)}")
    print(f"spool: write + fsync + delete a receipt:     {ms(spooled)}")
    print(
        f"SDK's own share (median difference): "
        f"{(statistics.median(sdk) - statistics.median(raw)) * 1000:.2f} ms"
    )
    print(f"receipts still in the spool after the last block, delivered in {drained * 1000:.1f} ms")


if __name__ == "__main__":
    main()
