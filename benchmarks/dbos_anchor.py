"""The anchor for the ledger's latency: a DBOS Transact step checkpoint, in process, against
the same PostgreSQL (a fresh system database, --db, dropped and created).

    .venv/bin/python benchmarks/dbos_anchor.py [--steps 1000]

One workflow runs --steps trivial steps one after the other; DBOS writes each step's result
to its system database before the next begins (the checkpoint a durable step costs). Prints
the p50/p99 wall time of a step and the CPU this process spent per step. `measure()` is the
same run for benchmarks/run_all.py. DBOS comes with the dev dependencies (pydantic-ai's
extra).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Any

import psycopg

PG = "postgres://root@127.0.0.1:5432"


def measure(*, steps: int, db: str) -> dict[str, Any]:
    from dbos import DBOS

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{db}"')
    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": "tallybook-anchor",
            "system_database_url": f"postgresql://root@127.0.0.1:5432/{db}",
            "log_level": "WARNING",
        }
    )
    walls: list[float] = []

    @DBOS.step()
    def step(n: int) -> int:
        return n + 1

    @DBOS.workflow()
    def steps_in_turn(count: int) -> float:
        cpu = time.process_time()
        for n in range(count):
            start = time.perf_counter()
            step(n)
            walls.append(time.perf_counter() - start)
        return time.process_time() - cpu

    DBOS.launch()
    try:
        steps_in_turn(50)  # warm: connections, prepared plans
        walls.clear()
        cpu = steps_in_turn(steps)
    finally:
        DBOS.destroy()
    ordered = sorted(walls)
    return {
        "steps": steps,
        "step_p50": statistics.median(walls),
        "step_p99": ordered[max(0, int(len(ordered) * 0.99 + 0.5) - 1)],
        "step_cpu": cpu / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--db", default="tb_bench_dbos")
    options = parser.parse_args()
    m = measure(steps=options.steps, db=options.db)
    print(
        f"DBOS step checkpoint, {m['steps']} steps in one workflow: p50 "
        f"{m['step_p50'] * 1000:.2f} ms, p99 {m['step_p99'] * 1000:.2f} ms, CPU in process "
        f"{m['step_cpu'] * 1000:.2f} ms a step"
    )


if __name__ == "__main__":
    main()
