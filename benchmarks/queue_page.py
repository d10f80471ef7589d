"""Server time of the queue page at 10,000 open cases over 1,000,000 effects, one row per
case and grouped (`?grouped=1`).

    .venv/bin/python benchmarks/queue_page.py [--effects 1000000] [--open 10000] [--repeat 40]

Creates (dropping it first) the PostgreSQL database named by --db, migrates it, fills it
with generate_series SQL (effects, their attempts, open and closed cases; the keys and
indexes made after the rows: about 35 s at 1M on two cores), runs the hourly tallies' job as
the scheduler would (twice, timed: its first run, then one a minute later), then requests
the queue page through Django's test client with a logged-in operator, for each filter
and sort, one row per case and one per group of similar cases (GROUPS: a few pile-ups of
hundreds, hundreds of groups of ten, singletons), and prints the median and p95 of the
server time (view, queries and template; no network). --explain prints the plans of the
page's queries.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://root@127.0.0.1:5432"
WORKFLOWS = ["refund-bot", "release-bot", "mail-bot", "repo-bot"]
# The agent that runs each workflow (attempt contexts name both, as the SDK records them).
AGENTS = ["refunder", "releaser", "mailer", "committer"]
KINDS = ["payment", "email", "deploy", "git_push"]
TARGETS = ["stripe", "smtp", "k8s", "github", "fakepay"]
# Each case's group (Case.group_key), as error trackers see them: 30% in nine pile-ups of
# about 330 cases, 50% in 500 groups of about ten, 20% alone (about 2,500 groups in 10,000).
GROUPS = (
    "substr(md5(CASE WHEN g %% 10 < 3 THEN 'pile:' || (g %% 15) "
    "WHEN g %% 10 < 8 THEN 'few:' || (g %% 1000) ELSE 'one:' || g END), 1, 32)"
)


def django_on(db: str) -> None:
    """Set Django up in this process on the PostgreSQL database `db` (once per process), as
    a production process on plain HTTP (the test client's requests are not HTTPS)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.server import PLAIN_HTTP

    os.environ.update(PLAIN_HTTP)
    os.environ["DATABASE_URL"] = f"{PG}/{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durability.settings")
    import django

    django.setup()


def build(
    db: str, effects: int, open_cases: int, effect_overrides: dict[str, str] | None = None
) -> dict[str, Any]:
    """A fresh `db`, migrated and filled (see `_fill`; `effect_overrides` to `effect_rows`),
    Django set up on it; the operator and the project."""
    _fresh_database(db)
    django_on(db)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return _fill(effects, open_cases, effect_overrides or {})


def _fresh_database(name: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _insert_select(model: Any, series: str, overrides: dict[str, str]) -> tuple[str, list[Any]]:
    """INSERT … SELECT over `series` (a FROM clause binding g) for every column of `model`:
    the overrides' SQL where given, else the field's default, so new columns need nothing."""
    from django.db import connection

    columns, exprs, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.attname in overrides:
            exprs.append(overrides[field.attname])
        elif field.null:
            exprs.append("NULL")
        else:
            exprs.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    table = connection.ops.quote_name(model._meta.db_table)
    sql = f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(exprs)} FROM {series}"
    return sql, params


def effect_rows(project: Any, overrides: dict[str, str]) -> tuple[str, list[Any]]:
    """The one INSERT of every data set's effects: effect g of generate_series(1, %s) (the
    one parameter left to bind), key `bench:<g>`, created g seconds ago unless `overrides`
    (SQL by attname, over g) says otherwise; a new column gets its default, or an entry
    here."""
    from durability.models import Effect

    defaults = {
        "project_id": str(project.pk),
        "key": "'bench:' || g",
        "kind": f"(ARRAY{KINDS!r})[1 + g %% {len(KINDS)}]",
        "target": f"(ARRAY{TARGETS!r})[1 + g %% {len(TARGETS)}]",
        "fingerprint": "md5(g::text)",
        "request": "jsonb_build_object('order', g, 'amount', 1250)",
        "state": "'succeeded'",
        "run_id": "'run-' || (g %% 50000)",
        # As its attempt's context names them (the ledger copies them onto the effect).
        "agent": f"(ARRAY{AGENTS!r})[1 + g %% {len(AGENTS)}]",
        "workflow": f"(ARRAY{WORKFLOWS!r})[1 + g %% {len(WORKFLOWS)}]",
        "attempt_count": "1",
        "created": "now() - make_interval(secs => g)",
        "updated": "now() - make_interval(secs => g)",
    }
    return _insert_select(Effect, "generate_series(1, %s) AS g", defaults | overrides)


