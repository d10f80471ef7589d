"""One project's flood of OTLP requests against another project's single requests, through a
real gunicorn server deployed as the README says (4 workers x 4 threads) on loopback.

    .venv/bin/python benchmarks/otlp_flood.py [--flooders 20] [--probes 20]

Project A sends maximum-size requests (--spans, trajectories.otlp.MAX_SPANS, gzip) from
--flooders threads at once, each sending again as soon as it is answered; meanwhile project
B sends --probes one-span requests one after another. Prints B's latency alone and under the
flood, and how A's requests were answered (200 stored, 429 told to retry). It creates (and
drops at the start) the database named by --db.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import importlib
import os
import statistics
import threading
import time
from collections import Counter
from typing import Any

import psycopg
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

server = importlib.import_module("server")
PG = "postgres://root@127.0.0.1:5432"
PROTOBUF = "application/x-protobuf"


def _request(spans: int, trace: int) -> bytes:
    message = ExportTraceServiceRequest()
    scope = message.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for n in range(spans):
        span = scope.spans.add()
        span.trace_id = (trace * 2**64 + n // 100 + 1).to_bytes(16)
        span.span_id = (n + 1).to_bytes(8)
        span.name = "flood"
        span.start_time_unix_nano = now
        span.end_time_unix_nano = now + 1000
    return message.SerializeToString()


def _post(port: int, key: str, body: bytes, gzipped: bool) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": PROTOBUF}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("POST", "/v1/traces", body=body, headers=headers)
        status = connection.getresponse().status
    finally:
        connection.close()
    return status, time.monotonic() - started


def _probe(port: int, key: str, count: int) -> list[float]:
    times = []
    for n in range(count):
        status, took = _post(port, key, _request(1, 10_000 + n), False)
        assert status == 200, status
        times.append(took)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flooders", type=int, default=20)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--spans", type=int, default=10_000, help="trajectories.otlp.MAX_SPANS")
    parser.add_argument("--db", default="tb_bench_flood")
    options = parser.parse_args()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{options.db}"')
        admin.execute(f'CREATE DATABASE "{options.db}"')
    env = {**os.environ, "DATABASE_URL": f"{PG}/{options.db}", "DEBUG": "0", "LOG_LEVEL": "ERROR"}
    env.pop("REDIS_URL", None)
    server.manage(env, "migrate", "--verbosity", "0")
    flooder = server.manage(env, "createapikey", "flooder").strip().splitlines()[-1]
    prober = server.manage(env, "createapikey", "prober").strip().splitlines()[-1]
    bombs = [gzip.compress(_request(options.spans, n)) for n in range(options.flooders)]
    with server.gunicorn(env, 4, threads=4) as port:
        _probe(port, prober, 3)  # warm up
        alone = _probe(port, prober, options.probes)
        answers: Counter[int] = Counter()
        stop = threading.Event()

        def flood(body: bytes) -> None:
            while not stop.is_set():
                status, _ = _post(port, flooder, body, True)
                answers[status] += 1
                if status == 429:
                    time.sleep(1)  # as Retry-After says

        threads = [threading.Thread(target=flood, args=(b,)) for b in bombs]
        for thread in threads:
            thread.start()
        time.sleep(2)  # the flood under way
        flooded = _probe(port, prober, options.probes)
        stop.set()
        for thread in threads:
            thread.join()

    def summary(times: list[Any]) -> str:
        return f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"

    print(f"request of {options.spans} spans: {len(bombs[0]):,} bytes gzip")
    print(f"B alone ({options.probes} one-span requests):      {summary(alone)}")
    print(f"B under A's flood ({options.flooders} senders):       {summary(flooded)}")
    print(f"A's answers: {dict(sorted(answers.items()))}; cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
