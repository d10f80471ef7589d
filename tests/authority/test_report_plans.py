"""The authority report's table reads each row's evidence by the receipt's effect index, for
the page's rows alone, never by a scan of every receipt of the project.

Each plan is PostgreSQL's for the statement the page ran (read back with the values in it),
on a project whose effects mostly have a receipt, analyzed as autovacuum would.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.authority import report
from durability.models import Effect, Project, Receipt
from tests import plans

RECEIPT = "durability_receipt"


def _read(scan: plans.Node) -> str:
    """How a node reads its table: "Seq Scan", "Index Scan on <index>", "Bitmap Heap Scan on
    <the indexes of its bitmap>", ..."""
    index = ", ".join(sorted(set(plans.index_names(scan))))
    return scan["Node Type"] + (f" on {index}" if index else "")


def _table_plan(run: Any) -> list[str]:
    """How the statement of `run` that reads the effects' strongest evidence (the table's)
    reads the receipts."""
    with CaptureQueriesContext(connection) as queries:
        run()
    (table,) = [q["sql"] for q in queries.captured_queries if '"strongest_system"' in q["sql"]]
    return [_read(scan) for scan in plans.scans(plans.explain(table), RECEIPT)]


@pytest.fixture(params=[2_000, 20_000], ids=["small", "grown"])
def evidenced(request: pytest.FixtureRequest, project: Project) -> Project:
    """`param` effects of the project in the report's week, 60% of them with a receipt."""
    plans.grow(
        Effect,
        request.param,
        sql={"key": "'e-' || n"},
        project=project,
        kind="payment",
        target="stripe",
    )
    plans.grow(
        Receipt,
        plans.EFFECTS + " AND mod(substr(e.key, 3)::int, 5) < 3",
        (project.pk,),
        sql={"effect": "e.id", "key": "e.key", "external_id": "e.key"},
        project=project,
        system="stripe",
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
