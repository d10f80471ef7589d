"""One project's flood of OTLP requests against another project's single requests, through a
real web server as the deploy unit starts it (granian; --workers and
--threads change it) on loopback.

    .venv/bin/python benchmarks/otlp_flood.py [--flooders 20] [--probes 20] [--workers 4]

Project A sends maximum-size requests (bomb(): MAX_SPANS spans inflating to just under
MAX_INFLATED, gzip) from --flooders threads at once, each sending again as soon as it is
answered (a second after a 429, as Retry-After says); meanwhile project B sends --probes
one-span requests one after another. Prints B's latency alone and under the flood, and how
A's requests were answered (200 stored, 429 told to retry). It creates (and drops at the
start) the database named by --db. benchmarks/faults.py runs the same flood (Flood, bomb,
post) as one phase of the fault script.

Figures (issue 12), `--workers 2 --threads 4 --probes 100` (faults.py's shape) on a shared
2-core machine, two runs each: before the large-batch gate (trajectories.ingest.large_batch),
B alone median 18 / 11 ms, max 52 / 115 ms; under the flood median 84 / 94 ms, max 746 /
617 ms. With the gate (one large batch per process): alone median 8 / 16 ms, max 42 /
257 ms; under the flood median 11 / 23 ms, max 163 / 213 ms. No request of B was refused
in either; A is stored as fast as two processes can store one batch each, and told to retry
otherwise.
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
# trajectories.otlp's caps (not imported: that needs Django's settings): a request of more
# spans, or whose body inflates to more bytes, is a 413.
MAX_SPANS = 10_000
MAX_INFLATED = 16 * 1024 * 1024


def request(spans: int, trace: int, pad: int = 0) -> bytes:
    """An OTLP export request of `spans` spans of trace ids from `trace`, each with a string
    attribute of `pad` characters when pad > 0; serialized, not compressed."""
    message = ExportTraceServiceRequest()
    scope = message.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    filler = ("flood " * (pad // 6 + 1))[:pad]
    for n in range(spans):
        span = scope.spans.add()
        span.trace_id = (trace * 2**64 + n // 100 + 1).to_bytes(16)
        span.span_id = (n + 1).to_bytes(8)
        span.name = "flood"
        span.start_time_unix_nano = now
        span.end_time_unix_nano = now + 1000
        if pad:
            attribute = span.attributes.add()
            attribute.key = "flood.pad"
            attribute.value.string_value = filler
    return message.SerializeToString()


def bomb(trace: int, spans: int = MAX_SPANS, inflated: int = MAX_INFLATED) -> bytes:
    """A maximum-size request, gzip: `spans` spans whose body inflates to just under
    `inflated` bytes (each span padded by the same attribute), the largest the server takes."""
    bare = len(request(spans, trace))
    per_span = len(request(1, trace, pad=200)) - len(request(1, trace)) - 200  # the overhead
    pad = max(0, (inflated - bare) // spans - per_span - 4)
    body = request(spans, trace, pad)
    assert len(body) <= inflated, (len(body), inflated)
    return gzip.compress(body)


def post(
    port: int, key: str, body: bytes, gzipped: bool, timeout: float = 300
) -> tuple[int, float]:
    """POST `body` to /v1/traces: the answer's status and how long it took in seconds."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": PROTOBUF}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/v1/traces", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        status = response.status
    finally:
        connection.close()
    return status, time.monotonic() - started


class Flood:
    """One thread per body, each posting its body again and again with `key` until stopped
    (a second after a 429, as Retry-After says); `answers` counts the statuses, and
    `errors` the requests that got no answer."""

    def __init__(self, port: int, key: str, bodies: list[bytes]) -> None:
        self.answers: Counter[int | str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(port, key, body), daemon=True)
            for body in bodies
        ]

    def _send(self, port: int, key: str, body: bytes) -> None:
        while not self._stop.is_set():
            try:
                status, _ = post(port, key, body, True)
            except OSError as exc:
                with self._lock:
                    self.answers[type(exc).__name__] += 1
                self._stop.wait(1)
                continue
            with self._lock:
                self.answers[status] += 1
            if status in (429, 503):
                self._stop.wait(1)

    def __enter__(self) -> Flood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def summary(times: list[float]) -> str:
    if not times:
        return "no requests"
    return f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"


def _probe(port: int, key: str, count: int) -> list[float]:
    times = []
    for n in range(count):
        status, took = post(port, key, request(1, 10_000 + n), False)
        assert status == 200, status
        times.append(took)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flooders", type=int, default=20)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--spans", type=int, default=MAX_SPANS, help="trajectories.otlp.MAX_SPANS")
    parser.add_argument(
        "--inflated", type=int, default=MAX_INFLATED, help="trajectories.otlp.MAX_INFLATED"
    )
    parser.add_argument(
        "--workers", type=int, default=server.deployed("--workers"), help="granian workers"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=server.deployed("--blocking-threads"),
        help="granian blocking threads per worker",
    )
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
    bombs = [bomb(n, options.spans, options.inflated) for n in range(options.flooders)]
    with server.web(env, options.workers, threads=options.threads) as port:
        _probe(port, prober, 3)  # warm up
        alone = _probe(port, prober, options.probes)
        with Flood(port, flooder, bombs) as flood:
            time.sleep(2)  # the flood under way
            flooded = _probe(port, prober, options.probes)

    print(f"request of {options.spans} spans: {len(bombs[0]):,} bytes gzip")
    print(f"B alone ({options.probes} one-span requests):      {summary(alone)}")
    print(f"B under A's flood ({options.flooders} senders):       {summary(flooded)}")
    answers: dict[Any, int] = dict(sorted(flood.answers.items(), key=str))
    print(f"A's answers: {answers}; cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
