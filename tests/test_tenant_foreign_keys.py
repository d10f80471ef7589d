"""A foreign key between two tenant tables names the project beside the parent:
`(project_id, effect_id) → durability_effect (project_id, id)`, so that PostgreSQL's check
of a deleted parent (`SELECT 1 FROM child WHERE project_id = $1 AND effect_id = $2`) reads
the child's project-led index, not the whole table with every other project's rows in it
(migration 0031_composite_tenant_foreign_keys). The few that do not are listed here, each
with its reason.

Read from the database that the migrations made: Django's own keys and the migration's SQL.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.db import connection

from durability.models import Attempt, Effect, Project

# Single-column keys between tenant tables, as child(column) → parent, and why.
BY_ID_ALONE = {
    "durability_resolution(case_id) → durability_case": "a case's one resolution (a "
    "OneToOneField): its unique case_id index serves the check",
    "durability_casealert(case_id) → durability_case": "a case's one alert (a "
    "OneToOneField): its unique case_id index serves the check",
    "durability_approval(effect_id) → durability_effect": "an effect's one approval (a "
    "OneToOneField): its unique effect_id index serves the check",
    "durability_grant(supersedes_id) → durability_grant": "a version's one successor (a "
    "OneToOneField within a lineage): its unique index serves the check",
    "durability_approval(grant_id) → durability_grant": "approvals keep Django's grant_id "
    "index (PROTECT asks by the grant's id alone); a small table",
    "durability_probe(config_id) → durability_reconcilerconfig": "a reconciler's removal: "
    "Django's SET_NULL names only the config's id, so the probes keep its index",
    "trajectories_runtrace(run_id) → trajectories_run": "span retention deletes expired "
    "runs by id, every project at once; Django's cascade finds their traces by run_id",
    "trajectories_effectlink(run_id) → trajectories_run": "span retention's cascade, as "
    "for the traces",
    "trajectories_effectlink(effect_id) → durability_effect": "a link is its effect's (the "
    "primary key is effect_id): that index serves the check",
    # No index of the child leads with (project_id, column): a composite key would not make
    # the check cheaper than it is. Each parent is deleted only with its project, and is
    # one of few (archives, bulk actions, grants), or its children are (probes, notices).
    "durability_effect(payload_archive_id) → durability_archive": "no index of effects "
    "by archive; an archive is deleted only with its project",
    "durability_effecthour(grant_id) → durability_grant": "no index of the tallies by grant "
    "(effect_hour_uniq has it last); a grant is deleted only with its project",
    "durability_probe(receipt_id) → durability_receipt": "no index of probes by receipt; a "
    "receipt is deleted only with its project",
    "durability_notice(comment_id) → durability_comment": "no index of notices by comment; "
    "a comment is deleted only with its project",
    "durability_notice(bulk_id) → durability_bulkaction": "no index of notices by bulk "
    "action; a bulk action is deleted only with its project",
}


@dataclass(frozen=True)
class ForeignKey:
    name: str
    child: str
    columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    deferred: bool

    def __str__(self) -> str:
        return f"{self.child}({', '.join(self.columns[-1:])}) → {self.parent}"


def _between_tenant_tables() -> list[ForeignKey]:
    """Every foreign key whose table and referenced table both have project_id, but those
    to the project itself."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conname, c.conrelid::regclass::text, c.confrelid::regclass::text,
                   ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
                         ORDER BY k.i),
                   ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
                         JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n
                         ORDER BY k.i),
                   c.condeferrable AND c.condeferred
            FROM pg_constraint c
            WHERE c.contype = 'f'
              AND c.confrelid <> 'durability_project'::regclass
              AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid
                          AND a.attname = 'project_id' AND NOT a.attisdropped)
              AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.confrelid
                          AND a.attname = 'project_id' AND NOT a.attisdropped)
            ORDER BY 2, 1
            """
        )
        return [
            ForeignKey(name, child, tuple(cols), parent, tuple(pcols), deferred)
            for name, child, parent, cols, pcols, deferred in cursor.fetchall()
        ]


def _composite() -> list[ForeignKey]:
    return [fk for fk in _between_tenant_tables() if len(fk.columns) > 1]


def _indexes_led_by(fk: ForeignKey) -> list[str]:
    """The child's indexes that lead with the key's columns, in its order, and hold every row
    the key checks (none, or only the rows whose column is set: a condition any value of it
    meets, which is what PostgreSQL's check of a deleted parent can use)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.indexrelid::regclass::text,
                   ARRAY(SELECT a.attname::text
                         FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
                         ORDER BY k.o),
                   coalesce(pg_get_expr(i.indpred, i.indrelid), '')
            FROM pg_index i WHERE i.indrelid = %s::regclass AND i.indisvalid
            """,
            [fk.child],
        )
        found = cursor.fetchall()
    whole = {"", f"({fk.columns[-1]} IS NOT NULL)"}
    return [
        name
        for name, columns, condition in found
        if tuple(columns[: len(fk.columns)]) == fk.columns and condition in whole
    ]


@pytest.mark.django_db
def test_every_foreign_key_between_tenant_tables_leads_with_the_project() -> None:
    keys = _between_tenant_tables()

    single = {str(fk) for fk in keys if fk.columns[0] != "project_id"}
    assert single - set(BY_ID_ALONE) == set()
    composite = [fk for fk in keys if fk.columns[0] == "project_id"]
    assert {fk.parent_columns for fk in composite} == {("project_id", "id")}


@pytest.mark.django_db
def test_every_exception_is_a_foreign_key_that_exists() -> None:
    assert set(BY_ID_ALONE) - {str(fk) for fk in _between_tenant_tables()} == set()


@pytest.mark.django_db
def test_every_foreign_key_is_checked_at_commit_as_djangos_are() -> None:
    # The ledger writes a child before its parent's row in some transactions (staged rows).
    assert [fk.name for fk in _between_tenant_tables() if not fk.deferred] == []


@pytest.mark.django_db
def test_the_check_of_a_deleted_parent_has_an_index_led_by_the_key() -> None:
    assert [str(fk) for fk in _composite() if not _indexes_led_by(fk)] == []


def _scans(table: str) -> tuple[int, int]:
    """This transaction's sequential and index scans of `table` so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
            "WHERE relid = %s::regclass",
            [table],
        )
        seq, idx = cursor.fetchone()
    return int(seq), int(idx)


def _effect(project: Project, key: str) -> Effect:
    return Effect.objects.create(
        project=project, key=key, kind="payment", target="stripe", fingerprint="f"
    )


@pytest.mark.django_db
def test_deleting_an_effect_finds_its_attempts_by_index_beside_a_big_neighbour() -> None:
    alpha = Project.objects.create(name="alpha")
    beta = Project.objects.create(name="beta")
    gone = _effect(alpha, "gone")
    Attempt.objects.create(project=alpha, effect=gone, number=1)
    Attempt.objects.bulk_create(
        Attempt(project=beta, effect=effect, number=number)
        for effect in [_effect(beta, f"k{n}") for n in range(50)]
        for number in range(1, 101)
    )
    with connection.cursor() as cursor:
        # Checked at each statement, not at a commit the test never makes.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ANALYZE durability_attempt")
    Attempt.objects.filter(project=alpha, effect=gone)._raw_delete(connection.alias)

    seq, idx = _scans("durability_attempt")
    Effect.objects.filter(pk=gone.pk)._raw_delete(connection.alias)

    assert _scans("durability_attempt") == (seq, idx + 1)
    assert Attempt.objects.filter(project=beta).count() == 5000
