"""The search's new tiers (durability.search.queries), PostgreSQL's only, as in 0025: a run
id finds the run's effects and cases (btree on the project and the run id), and the text of
verdict reasons, comments and approvals' sign-off reasons (trigram GIN, the project beside
the text where the table has one; a sign-off has none, and is joined to its approval's).

SQLite (the demo) scans; the indexes are made by RunPython on PostgreSQL alone, so they are
not in the models' state.
"""

from django.db import migrations

INDEXES = {
    "effect_of_run_idx": ("durability_effect", "btree", "project_id, run_id"),
    "case_of_run_idx": ("durability_case", "btree", "project_id, run_id"),
    "search_resolution_note_idx": (
        "durability_resolution",
        "gin",
        "project_id, note gin_trgm_ops",
    ),
    "search_comment_body_idx": ("durability_comment", "gin", "project_id, body gin_trgm_ops"),
    "search_signoff_reason_idx": ("durability_signoff", "gin", "reason gin_trgm_ops"),
}


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, (table, method, columns) in INDEXES.items():
            schema_editor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" '
                f"USING {method} ({columns})"
            )


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


class Migration(migrations.Migration):
    # CONCURRENTLY: the ledger keeps writing while the indexes are built (see 0025).
    atomic = False
    dependencies = [
        ("durability", "0037_case_snooze"),
    ]

    operations = [
        migrations.RunPython(_create, _drop),
    ]
