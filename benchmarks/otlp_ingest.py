"""OTLP span ingest through HTTP (granian as deployed, on loopback) against raw psycopg
inserts of the same span rows, in one run on one PostgreSQL database.

    .venv/bin/python benchmarks/otlp_ingest.py [--batches 240] [--clients 6] [--workers 4]
    .venv/bin/python benchmarks/otlp_ingest.py --in-process 60

Each batch is one OTLP/protobuf ExportTraceServiceRequest of 512 GenAI spans (an agent
span, then model calls that ask for tools and the tool calls that run them). The
paths alternate in rounds, so that all see the same machine when other work comes and
goes. The HTTP clients wait out a 429 or a 503 as an exporter does (Retry-After, at most
TRIES tries a batch); the output counts them and the batches given up on (which the server
may have stored all the same: an answer that came too late). Prints spans/s for both paths
and their ratio, twice: the raw path with its rows prepared before its timer starts, and
preparing them (decoding the batches into rows) inside its timer (issue 13's figure). It
creates (and drops at the start) the database named by --db; `measure()` is the same run
for benchmarks/run_all.py.

--in-process N instead stores N batches in this process, through what the view calls
(decode, store, link refresh, answer), and prints the CPU time per batch of this
process alone: a measure of ingest's own Python work that other load on the machine
barely moves.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import multiprocessing as mp
import os
import sys
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

ROOT = Path(__file__).resolve().parent.parent
# The HTTP benchmarks' shared helpers beside this script (its folder is first on sys.path).
server = importlib.import_module("server")
PG = "postgres://root@127.0.0.1:5432"
SPANS_PER_BATCH = 512
SPANS_PER_TRACE = 64
# Tries of one OTLP batch, and the longest a client waits before one, whatever Retry-After says.
TRIES = 20
MAX_WAIT = 10.0


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _messages(question: str, call_id: str) -> tuple[str, str]:
    asked = [
        {"role": "system", "parts": [{"type": "text", "content": "You settle refunds."}]},
        {"role": "user", "parts": [{"type": "text", "content": question}]},
    ]
    answered = [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "I will look the order up and refund it."},
                {
                    "type": "tool_call",
                    "id": call_id,
                    "name": "refund",
                    "arguments": {"order": question[-6:], "amount": 1250},
                },
            ],
            "finish_reason": "tool_call",
        }
    ]
    return json.dumps(asked), json.dumps(answered)


def batch(index: int, *, tag: str) -> bytes:
    """One ExportTraceServiceRequest of 512 spans in 8 traces; ids depend on (tag, index)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(
        [
            _kv("service.name", "refund-agent"),
            _kv("service.version", "2.3.1"),
            _kv("telemetry.sdk.language", "python"),
            _kv("telemetry.sdk.name", "opentelemetry"),
        ]
    )
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "opentelemetry.instrumentation.openai"
    base = time.time_ns() - 60 * 10**9
    seed = zlib.crc32(tag.encode())
    for t in range(SPANS_PER_BATCH // SPANS_PER_TRACE):
        trace_id = f"{seed:012x}{index:010x}{t:010x}"[-32:].rjust(32, "1")
        trace = bytes.fromhex(trace_id)
        root = bytes.fromhex(f"a{t:07x}{index:08x}")
        start = base + t * 10**9
        span = scope.spans.add(
            trace_id=trace,
            span_id=root,
            name="invoke_agent refund-agent",
            kind=1,
            start_time_unix_nano=start,
            end_time_unix_nano=start + 900 * 10**6,
        )
        span.attributes.extend(
            [_kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", "refunds")]
        )
        for n in range(1, SPANS_PER_TRACE):
            span_id = bytes.fromhex(f"{n:08x}{index:08x}")
            at = start + n * 10**7
            call_id = f"call_{tag}_{index}_{t}_{n - n % 2}"
            span = scope.spans.add(
                trace_id=trace,
                span_id=span_id,
                parent_span_id=root,
                kind=3,
                start_time_unix_nano=at,
                end_time_unix_nano=at + 8 * 10**6,
            )
            span.status.code = Status.STATUS_CODE_OK
            if n % 2:
                span.name = "chat gpt-4o"
                asked, answered = _messages(f"Please refund order #{index:06d}", call_id)
                span.attributes.extend(
                    [
                        _kv("gen_ai.operation.name", "chat"),
                        _kv("gen_ai.provider.name", "openai"),
                        _kv("gen_ai.request.model", "gpt-4o"),
                        _kv("gen_ai.response.model", "gpt-4o-2024-08-06"),
                        _kv("gen_ai.response.id", f"chatcmpl-{index}-{t}-{n}"),
                        _kv("gen_ai.usage.input_tokens", 412),
                        _kv("gen_ai.usage.output_tokens", 57),
                        _kv("gen_ai.input.messages", asked),
                        _kv("gen_ai.output.messages", answered),
                    ]
                )
            else:
                span.name = "execute_tool refund"
                span.attributes.extend(
                    [
                        _kv("gen_ai.operation.name", "execute_tool"),
                        _kv("gen_ai.tool.name", "refund"),
                        _kv("gen_ai.tool.call.id", call_id),
                        _kv("gen_ai.tool.call.arguments", '{"order": 1234, "amount": 1250}'),
                        _kv("gen_ai.tool.call.result", '{"refund": "re_1234", "status": "ok"}'),
                    ]
                )
    return bytes(request.SerializeToString())


class Refusals(NamedTuple):
    """What one client's batches were answered besides a 200: `again` answers it waited out
    (429 or 503, after Retry-After; a connection the server ended, an answer not come within
    the client's timeout), `given_up` batches it gave up on after TRIES tries. A batch given
    up on may still be stored: a try the server committed whose answer never came."""

    again: int = 0
    given_up: int = 0

    def __add__(self, other: object) -> Refusals:
        assert isinstance(other, Refusals)
        return Refusals(self.again + other.again, self.given_up + other.given_up)


def _http_worker(port: int, key: str, tag: str, indexes: list[int], out: mp.Queue[Any]) -> None:
    """Send the batches as an OTLP exporter does: a 429 or a 503 (ingest's slots all taken,
    a large batch past TALLYBOOK_INGEST_LARGE_PER_PROCESS, a lock wait too long) is tried
    again once Retry-After has passed, at most TRIES times a batch. Reports its Refusals."""
    bodies = [batch(i, tag=tag) for i in indexes]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"}
    out.put(0)  # ready
    again = given_up = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for body in bodies:
        for _try in range(TRIES):
            try:
                conn.request("POST", "/v1/traces", body, headers)
                response = conn.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                again += 1
                continue
            if response.status in (429, 503):
                again += 1
                time.sleep(min(float(response.getheader("Retry-After") or 1), MAX_WAIT))
                continue
            assert response.status == 200, (response.status, answer[:300])
            assert answer == b"", answer  # no partialSuccess: every span stored
            break
        else:
            given_up += 1
    conn.close()
    out.put(Refusals(again, given_up))


def _rows(project_id: int, tag: str, index: int) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """The run and span rows the server stores for one batch, ready for psycopg."""
    request = ExportTraceServiceRequest.FromString(batch(index, tag=tag))
    runs: dict[str, tuple[Any, ...]] = {}
    spans = []
    now = datetime.now(UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for resource_spans in request.resource_spans:
        resource = json.dumps(
            {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
        )
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                trace_id = s.trace_id.hex()
                attributes = {
                    kv.key: kv.value.string_value or kv.value.int_value for kv in s.attributes
                }
                start = epoch + timedelta(microseconds=s.start_time_unix_nano // 1000)
                end = epoch + timedelta(microseconds=s.end_time_unix_nano // 1000)
                runs.setdefault(trace_id, (project_id, trace_id, start))
                model = attributes.get("gen_ai.operation.name") == "chat"
                spans.append(
                    (
                        project_id,
                        trace_id,
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        "model" if model else "tool",
                        attributes.pop("gen_ai.operation.name"),
                        s.name,
                        start,
                        end,
                        "ok",
                        "",
                        attributes.pop("gen_ai.provider.name", ""),
                        attributes.pop("gen_ai.request.model", ""),
                        attributes.pop("gen_ai.response.model", ""),
                        attributes.pop("gen_ai.usage.input_tokens", None),
                        attributes.pop("gen_ai.usage.output_tokens", None),
                        attributes.pop("gen_ai.tool.call.id", ""),
                        attributes.pop("gen_ai.tool.name", ""),
                        resource,
                        json.dumps(attributes.pop("gen_ai.input.messages", None)),
                        json.dumps(attributes.pop("gen_ai.output.messages", None)),
                        json.dumps(attributes),
                        now,
                    )
                )
    return list(runs.values()), spans


RAW_RUN = (
    "INSERT INTO trajectories_run (project_id, run_id, inferred, agent, workflow, "
    "workflow_version, conversation_id, status, started, attributes, span_count, error_count, "
    "input_tokens, output_tokens, updated) VALUES (%s, %s, true, '', '', '', '', 'running', %s, "
    "'{}', 0, 0, 0, 0, now()) RETURNING id"
)
RAW_SPAN = (
    "INSERT INTO trajectories_span (project_id, run_id, trace_id, span_id, parent_span_id, kind, "
    'operation, name, start, "end", status, status_message, provider, request_model, '
    "response_model, input_tokens, output_tokens, tool_call_id, tool_name, resource, input, "
    "output, attributes, capped, received, day) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '{}', %s, "
    "(now() AT TIME ZONE 'UTC')::date)"
)


def _raw_worker(
    dsn: str, project_id: int, tag: str, indexes: list[int], timed_rows: bool, out: mp.Queue[Any]
) -> None:
    if timed_rows:
        out.put(0)  # ready: decoding the batches into rows is inside the timer
    prepared = [_rows(project_id, tag, i) for i in indexes]
    if not timed_rows:
        out.put(0)  # ready
    with psycopg.connect(dsn) as conn:
        for runs, spans in prepared:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(RAW_RUN, runs, returning=True)
                run_ids = {}
                for trace_id in (run[1] for run in runs):
                    run_ids[trace_id] = cur.fetchone()[0]  # type: ignore[index]
                    cur.nextset()
                cur.executemany(RAW_SPAN, [(s[0], run_ids[s[1]], *s[1:]) for s in spans])
    out.put(len(prepared))


def _run(
    target: Callable[..., None], args_of: Callable[[int], tuple[object, ...]], clients: int
) -> tuple[float, list[Any]]:
    """Seconds from the moment every client has its batches encoded to the last answer, and
    what each client reported at its end."""
    out: mp.Queue[Any] = mp.Queue()
    procs = [mp.Process(target=target, args=(*args_of(c), out)) for c in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        server.next_report(out, procs)
    start = time.perf_counter()
    reports = [server.next_report(out, procs) for _ in procs]
    elapsed = time.perf_counter() - start
    server.join_workers(procs)
    return elapsed, reports


def _http_args(
    port: int, key: str, share: Callable[[int, int], list[int]], round_: int, client: int
) -> tuple[object, ...]:
    return port, key, "http", share(round_, client)


def _raw_args(
    dsn: str,
    project: int,
    tag: str,
    share: Callable[[int, int], list[int]],
    timed_rows: bool,
    round_: int,
    client: int,
) -> tuple[object, ...]:
    return dsn, project, tag, share(round_, client), timed_rows


def _in_process(dsn: str, batches: int) -> None:
    """CPU time per batch of the ingest path, without HTTP, in this process."""
    os.environ.update({"DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "durability.settings"})
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from durability.models import Project
    from trajectories import ingest, links, otlp

    project = Project.objects.get(name="bench-http")
    warm_up = 5
    bodies = [batch(i, tag="cpu") for i in range(warm_up + batches)]
    times = []
    for body in bodies:
        start = time.process_time()
        decoded = otlp.decode(body, otlp.PROTOBUF)
        touched = ingest.spans_ingest(project=project, spans=decoded.spans)
        links.links_refresh(project_id=project.pk, touched=touched)
        otlp.export_response(otlp.PROTOBUF, decoded)
        times.append(time.process_time() - start)
    times = sorted(times[warm_up:])
    print(f"in-process CPU per batch of {SPANS_PER_BATCH} spans ({batches} batches): ", end="")
    print(f"min {times[0] * 1000:.1f} ms, median {times[len(times) // 2] * 1000:.1f} ms")


def _database(db: str) -> tuple[str, dict[str, str], str, int]:
    """A fresh, migrated `db` with the two projects: its DSN, the server's environment, the
    HTTP project's API key and the raw project's id."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}"')
        admin.execute(f'CREATE DATABASE "{db}"')
    dsn = f"{PG}/{db}"
    env = {**os.environ, "DATABASE_URL": dsn, "DEBUG": "0", "LOG_LEVEL": "ERROR"}
    env.pop("REDIS_URL", None)
    server.manage(env, "migrate", "--verbosity", "0")
    key = server.manage(env, "createapikey", "bench-http").strip().splitlines()[-1]
    server.manage(env, "createapikey", "bench-raw")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT id FROM durability_project WHERE name = 'bench-raw'").fetchone()
        assert row is not None
    return dsn, env, key, row[0]


def measure(*, batches: int, clients: int, workers: int, rounds: int, db: str) -> dict[str, Any]:
    """Spans/s over `rounds` alternating rounds on a fresh database `db`, of HTTP, of raw
    psycopg with its rows prepared before its timer starts, and of raw psycopg preparing its
    rows (decoding the batches) inside its timer."""
    dsn, env, key, raw_project = _database(db)
    per_client = max(1, batches // (clients * rounds))
    batches = per_client * clients * rounds

    def share(round_: int, client: int) -> list[int]:
        first = (round_ * clients + client) * per_client
        return list(range(first, first + per_client))

    refused = Refusals()
    with server.web(env, workers) as port:
        # Warm up each worker's imports and connections.
        _, reports = _run(_http_worker, lambda c: (port, key, "warm", [c]), workers)
        refused = sum(reports, refused)
        http_time = raw_time = timed_time = 0.0
        for r in range(rounds):
            server.analyzed(dsn)
            took, reports = _run(_http_worker, partial(_http_args, port, key, share, r), clients)
            http_time, refused = http_time + took, sum(reports, refused)
            raw_time += _run(
                _raw_worker, partial(_raw_args, dsn, raw_project, "raw", share, False, r), clients
            )[0]
            timed_time += _run(
                _raw_worker, partial(_raw_args, dsn, raw_project, "timed", share, True, r), clients
            )[0]

    spans = batches * SPANS_PER_BATCH
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM trajectories_span").fetchone()
        assert row is not None
        stored = row[0]
    # Every span sent (three paths and the warm-up) is stored, except perhaps those of the
    # batches given up on: the server may have committed a try whose answer came too late.
    sent = spans * 3 + workers * SPANS_PER_BATCH
    given_up = refused.given_up * SPANS_PER_BATCH
    assert sent - given_up <= stored <= sent, (
        f"{stored} spans stored, {sent - given_up} to {sent} expected "
        f"({refused.given_up} batches given up)"
    )
    return {
        "spans": spans,
        "batches": batches,
        "clients": clients,
        "workers": workers,
        "rounds": rounds,
        # The spans answered 200, whether those given up on were stored or not.
        "http_rate": (spans - given_up) / http_time,
        "http_again": refused.again,
        "http_given_up": refused.given_up,
        "http_given_up_stored": stored - (sent - given_up),
        "raw_rate": spans / raw_time,
        "timed_rate": spans / timed_time,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=240, help="512-span batches per path")
    parser.add_argument("--clients", type=int, default=6, help="concurrent client processes")
    parser.add_argument(
        "--workers", type=int, default=server.deployed("--workers"), help="granian workers"
    )
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the two paths")
    parser.add_argument("--db", default="tb_bench_otlp")
    parser.add_argument(
        "--in-process", type=int, default=0, metavar="N", help="CPU per batch over N batches"
    )
    options = parser.parse_args()

    if options.in_process:
        dsn, *_ = _database(options.db)
        _in_process(dsn, options.in_process)
        return
    m = measure(
        batches=options.batches,
        clients=options.clients,
        workers=options.workers,
        rounds=options.rounds,
        db=options.db,
    )
    print(
        f"spans per path: {m['spans']} in {m['batches']} batches of {SPANS_PER_BATCH}, "
        f"client processes: {m['clients']}, granian workers: {m['workers']}, "
        f"cores: {os.cpu_count()}"
    )
    print(f"HTTP OTLP/protobuf:             {m['http_rate']:8.0f} spans/s")
    print(
        f"  refused: {m['http_again']} answers waited out (429, 503, reset), "
        f"{m['http_given_up']} batches given up after {TRIES} tries "
        f"({m['http_given_up_stored']} of their spans stored nonetheless)"
    )
    print(f"raw psycopg, same rows:         {m['raw_rate']:8.0f} spans/s")
    print(f"ratio HTTP / raw:               {m['http_rate'] / m['raw_rate']:8.2f}")
    print(f"raw, preparing its rows timed:  {m['timed_rate']:8.0f} spans/s")
    print(f"ratio HTTP / raw, rows timed:   {m['http_rate'] / m['timed_rate']:8.2f}")


if __name__ == "__main__":
    main()
