"""Staged writes (`durability.rows.Writes`) go as few statements on PostgreSQL, and each row
ends as it would after `save()`: new rows get the keys the database drew, a row written
through two instances gets both writes, in order, and a bulk of writes goes in parts."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability import rows
from durability.models import Case, Effect, Project, Reason, Severity, State
from tests.ledger import support as ledger

pytestmark = pytest.mark.django_db


def _sent(writes: rows.Writes) -> list[str]:
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        writes.send()
    return [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]


def _case(effect: Effect, summary: str) -> Case:
    return Case(
        project_id=effect.project_id,
        effect=effect,
        reason=Reason.UNCERTAIN,
        severity=Severity.LOW,
        summary=summary,
        closed=timezone.now(),  # closed: an effect has one open case per reason
        **effect.case_names(),
    )


def test_new_rows_and_updates_go_as_one_statement_and_get_their_keys(project: Project) -> None:
    effect = ledger.effect_in(project, State.PENDING)
    first, second = _case(effect, "one"), _case(effect, "two")
    effect.agent = "agent-2"
    writes = rows.Writes()
    writes.stage(first)
    writes.stage(effect, "agent")
    writes.stage(second)

    assert len(_sent(writes)) == 1
    assert first.pk != second.pk
    assert Case.objects.get(pk=first.pk).summary == "one"
    assert Case.objects.get(pk=second.pk).summary == "two"
    assert Effect.objects.get(pk=effect.pk).agent == "agent-2"


def test_a_row_written_through_two_instances_gets_both_writes_in_order(
    project: Project,
) -> None:
    effect = ledger.effect_in(project, State.PENDING)
    again = Effect.objects.get(pk=effect.pk)
    effect.agent, again.agent, again.workflow = "first", "second", "flow"
    writes = rows.Writes()
    writes.stage(effect, "agent")
    writes.stage(again, "agent", "workflow")

    assert len(_sent(writes)) == 2
    stored = Effect.objects.get(pk=effect.pk)
    assert (stored.agent, stored.workflow) == ("second", "flow")


def test_a_bulk_of_writes_goes_in_parts_of_writes_per_statement(project: Project) -> None:
    """As many rows to a statement as WRITES_PER_STATEMENT allows."""
    effect = ledger.effect_in(project, State.PENDING)
    per = rows.WRITES_PER_STATEMENT
    cases = [_case(effect, f"case {n}") for n in range(per * 2 + 1)]
    writes = rows.Writes()
    for case in cases:
        writes.stage(case)

    assert len(_sent(writes)) == 3
    assert sorted(Case.objects.filter(effect=effect).values_list("pk", flat=True)) == sorted(
        case.pk for case in cases
    )
