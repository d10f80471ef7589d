"""The large tables (the ledger's and the trajectories') can be distributed by project: each
has `project_id`, and every index and unique constraint of theirs leads with it
(docs/scaling.md, "Distributing by project"), but for the few listed here, each with the
reason it does not.

Read from the database that the migrations made, so Django's own foreign-key indexes and
the indexes of a migration's SQL count as much as the models' named ones.
"""

from __future__ import annotations

import pytest
from django.db import connection, models

from durability.models import (
    Attempt,
    AuditEntry,
    Case,
    CaseAlert,
    CaseHour,
    Comment,
    Effect,
    EffectHour,
    Notice,
    Probe,
    Receipt,
    Resolution,
    WebhookDelivery,
)
from trajectories.models import EffectLink, RequestedToolCall, Run, RunTrace, SeenEvent, Span

# The tables that grow with the ledger's traffic (the configuration tables stay small and
# become reference tables, copied to every node).
LARGE: list[type[models.Model]] = [
    Effect,
    Attempt,
    Receipt,
    EffectHour,
    CaseHour,
    Case,
    Comment,
    Resolution,
    CaseAlert,
    Notice,
    AuditEntry,
    Probe,
    WebhookDelivery,
    Run,
    RunTrace,
    Span,
    RequestedToolCall,
    SeenEvent,
    EffectLink,
]

# Indexes that do not lead with project_id, as table(columns), and why.
CROSS_PROJECT = {
    "durability_effect(deadline)": "the deadline sweep (effect_sweep_pending_idx): pending "
    "effects past their deadline in every project; on a distributed table every node runs it "
    "over its own shards",
    "durability_effect(created)": "the link repair pass (effect_link_repair_idx): recent "
    "effects that name a trajectory, in every project, run on every node",
    "durability_notice(created)": "the notices' outbox (notice_unsent_idx): unsent emails of "
    "every project, run on every node",
    "durability_notice(user_id)": "a person's removal deletes their notices in every project",
    "durability_case(assignee_id)": "a person's removal unassigns their cases in every project",
    "durability_probe(config_id)": "a reconciler's removal: Django's SET_NULL names only the "
    "config's id",
    "durability_resolution(case_id)": "a case's one resolution (a OneToOneField, unique on "
    "case_id alone); before distributing, a foreign key with a unique (project, case)",
    "durability_casealert(case_id)": "a case's one alert (a OneToOneField, unique on case_id "
    "alone); before distributing, a foreign key with a unique (project, case)",
    "trajectories_run(last_day)": "span retention, every project at once: the runs whose "
    "spans all expired",
    "trajectories_runtrace(day)": "span retention, every project at once: the traces whose "
    "partition was dropped",
    # Retention deletes the expired runs by id (every project at once); Django's cascade
    # then finds their spans, traces and links by the run's id alone.
    "trajectories_span(run_id, start, id)": "retention's cascade from the runs it deletes "
    "(the run page reads it by project and run)",
    "trajectories_runtrace(run_id)": "retention's cascade from the runs it deletes",
    "trajectories_effectlink(run_id)": "retention's cascade from the runs it deletes (the "
    "run pages read it by project and run)",
}


def _indexes(table: str) -> dict[str, list[str]]:
    """Every index of `table` but its primary key (unique constraints and partial unique
    indexes among them): name → columns, in order ("?" for an expression)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {
        name: [column or "?" for column in about["columns"]]
        for name, about in found.items()
        if (about["index"] or about["unique"]) and not about["primary_key"]
    }


@pytest.mark.django_db
@pytest.mark.parametrize("model", LARGE, ids=lambda m: m._meta.db_table)
def test_every_index_of_a_large_table_leads_with_its_project(model: type[models.Model]) -> None:
    table = model._meta.db_table
    indexes = _indexes(table)

    assert "project_id" in [f.column for f in model._meta.concrete_fields]
    led_otherwise = {
        f"{table}({', '.join(columns)})": name
        for name, columns in indexes.items()
        if columns[0] != "project_id"
    }
    unexplained = {key: name for key, name in led_otherwise.items() if key not in CROSS_PROJECT}
    assert unexplained == {}


@pytest.mark.django_db
def test_every_exception_is_an_index_that_exists() -> None:
    existing = {
        f"{model._meta.db_table}({', '.join(columns)})"
        for model in LARGE
        for columns in _indexes(model._meta.db_table).values()
    }

    assert set(CROSS_PROJECT) - existing == set()
