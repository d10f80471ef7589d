"""What authority costs: the grant check on the intent path, and the authority report page.

    .venv/bin/python benchmarks/authority.py [--effects 1000000] [--intents 300] [--repeat 10]

Creates (dropping it first) the PostgreSQL database named by --db and migrates it. First
records --intents intents through the state machine (in process, no HTTP) under each kind
of authority and prints the median and p95 time of one intent; the limited grant already
has 80% of --effects (spread over a week) under it, and its limits sum its last day.
Then requests the authority report (/authority/audit/) over those effects (a week, 80%
under that grant, 60% with a receipt) through Django's test client and prints the server
time of each view.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WEEK = 7 * 24 * 3600
sys.path.insert(0, str(ROOT))

# The queue benchmark's helpers build the data set.
from benchmarks.queue_page import (  # noqa: E402
    _fresh_database,
    _insert_select,
    _p95,
    bulk,
    django_on,
    effect_rows,
    tally,
)


def _fill(project: Any, limited: Any, effects: int) -> None:
    """`effects` effects over the last week; 80% under `limited`, 60% with a receipt."""
    from django.db import connection, transaction

    from durability.models import Effect, Receipt

    effect_sql, effect_params = effect_rows(
        project,
        {
            "kind": "'payment'",
            "target": "'stripe'",
            "state": "CASE WHEN g %% 10 < 6 THEN 'succeeded' WHEN g %% 10 < 9 THEN 'pending' "
            "ELSE 'denied' END",
            "grant_id": f"CASE WHEN g %% 5 = 0 THEN NULL ELSE {limited.pk} END",
            "amount": "CASE WHEN g %% 5 = 0 THEN NULL ELSE 0.01 END",
            "currency": "CASE WHEN g %% 5 = 0 THEN '' ELSE 'EUR' END",
            "created": f"now() - make_interval(secs => g * {WEEK - 60}.0 / {effects})",
            "updated": "now()",
        },
    )
    receipt_sql, receipt_params = _insert_select(
        Receipt,
        f"{Effect._meta.db_table} e CROSS JOIN LATERAL (SELECT substr(e.key, 7)::int AS g) n",
        {
            "project_id": "e.project_id",
            "effect_id": "e.id",
            "key": "e.key",
            "system": "'stripe'",
            "external_id": "'re_' || n.g",
            "strength": "CASE WHEN n.g %% 3 = 0 THEN 'provider_confirmed' "
            "ELSE 'agent_reported' END",
            "received": "e.created",
        },
    )
    receipt_sql += " WHERE e.state = 'succeeded' AND e.project_id = %s"
    tables = [Effect._meta.db_table, Receipt._meta.db_table]
    started = time.perf_counter()
    with transaction.atomic(), bulk(tables), connection.cursor() as cursor:
        cursor.execute(effect_sql, [*effect_params, effects])
        cursor.execute(receipt_sql, [*receipt_params, project.pk])
    print(f"filled in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    tally()


def _times(run: Callable[[int], Any], n: int) -> list[float]:
    run(-1)  # warm
    times = []
    for i in range(n):
        started = time.perf_counter()
        run(i)
        times.append(time.perf_counter() - started)
    return times


def _line(label: str, times: list[float]) -> None:
    print(f"{label:<44} {statistics.median(times) * 1000:>10.2f} {_p95(times) * 1000:>8.2f}")


def build(db: str, effects: int) -> dict[str, Any]:
    """A fresh `db`, migrated, Django set up on it, with the project, its operator, three
    grants (everything, limited, approval) and `effects` effects (see `_fill`)."""
    from decimal import Decimal

    _fresh_database(db)
    django_on(db)
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from durability.authority import grants
    from durability.models import Membership, Project, Role

    call_command("migrate", verbosity=0)
    project = Project.objects.create(name="bench")
    operator = User.objects.create_user("operator")
    Membership.objects.create(project=project, user=operator, role=Role.OPERATOR)

    def grant(name: str, **terms: Any) -> Any:
        terms = {"kinds": ["*"], "targets": ["*"], **terms}
        return grants.grant_create(
            project=project, actor="bench", terms=grants.Terms(name=name, **terms)
        )

    data = {
        "project": project,
        "operator": operator,
        "everything": grant("everything"),
        "limited": grant(
            "limited",
            currency="EUR",
            max_amount=Decimal(100),
            max_daily_amount=Decimal(10**9),
            max_count=10**9,
            count_period_s=86400,
        ),
        "approval": grant("approval", requires_approval=True),
    }
    _fill(project, data["limited"], effects)
    return data


def intents_measure(data: dict[str, Any], effects: int, intents: int) -> dict[str, list[float]]:
    """The times of `intents` intents through the state machine under each kind of authority."""
    from durability.api.commands import intent_of
    from durability.api.schemas import IntentIn
    from durability.ledger import intents as ledger_intents
    from durability.models import Project

    # label -> (the project's policy for intents without a grant, the intent's fields)
    authorities: dict[str, tuple[str, dict[str, Any]]] = {
        "no grant (audit: proceeds, no case)": ("audit", {}),
        "no grant (audit_cases: proceeds, a low case)": ("audit_cases", {}),
        "a grant without limits": ("audit", {"authority": {"grant": data["everything"].pk}}),
        f"a grant with limits, {effects * 4 // 35:,} effects/day": (
            "audit",
            {
                "authority": {"grant": data["limited"].pk},
                "amount": {"value": "1.00", "currency": "EUR"},
            },
        ),
        "a grant that requires approval (answers wait)": (
            "audit",
            {"authority": {"grant": data["approval"].pk}},
        ),
    }
    project = data["project"]
    measured = {}
    for n, (label, (policy, fields)) in enumerate(authorities.items()):
        Project.objects.filter(pk=project.pk).update(authority_policy=policy)
        project.authority_policy = policy

        def intent(i: int, prefix: str = f"a{n}", fields: dict[str, Any] = fields) -> None:
            body = {"key": f"{prefix}:{i}", "kind": "payment", "target": "stripe", **fields}
            ledger_intents.intent_record(
                project=data["project"], actor="bench", intent=intent_of(IntentIn(**body))
            )

        measured[label] = _times(intent, intents)
    return measured


def report_measure(data: dict[str, Any], repeat: int) -> dict[str, list[float]]:
    """The server times of the authority report's views, `repeat` requests each."""
    from django.test import Client

    client = Client()
    client.force_login(data["operator"])
    pages = {
        "report, last 7 days": "/authority/audit/",
        "report, evidence without authority": "/authority/audit/?quadrant=evidence_unauthorized",
        "report, one grant": f"/authority/audit/?grant={data['limited'].pk}",
        "CSV of the page on screen": "/authority/audit.csv?page=1",
    }
    measured = {}
    for label, path in pages.items():

        def get(i: int, path: str = path) -> None:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
            if path.endswith("page=1"):
                response.getvalue()

        measured[label] = _times(get, repeat)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--intents", type=int, default=300, help="intents per authority")
    parser.add_argument("--repeat", type=int, default=10, help="requests per page")
    parser.add_argument("--db", default="tb_bench_authority")
    args = parser.parse_args()

    data = build(args.db, args.effects)
    print(f"one intent through the state machine, {args.intents} each")
    print(f"{'authority':<44} {'median ms':>10} {'p95 ms':>8}")
    for label, times in intents_measure(data, args.effects, args.intents).items():
        _line(label, times)
    print(f"\nthe authority report over {args.effects:,} effects, {args.repeat} requests each")
    print(f"{'page':<44} {'median ms':>10} {'p95 ms':>8}")
    for label, times in report_measure(data, args.repeat).items():
        _line(label, times)


if __name__ == "__main__":
    main()
