"""The pages read an effect's rows by the indexes that lead with its project: the queue
rows' current attempt, and the story's attempts, receipts and cases.

Each plan is PostgreSQL's for the statement the code ran, on a fresh database (2,000 rows)
and a grown one (20,000), among the rows of another project.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.desk import queue, story
from durability.models import Case, Effect, Project, Reason, Severity
from tests import plans


def _plan_scans(sql: str, table: str) -> set[str]:
    """How the plan of `sql` reads `table`: the names of the indexes it scans (directly or by
    a bitmap), or "Seq Scan"."""
    return {
        read
        for scan in plans.scans(plans.explain(sql), table)
        for read in plans.index_names(scan) or [scan["Node Type"]]
    }


@pytest.fixture(params=[2_000, 20_000], ids=["fresh", "grown"])
def database(request: pytest.FixtureRequest, project: Project) -> list[Case]:
    """Effects with two attempts, a receipt and an open case each, half the project's and
    half another's, analyzed; the project's cases."""
    other = Project.objects.create(name="beta")
    for owner in (project, other):
        plans.grow(
            Effect,
            request.param // 2,
            sql={"key": "'e-' || n"},
            project=owner,
            kind="payment",
            target="stripe",
        )
        plans.attempts_and_receipts(owner, context={"workflow_version": "1"})
        plans.grow(
            Case,
            plans.EFFECTS,
            (owner.pk,),
            sql={"effect": "e.id"},
            project=owner,
            reason=Reason.UNCERTAIN,
            severity=Severity.HIGH,
            summary="timed out",
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durability_effect, durability_attempt, durability_receipt")
        cursor.execute("ANALYZE durability_case")
    return list(Case.objects.filter(project=project).order_by("pk"))


def test_the_queue_rows_read_their_current_attempt_by_the_effects_attempt_index(
    database: list[Case], project: Project
) -> None:
    with CaptureQueriesContext(connection) as queries:
        rows = queue.rows_of(project, [c.pk for c in database[:50]])

    assert [row.workflow_version for row in rows] == ["1"] * 50  # type: ignore[attr-defined]
    (sql,) = [q["sql"] for q in queries.captured_queries if "durability_attempt" in q["sql"]]
    assert _plan_scans(sql, "durability_attempt") == {"attempt_of_effect_uniq"}


def test_the_story_reads_the_effects_rows_by_the_indexes_that_lead_with_its_project(
    database: list[Case],
) -> None:
    effect = database[0].effect
    assert effect is not None

    with CaptureQueriesContext(connection) as queries:
        story.effect_story(effect)

    def read(table: str) -> str:
        (sql,) = [q["sql"] for q in queries.captured_queries if f'FROM "{table}"' in q["sql"]]
        return sql

    assert _plan_scans(read("durability_attempt"), "durability_attempt") == {
        "attempt_of_effect_uniq"
    }
    assert _plan_scans(read("durability_receipt"), "durability_receipt") == {
        "receipt_of_effect_idx"
    }
    assert _plan_scans(read("durability_case"), "durability_case") == {"case_of_effect_idx"}
