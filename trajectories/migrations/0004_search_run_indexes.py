"""The search page's indexes on runs (durability.search.queries), PostgreSQL's only, with
the extensions durability's 0023 creates; SQLite (the demo) scans."""

from django.db import migrations

INDEXES = {
    # The search's run tiers: a run id, an agent or a workflow that contains the text.
    "search_run_text_idx": (
        "trajectories_run",
        "project_id, run_id gin_trgm_ops, agent gin_trgm_ops, workflow gin_trgm_ops",
    ),
    # The search's trace tiers: the runs of the traces whose id is, or contains, the text.
    "search_runtrace_trace_idx": ("trajectories_runtrace", "project_id, trace_id gin_trgm_ops"),
}


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, (table, columns) in INDEXES.items():
            schema_editor.execute(f'CREATE INDEX "{name}" ON "{table}" USING gin ({columns})')


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("trajectories", "0003_stored_times_in_range"),
        ("durability", "0025_search_trigram_indexes"),
    ]

    operations = [migrations.RunPython(_create, _drop)]
