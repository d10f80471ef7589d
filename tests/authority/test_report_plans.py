"""The authority report's table reads each row's evidence by the receipt's effect index, for
the page's rows alone, never by a scan of every receipt of the project.

Each plan is PostgreSQL's for the statement the page ran (read back with the values in it),
on a project whose effects mostly have a receipt, analyzed as autovacuum would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.authority import report
from durability.models import Effect, Project, Receipt

RECEIPT = "durability_receipt"


def _scans(plan: Any, table: str) -> Iterator[str]:
    """How the plan reads `table`, node by node: "Seq Scan", "Index Scan on <index>",
    "Bitmap Heap Scan on <the index of its bitmap>", ..."""
    if isinstance(plan, dict):
        if plan.get("Relation Name") == table:
            index = plan.get("Index Name")
            if plan["Node Type"] == "Bitmap Heap Scan":
                index = ", ".join(sorted(set(_bitmap_indexes(plan["Plans"]))))
            yield plan["Node Type"] + (f" on {index}" if index else "")
        for value in plan.values():
            yield from _scans(value, table)
    elif isinstance(plan, list):
        for value in plan:
            yield from _scans(value, table)


def _bitmap_indexes(plan: Any) -> Iterator[str]:
    if isinstance(plan, dict):
        if plan.get("Node Type") == "Bitmap Index Scan":
            yield plan["Index Name"]
        for value in plan.values():
            yield from _bitmap_indexes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _bitmap_indexes(value)


def _table_plan(run: Any) -> list[str]:
    """How the statement of `run` that reads the effects' strongest evidence (the table's)
    reads the receipts."""
    with CaptureQueriesContext(connection) as queries:
        run()
    (table,) = [q["sql"] for q in queries.captured_queries if '"strongest_system"' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {table}")
        return list(_scans(cursor.fetchone()[0], RECEIPT))


@pytest.fixture(params=[2_000, 20_000], ids=["small", "grown"])
def evidenced(request: pytest.FixtureRequest, project: Project) -> Project:
    """`param` effects of the project in the report's week, 60% of them with a receipt."""
    effects = Effect.objects.bulk_create(
        Effect(project=project, key=f"e-{n}", kind="payment", target="stripe")
        for n in range(request.param)
    )
    Receipt.objects.bulk_create(
        Receipt(project=project, effect=e, key=e.key, system="stripe", external_id=e.key)
        for n, e in enumerate(effects)
        if n % 5 < 3
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durability_effect, durability_receipt")
    return project


def test_a_page_of_the_table_looks_up_only_its_rows_evidence(evidenced: Project) -> None:
    query = report.ReportQuery.default()

    scans = _table_plan(lambda: report.page(evidenced, query, None))

    # Row by row, by the effect's receipts index: a plain index scan, or (when dead rows of
    # earlier fills spread the table over more pages) a bitmap of the same index.
    assert scans
    assert set(scans) <= {
        "Index Scan on receipt_of_effect_idx",
        "Bitmap Heap Scan on receipt_of_effect_idx",
    }, scans


def test_the_page_shows_the_newest_effects_first_with_their_evidence(evidenced: Project) -> None:
    taken, before = report.page(evidenced, report.ReportQuery.default(timezone.now()), None)

    newest = Effect.objects.filter(project=evidenced).order_by("-id")
    assert [e.pk for e in taken] == [e.pk for e in newest[: report.PAGE_SIZE]]
    assert [report.evidenced(e) for e in taken] == [e.receipts.exists() for e in taken]
    assert before == taken[-1].pk