@contextmanager
def bulk(tables: list[str]) -> Iterator[None]:
    """Around a fill of `tables` (in its transaction): their unique and foreign keys and
    their indexes but the primary keys' are dropped, then made again once the rows are in.
    PostgreSQL then builds each index by one sort and checks each key by one join; row by
    row they cost most of a fill (the foreign keys' deferred checks alone took 17 s at
    COMMIT for 1M effects)."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Unique keys first: a foreign key is dropped after, and made again after, them; the
        # keys of other tables that name one of these tables' unique keys (the composite
        # tenant keys) go and come back with them.
        cursor.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
            "FROM pg_constraint WHERE contype IN ('u', 'f') "
            "AND (conrelid::regclass::text = ANY(%s) "
            "OR contype = 'f' AND confrelid::regclass::text = ANY(%s)) ORDER BY contype DESC",
            [tables, tables],
        )
        keys = cursor.fetchall()
        cursor.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid::regclass::text = ANY(%s) AND NOT EXISTS "
            "(SELECT FROM pg_constraint c WHERE c.conindid = indexrelid)",
            [tables],
        )
        indexes = cursor.fetchall()
        for table, name, _ in keys[::-1]:
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for name, _ in indexes:
            cursor.execute(f"DROP INDEX {name}")
        yield
        cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for _, definition in indexes:
            cursor.execute(definition)
        for table, name, definition in keys:
            cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')


def _fill(effects: int, open_cases: int, effect_overrides: dict[str, str]) -> dict[str, Any]:
    """The data set, in a few statements; returns the operator and the project."""
    from django.contrib.auth.models import User
    from django.db import connection, transaction

    from durability.models import CASE_NAMES, Attempt, Case, Effect, Membership, Project, Role

    project = Project.objects.create(name="bench")
    operator = User.objects.create_user("operator")
    Membership.objects.create(project=project, user=operator, role=Role.OPERATOR)
    closed_cases = open_cases * 9
    # Effects 1..open_cases have the open cases; the next 9× that many had cases, closed.
    reasons = (
        "CASE WHEN g %% 10 < 7 THEN 'uncertain' WHEN g %% 10 < 8 THEN 'late_success' "
        "WHEN g %% 10 < 9 THEN 'version_drift' ELSE 'duplicate_effect' END"
    )
    effect_sql, effect_params = effect_rows(
        project,
        {
            **effect_overrides,
            "state": f"CASE WHEN g <= {open_cases} AND g %% 10 < 7 THEN 'timed_out' "
            "ELSE 'succeeded' END",
        },
    )
    workflow = f"(ARRAY{WORKFLOWS!r})[1 + g %% {len(WORKFLOWS)}]"
    agent = f"(ARRAY{AGENTS!r})[1 + g %% {len(AGENTS)}]"
    attempt_sql, attempt_params = _insert_select(
        Attempt,
        f"generate_series(1, %s) AS g JOIN {Effect._meta.db_table} e "
        "ON e.key = 'bench:' || g AND e.project_id = %s",
        {
            "project_id": "e.project_id",
            "effect_id": "e.id",
            "number": "1",
            "started": "e.created",
            "context": f"jsonb_build_object('agent', {agent}, 'workflow', {workflow}, "
            "'workflow_version', '2.' || (g %% 7), 'model', 'gpt-5')",
            "run_id": "e.run_id",
        },
    )
    case_sql, case_params = _insert_select(
        Case,
        f"generate_series(1, %s) AS g JOIN {Effect._meta.db_table} e "
        "ON e.key = 'bench:' || g AND e.project_id = %s",
        {
            "project_id": str(project.pk),
            "effect_id": "e.id",
            "reason": reasons,
            "severity": "CASE WHEN g %% 10 = 9 THEN 4 WHEN g %% 10 = 8 THEN 1 ELSE 3 END",
            "summary": "'Attempt 1 timed out: no answer in 30s (' || g || ')'",
            "opened": "now() - make_interval(secs => g * 7)",
            "closed": f"CASE WHEN g > {open_cases} THEN now() ELSE NULL END",
            "assignee_id": f"CASE WHEN g %% 10 = 3 THEN {operator.pk} ELSE NULL END",
            "version": "1",
            "group_key": GROUPS,
            **{name: f"e.{name}" for name in CASE_NAMES},
        },
    )
    tables = [model._meta.db_table for model in (Effect, Attempt, Case)]
    started = time.perf_counter()
    with transaction.atomic(), bulk(tables), connection.cursor() as cursor:
        cursor.execute(effect_sql, [*effect_params, effects])
        cursor.execute(attempt_sql, [*attempt_params, effects, project.pk])
        cursor.execute(case_sql, [*case_params, open_cases + closed_cases, project.pk])
    print(f"filled in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    tally()
    return {"operator": operator, "project": project}


def tally() -> None:
    """Run the hourly tallies' job as the scheduler would: the first run over every hour,
    then a second (what a run every minute costs), each timed on stderr."""
    from django.db import connection

    from durability import tallies

    for run in ("first", "second"):
        started = time.perf_counter()
        rows = tallies.projects_tally()
        took = time.perf_counter() - started
        print(f"tallies, {run} run: {rows:,} rows in {took:.2f}s", file=sys.stderr)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durability_effecthour")


def _paths(client: Any) -> dict[str, str]:
    """The page under each filter a triager uses, and a second page of each sort."""
    import re

    paths = {
        "all, oldest first": "/queue/",
        "all, most severe first": "/queue/?sort=severity",
        "reason=uncertain": "/queue/?reason=uncertain",
        "reason=duplicate_effect": "/queue/?reason=duplicate_effect",
        "severity>=critical": "/queue/?severity=4",
        "kind=deploy": "/queue/?kind=deploy",
        "target=k8s": "/queue/?target=k8s",
        "workflow=refund-bot": "/queue/?workflow=refund-bot",
        "assignee=me": "/queue/?assignee=me",
        "assignee=none, severity": "/queue/?assignee=none&sort=severity",
        "kind+target+reason": "/queue/?kind=deploy&target=k8s&reason=uncertain",
        "grouped, oldest first": "/queue/?grouped=1",
        "grouped, most severe first": "/queue/?grouped=1&sort=severity",
        "grouped, reason=uncertain": "/queue/?grouped=1&reason=uncertain",
        "grouped, assignee=me": "/queue/?grouped=1&assignee=me",
        "grouped, kind+target": "/queue/?grouped=1&kind=deploy&target=k8s",
    }
    seconds = [
        ("page 2, oldest", "/queue/"),
        ("page 2, severe", "/queue/?sort=severity"),
        ("grouped, page 2", "/queue/?grouped=1"),
        ("grouped, page 2, severe", "/queue/?grouped=1&sort=severity"),
    ]
    for label, first in seconds:
        html = client.get(first).content.decode()
        after = re.search(r'hx-get="(\?[^"]*after=[^"]+)"', html)
        assert after, f"{first} has no second page"
        paths[label] = "/queue/" + after.group(1).replace("&amp;", "&")
    # A pile-up of GROUPS expanded: the first page of its cases, as htmx fetches it.
    paths["a group expanded"] = f"/queue/?group={hashlib.md5(b'pile:0').hexdigest()}"
    since = re.search(r"since=(\d+)", client.get("/queue/").content.decode())
    paths["pulse (polled every 5s)"] = f"/queue/pulse/?since={since.group(1) if since else 0}"
    return paths


def _time(client: Any, path: str, repeat: int) -> list[float]:
    headers = {"HX-Request": "true"} if "after=" in path or "group=" in path else {}
    client.get(path, headers=headers)  # warm: the first request compiles templates
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, (path, response.status_code)
    return times


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def explain_captured(queries: list[dict[str, Any]], tables: tuple[str, ...]) -> None:
    """Print EXPLAIN ANALYZE of each captured SELECT that reads one of `tables`."""
    from django.db import connection

    with connection.cursor() as cursor:
        for query in queries:
            sql = query["sql"]
            if not sql.lstrip().lstrip("(").upper().startswith("SELECT"):  # a UNION's too
                continue
            if not any(table in sql for table in tables):
                continue
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql)
            shown = sql if len(sql) <= 320 else f"{sql[:100]} … {sql[-220:]}"
            print("--", shown.replace("\n", " "))
            for (line,) in cursor.fetchall():
                print("   ", line)


def explain(client: Any, path: str, tables: tuple[str, ...] = ("durability_case",)) -> None:
    """Request `path` and print the plans of its queries that read `tables`."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        client.get(path)
    print(f"\n== {path}: {len(captured)} queries")
    explain_captured(captured.captured_queries, tables)


