"""What a pipelined statement costs the client: N statements sent through psycopg's pipeline
mode (as `durability.rows` sends the ledger's reads and writes), the same N through libpq's
pipeline directly (`psycopg.pq`: every statement queued, one flush, one Sync), and one
statement carrying all N parameters, on one connection to the local PostgreSQL.

    .venv/bin/python benchmarks/pipeline_cost.py [--statements 6] [--runs 3000] [--rounds 2]

Prints, for each way, the client's CPU microseconds (`time.process_time`: user and system,
so the socket calls count) and the wall-clock microseconds per batch, medians over the
alternating rounds. psycopg's pipeline sends each statement as it is queued: its generator
polls the socket and flushes libpq's buffer once per statement, so every statement is a
`sendto` of its own and two `poll`s (`strace -c -f` shows 7 sendto and 14 poll for a batch
of 6), and a wake-up of the server's backend, where libpq alone buffers them until the Sync.
"""

from __future__ import annotations

import argparse
import select
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg import pq

DSN = "postgres://root@127.0.0.1:5432/postgres"


def ways(conn: psycopg.Connection, n: int) -> dict[str, Callable[[], None]]:
    pgconn = conn.pgconn

    def psycopg_pipeline() -> None:
        with conn.pipeline():
            cursors = [conn.execute("SELECT %s::int", [i]) for i in range(n)]
        for cursor in cursors:
            cursor.fetchall()

    def libpq_pipeline() -> None:
        pgconn.enter_pipeline_mode()
        for i in range(n):
            pgconn.send_query_params(b"SELECT $1::int", [str(i).encode()])
        pgconn.pipeline_sync()
        while pgconn.flush():
            select.select([], [pgconn.socket], [])
        got = []
        while True:
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
            synced = False
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    continue
                if result.status == pq.ExecStatus.PIPELINE_SYNC:
                    synced = True
                    break
                got.append(result.get_value(0, 0))
            if synced:
                break
        pgconn.exit_pipeline_mode()
        assert len(got) == n, got

    def one_statement() -> None:
        marks = ", ".join(["%s::int"] * n)
        conn.execute(f"SELECT {marks}", list(range(n))).fetchall()

    return {
        "psycopg pipeline": psycopg_pipeline,
        "libpq pipeline": libpq_pipeline,
        "one statement": one_statement,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=6, help="statements per batch")
    parser.add_argument("--runs", type=int, default=3000, help="batches per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.statements
    spent: dict[str, list[tuple[float, float]]] = {}
    with psycopg.connect(DSN, autocommit=True) as conn:
        batches = ways(conn, n)
        for _ in range(args.rounds):
            for name, batch in batches.items():
                for _ in range(200):  # warm: psycopg prepares the statements it repeats
                    batch()
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(args.runs):
                    batch()
                spent.setdefault(name, []).append(
                    (
                        (time.process_time() - cpu) / args.runs * 1e6,
                        (time.perf_counter() - wall) / args.runs * 1e6,
                    )
                )
    print(f"{n} statements a batch, {args.runs} batches a round, {args.rounds} rounds")
    print(f"{'':18} {'client CPU µs':>14} {'wall µs':>9}")
    for name, rounds in spent.items():
        cpu, wall = (statistics.median(r[k] for r in rounds) for k in range(2))
        print(f"{name:18} {cpu:14.1f} {wall:9.1f}")


if __name__ == "__main__":
    main()
