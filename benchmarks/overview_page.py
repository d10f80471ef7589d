"""Server time of the overview at 1,000,000 effects and 10,000 open cases.

    .venv/bin/python benchmarks/overview_page.py [--effects 1000000] [--open 10000]

Builds the queue benchmark's data set (benchmarks/queue_page.py: effects one second apart,
so the last day holds 86,400 of them) in the database named by --db, then requests the
overview through Django's test client with a logged-in operator, for each chart range,
and prints the median and p95 of the server time and the number of queries.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from typing import Any

# The queue benchmark beside this script (the script's folder is first on sys.path); it
# builds the data set and times the requests.
queue_page = importlib.import_module("queue_page")


RANGES = ["/", "/?range=1h", "/?range=24h", "/?range=7d"]


def measure(client: Any, repeat: int) -> dict[str, tuple[int, list[float]]]:
    """Per chart range: the number of queries of one request and `repeat` server times."""
    from django.db import connection

    queries: list[str] = []

    def counted(execute: Any, sql: str, *rest: Any) -> Any:
        queries.append(sql)
        return execute(sql, *rest)

    measured = {}
    for path in RANGES:
        queries.clear()
        with connection.execute_wrapper(counted):
            assert client.get(path).status_code == 200
        measured[path] = (len(queries), queue_page._time(client, path, repeat))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=10_000, help="open cases")
    parser.add_argument("--repeat", type=int, default=20, help="requests per range")
    parser.add_argument("--db", default="tb_bench_overview")
    parser.add_argument(
        "--reuse", action="store_true", help="time the data set a previous run left in --db"
    )
    args = parser.parse_args()

    if args.reuse:
        queue_page.django_on(args.db)
        from django.contrib.auth.models import User

        operator = User.objects.get(username="operator")
    else:
        operator = queue_page.build(args.db, args.effects, args.open)["operator"]
    from django.test import Client

    client = Client()
    client.force_login(operator)
    print(f"{args.effects:,} effects, {args.open:,} open cases, {args.repeat} requests each")
    print(f"{'page':<20} {'queries':>8} {'median ms':>10} {'p95 ms':>8}")
    for path, (queries, times) in measure(client, args.repeat).items():
        print(
            f"{path:<20} {queries:>8} {statistics.median(times) * 1000:>10.1f} "
            f"{queue_page._p95(times) * 1000:>8.1f}"
        )


if __name__ == "__main__":
    main()