def measure(client: Any, repeat: int) -> dict[str, list[float]]:
    """The server times of the page under each of `_paths`, `repeat` requests each."""
    return {label: _time(client, path, repeat) for label, path in _paths(client).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=10_000, help="open cases")
    parser.add_argument("--repeat", type=int, default=40, help="requests per filter")
    parser.add_argument("--db", default="tb_bench_queue")
    parser.add_argument("--explain", action="store_true", help="print the query plans")
    args = parser.parse_args()

    data = build(args.db, args.effects, args.open)
    from django.test import Client

    client = Client()
    client.force_login(data["operator"])
    page = client.get("/queue/").content.decode()
    assert f"{args.open} open cases" in page, "the data set is not what the page shows"

    print(f"{args.effects:,} effects, {args.open:,} open cases, {args.repeat} requests each")
    print(f"{'filter':<28} {'median ms':>10} {'p95 ms':>8}")
    everything = []
    for label, times in measure(client, args.repeat).items():
        everything += times
        print(f"{label:<28} {statistics.median(times) * 1000:>10.1f} {_p95(times) * 1000:>8.1f}")
    print(
        f"{'all requests':<28} {statistics.median(everything) * 1000:>10.1f} "
        f"{_p95(everything) * 1000:>8.1f}"
    )
    if args.explain:
        for path in [
            "/queue/",
            "/queue/?sort=severity",
            "/queue/?workflow=refund-bot",
            "/queue/?grouped=1",
            "/queue/?grouped=1&sort=severity",
        ]:
            explain(client, path)


if __name__ == "__main__":
    main()
