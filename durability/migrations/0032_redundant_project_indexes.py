"""Seven single-column indexes that a unique constraint or an index led by the same column
makes redundant (tests/test_indexes.py): each cost upkeep on every insert and served no
query the longer one does not. Only the indexes are dropped: Django's AlterField would drop
and re-add (and so re-check) each foreign key too."""
from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

# (table, column, the index Django named for the foreign key)
REDUNDANT = [
    ("durability_archive", "project_id", "durability_archive_project_id_d009105f"),
    ("durability_grant", "project_id", "durability_grant_project_id_0926f178"),
    ("durability_membership", "project_id", "durability_membership_project_id_2342693f"),
    (
        "durability_reconcilerconfig",
        "project_id",
        "durability_reconcilerconfig_project_id_da2a6b8b",
    ),
    ("durability_savedview", "project_id", "durability_savedview_project_id_aa63a96d"),
    ("durability_signoff", "approval_id", "durability_signoff_approval_id_dd907f99"),
    ("durability_webhooksource", "project_id", "durability_webhooksource_project_id_9b598a36"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0031_composite_tenant_foreign_keys"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("{column}")',
                )
                for table, column, name in REDUNDANT
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="archive",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="archives",
                        to="durability.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="grant",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="grants",
                        to="durability.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="membership",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="durability.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="reconcilerconfig",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reconcilers",
                        to="durability.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="savedview",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="saved_views",
                        to="durability.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="signoff",
                    name="approval",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="signoffs",
                        to="durability.approval",
                    ),
                ),
                migrations.AlterField(
                    model_name="webhooksource",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="webhook_sources",
                        to="durability.project",
                    ),
                ),
            ],
        ),
    ]
