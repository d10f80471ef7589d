"""The search page's indexes (durability.search.queries), PostgreSQL's only: pg_trgm for
`ILIKE '%text%'` and btree_gin for the project beside the text in one GIN index.

SQLite (the demo) has neither and scans; Django's CreateExtension does nothing there, and
the indexes are made by RunPython on PostgreSQL alone, so they are not in the models' state.
"""

from django.contrib.postgres.operations import BtreeGinExtension, TrigramExtension
from django.db import migrations

INDEXES = {
    # The search's effect tiers: a key, a target or an agent, or the stored (redacted)
    # request's text that contains the text searched for, in one project.
    "search_effect_text_idx": (
        "durability_effect",
        "project_id, key gin_trgm_ops, target gin_trgm_ops, agent gin_trgm_ops, "
        "((request)::text) gin_trgm_ops",
    ),
    # The search's external-id tiers: receipts whose external id is, or contains, the text.
    "search_receipt_external_id_idx": (
        "durability_receipt",
        "project_id, external_id gin_trgm_ops",
    ),
}


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, (table, columns) in INDEXES.items():
            schema_editor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" USING gin ({columns})'
            )


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


class Migration(migrations.Migration):
    # CONCURRENTLY: the ledger keeps writing effects and receipts while the indexes are
    # built, outside a transaction. A build that fails leaves an invalid index: drop it
    # (DROP INDEX CONCURRENTLY name), then migrate again.
    atomic = False
    dependencies = [
        ("durability", "0024_flow_saved_views"),
    ]

    operations = [
        TrigramExtension(),
        BtreeGinExtension(),
        migrations.RunPython(_create, _drop),
    ]
