"""The search's tiers are served by its trigram indexes (and the unique ones), not by scans,
at a small scale: PostgreSQL's plans (EXPLAIN) of the statements the search ran, read back
with their values, on a project among 20,000 effects, receipts, runs and traces of its own
and of another project, vacuumed as autovacuum would (GIN's pending entries merged into the
index: until then the planner prices every search with a scan of them) and analyzed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.models import (
    Approval,
    Case,
    Comment,
    Effect,
    Grant,
    Project,
    Reason,
    Receipt,
    Resolution,
    Severity,
    Signoff,
)
from durability.search.queries import search
from tests import plans
from trajectories.models import Run, RunTrace

ROWS = 10_000
TABLES = (
    "durability_effect",
    "durability_receipt",
    "trajectories_run",
    "trajectories_runtrace",
    "durability_case",
    "durability_resolution",
    "durability_comment",
    "durability_signoff",
)


pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def grown(django_db_setup: None, django_db_blocker: Any) -> Iterator[Project]:
    """The project among its own rows and another project's, the same for every test here:
    grown once (plans.for_the_module), as no test writes."""
    with plans.for_the_module(django_db_blocker):
        project = Project.objects.create(name="alpha")
        yield _grown(project)


def _grown(project: Project) -> Project:
    other = Project.objects.create(name="beta")
    for owner in (project, other):
        of_owner = (owner.pk,)
        plans.grow(
            Effect,
            ROWS,
            sql={
                "key": "'refund:' || n",
                "run_id": "'refund:' || n",
                "target": "(ARRAY['stripe', 'smtp', 'k8s'])[mod(n, 3) + 1]",
                "agent": "(ARRAY['refund-bot', 'mail-bot'])[mod(n, 2) + 1]",
                "request": "jsonb_build_object("
                "'order', n, 'customer', 'customer' || n || '@example.com')",
            },
            project=owner,
            kind="payment",
        )
        plans.grow(
            Receipt,
            plans.EFFECTS,
            of_owner,
            sql={"effect": "e.id", "key": "e.key", "external_id": "'re_' || e.id || 'x'"},
            project=owner,
            system="stripe",
        )
        plans.grow(Run, ROWS, sql={"run_id": "'ticket-' || n"}, project=owner, agent="refund-bot")
        plans.grow(
            RunTrace,
            "trajectories_run r WHERE r.project_id = %s",
            of_owner,
            sql={"trace_id": "md5(r.id::text)", "run": "r.id"},
            project=owner,
        )
        # Each effect's case, closed with a verdict's reason and commented on; an approval
        # signed with a reason.
        plans.grow(
            Case,
            plans.EFFECTS,
            of_owner,
            sql={"effect": "e.id", "run_id": "e.key"},
            project=owner,
            reason=Reason.UNCERTAIN,
            severity=Severity.HIGH,
            summary="timed out",
            closed=timezone.now(),
        )
        cases = "durability_case c WHERE c.project_id = %s"
        plans.grow(
            Resolution,
            cases,
            of_owner,
            sql={"case": "c.id", "note": "'checked ' || c.id || 'x'"},
            project=owner,
            actor="user:x",
            action="x",
        )
        plans.grow(
            Comment,
            cases,
            of_owner,
            sql={"case": "c.id", "body": "'asked about ' || c.id || 'x'"},
            project=owner,
            actor="user:x",
        )
        g = Grant.objects.create(project=owner, name="g", kinds=["*"], targets=["*"])
        plans.grow(
            Approval, plans.EFFECTS, of_owner, sql={"effect": "e.id"}, project=owner, grant=g
        )
        signer = User.objects.create_user(f"signer-{owner.pk}")
        plans.grow(
            Signoff,
            "durability_approval a WHERE a.project_id = %s",
            of_owner,
            sql={"approval": "a.id", "reason": "'fine ' || a.id || 'x'"},
            user=signer,
            verdict="approve",
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gin_clean_pending_list(indexrelid) FROM pg_index "
            "WHERE indexrelid::regclass::text LIKE 'search_%%'"
        )
        cursor.execute(
            "ANALYZE durability_effect, durability_receipt, trajectories_run, trajectories_runtrace"
        )
        cursor.execute(
            "ANALYZE durability_case, durability_resolution, durability_comment, "
            "durability_approval, durability_signoff"
        )
    return project


def _selects(queries: CaptureQueriesContext) -> list[str]:
    """The SELECTs among the statements (not the savepoint and the SET LOCAL around them)."""
    return [q["sql"] for q in queries.captured_queries if q["sql"].lstrip("(").startswith("SELECT")]


def _plans_of(project: Project, q: str) -> dict[str, set[str]]:
    """The indexes each table is read by, over every statement the search ran for `q`."""
    with CaptureQueriesContext(connection) as queries:
        search(project, q)
    read: dict[str, set[str]] = {}
    for query in _selects(queries):
        plan = plans.explain(query)
        for table in TABLES:
            read.setdefault(table, set()).update(plans.indexes(plan, table))
    return read


def _scans(project: Project, q: str) -> list[str]:
    """The sequential scans of the statements the search ran for `q`."""
    with CaptureQueriesContext(connection) as queries:
        search(project, q)
    found = []
    for query in _selects(queries):
        found += [
            f"Seq Scan on {scan['Relation Name']}"
            for scan in plans.nodes(plans.explain(query))
            if scan["Node Type"] == "Seq Scan"
        ]
    return found


def test_a_key_part_and_a_request_text_are_found_by_the_effects_trigram_index(grown):
    read = _plans_of(grown, "customer4242@")
    assert "search_effect_text_idx" in read["durability_effect"]
    read = _plans_of(grown, "refund:4242")
    assert {"effect_project_key_uniq", "search_effect_text_idx"} <= read["durability_effect"]


def test_an_external_id_is_found_by_the_receipts_trigram_index(grown):
    receipt = Receipt.objects.filter(project=grown).order_by("pk")[4242]
    read = _plans_of(grown, receipt.external_id)
    assert "search_receipt_external_id_idx" in read["durability_receipt"]


def test_a_run_and_a_trace_are_found_by_the_runs_trigram_indexes(grown):
    trace = RunTrace.objects.filter(project=grown).order_by("pk")[4242]
    read = _plans_of(grown, trace.trace_id[:12])
    assert "search_runtrace_trace_idx" in read["trajectories_runtrace"]
    read = _plans_of(grown, "ticket-4242")
    assert {"run_project_run_id_uniq", "search_run_text_idx"} <= read["trajectories_run"]


def test_a_run_id_finds_effects_and_cases_and_texts_their_cases_and_approvals_by_index(grown):
    read = _plans_of(grown, "refund:4242")
    assert "effect_of_run_idx" in read["durability_effect"]
    assert "case_of_run_idx" in read["durability_case"]
    case = Case.objects.filter(project=grown).order_by("pk")[4242]
    read = _plans_of(grown, f"checked {case.pk}x")
    assert "search_resolution_note_idx" in read["durability_resolution"]
    read = _plans_of(grown, f"asked about {case.pk}x")
    assert "search_comment_body_idx" in read["durability_comment"]
    approval = Approval.objects.filter(project=grown).order_by("pk")[4242]
    read = _plans_of(grown, f"fine {approval.pk}x")
    assert "search_signoff_reason_idx" in read["durability_signoff"]


def test_no_tier_of_a_rare_text_scans_a_table(grown):
    assert _scans(grown, "customer4242@") == []
    assert _scans(grown, "ticket-4242") == []
