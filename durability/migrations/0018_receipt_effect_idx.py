"""The receipt's effect index, Django's unnamed foreign-key index until now, named for its
queries (receipt_effect_idx): renamed in place on PostgreSQL, no rebuild."""

import django.db.models.deletion
from django.db import migrations, models

UNNAMED = "durability_receipt_effect_id_1b6ef967"
NAMED = "receipt_effect_idx"


def _rename(old: str, new: str):
    def rename(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f'ALTER INDEX IF EXISTS "{old}" RENAME TO "{new}"')
        else:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{old}"')
            schema_editor.execute(f'CREATE INDEX "{new}" ON "durability_receipt" ("effect_id")')

    return rename


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0017_redundant_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(_rename(UNNAMED, NAMED), _rename(NAMED, UNNAMED)),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="receipt",
                    name="effect",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="receipts",
                        to="durability.effect",
                    ),
                ),
                migrations.AddIndex(
                    model_name="receipt",
                    index=models.Index(fields=["effect"], name="receipt_effect_idx"),
                ),
            ],
        ),
    ]
