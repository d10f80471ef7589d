"""The foreign keys between tenant tables name the project beside the parent:
`(project_id, effect_id) REFERENCES durability_effect (project_id, id)`, and so on.

PostgreSQL checks a foreign key of a deleted row with `SELECT 1 FROM child WHERE <its
columns> = …`. By `effect_id` alone no index serves that any more (0029 re-led them by
project), so every deleted effect read the whole attempt table; by `(project_id, effect_id)`
the child's tenant index does (`attempt_of_effect_uniq`, `receipt_of_effect_idx`, …). Citus
wants these keys too (docs/scaling.md, "Distributing by project").

Django cannot declare a composite foreign key: the fields stay ForeignKeys (joins, and
Django's own CASCADE and SET_NULL) with `db_constraint=False`, each parent gets a unique
`(project, id)`, and the keys are made here by SQL, deferrable and initially deferred as
Django makes its own, with no ON DELETE action of the database's (Django deletes the
children first). The effects page's `effect_project_recent_idx` (project, id DESC) becomes
the effect's unique `(project, id)`, read backwards: no index more on the effect table.

Not atomic, so that nothing holds the tables while they are read: each unique index is built
CONCURRENTLY, each key is added NOT VALID (checked for new rows from then on) and validated
in its own transaction, then Django's single-column key goes. A run that fails part way can
be run again (a failed CONCURRENTLY build leaves an invalid index: drop it first). SQLite
(the demo) gets the unique indexes and none of the keys.
"""

import django.db.models.deletion
from django.db import migrations, models

# Each parent's unique (project_id, id): table and name.
PARENTS = [
    ("durability_effect", "effect_project_pk_uniq"),
    ("durability_receipt", "receipt_project_pk_uniq"),
    ("durability_case", "case_project_pk_uniq"),
    ("durability_grant", "grant_project_pk_uniq"),
    ("durability_webhooksource", "webhooksource_project_pk_uniq"),
]

# Each composite key: its name, the child's table and column, the parent's table; the
# child's index that leads with (project_id, column) in a comment.
FOREIGN_KEYS = [
    ("attempt_effect_same_project_fk", "durability_attempt", "effect_id", "durability_effect"),
    # attempt_of_effect_uniq
    ("receipt_effect_same_project_fk", "durability_receipt", "effect_id", "durability_effect"),
    # receipt_of_effect_idx
    ("case_effect_same_project_fk", "durability_case", "effect_id", "durability_effect"),
    # case_of_effect_idx
    ("probe_effect_same_project_fk", "durability_probe", "effect_id", "durability_effect"),
    # probe_of_effect_recent_idx
    ("case_receipt_same_project_fk", "durability_case", "receipt_id", "durability_receipt"),
    # case_of_receipt_idx
    ("comment_case_same_project_fk", "durability_comment", "case_id", "durability_case"),
    # comment_of_case_idx
    ("notice_case_same_project_fk", "durability_notice", "case_id", "durability_case"),
    # notice_of_case_idx
    ("effect_grant_same_project_fk", "durability_effect", "grant_id", "durability_grant"),
    # effect_grant_created_idx
    (
        "webhookdelivery_source_same_project_fk",
        "durability_webhookdelivery",
        "source_id",
        "durability_webhooksource",
    ),
    # webhook_delivery_once_uniq
]


def _exists(schema_editor, name: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_constraint WHERE conname = %s", [name])
        return cursor.fetchone() is not None


def add_unique(apps, schema_editor):
    for table, name in PARENTS:
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.execute(
                f'CREATE UNIQUE INDEX IF NOT EXISTS "{name}" ON "{table}" ("project_id", "id")'
            )
            continue
        schema_editor.execute(
            f'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "{name}" '
            f'ON "{table}" ("project_id", "id")'
        )
        if not _exists(schema_editor, name):
            schema_editor.execute(
                f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" UNIQUE USING INDEX "{name}"'
            )


def drop_unique(apps, schema_editor):
    for table, name in PARENTS:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS "{name}"')
        else:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def add_foreign_keys(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, column, parent in FOREIGN_KEYS:
        if not _exists(schema_editor, name):
            schema_editor.execute(
                f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" '
                f'FOREIGN KEY ("project_id", "{column}") '
                f'REFERENCES "{parent}" ("project_id", "id") '
                "DEFERRABLE INITIALLY DEFERRED NOT VALID"
            )
        schema_editor.execute(f'ALTER TABLE "{table}" VALIDATE CONSTRAINT "{name}"')


def drop_foreign_keys(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, _column, _parent in FOREIGN_KEYS:
        schema_editor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS "{name}"')


def _field(kind, model, **options):
    """The field as the models declare it, without Django's constraint."""
    return models.ForeignKey(
        db_constraint=False,
        db_index=False,
        on_delete=kind,
        to=f"durability.{model}",
        **options,
    )


CASCADE = django.db.models.deletion.CASCADE
SET_NULL = django.db.models.deletion.SET_NULL
PROTECT = django.db.models.deletion.PROTECT
NULLABLE = {"blank": True, "null": True}


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("durability", "0030_project_deleting")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_unique, drop_unique)],
            state_operations=[
                migrations.AddConstraint(
                    model_name=table.removeprefix("durability_"),
                    constraint=models.UniqueConstraint(fields=("project", "id"), name=name),
                )
                for table, name in PARENTS
            ],
        ),
        # The effect's unique (project, id) serves the effects page now.
        migrations.RemoveIndex(model_name="effect", name="effect_project_recent_idx"),
        migrations.RunPython(add_foreign_keys, drop_foreign_keys),
        migrations.AlterField(
            model_name="attempt",
            name="effect",
            field=_field(CASCADE, "effect", related_name="attempts"),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="effect",
            field=_field(CASCADE, "effect", related_name="receipts", **NULLABLE),
        ),
        migrations.AlterField(
            model_name="case",
            name="effect",
            field=_field(CASCADE, "effect", related_name="cases", **NULLABLE),
        ),
        migrations.AlterField(
            model_name="probe",
            name="effect",
            field=_field(CASCADE, "effect", related_name="probes"),
        ),
        migrations.AlterField(
            model_name="case",
            name="receipt",
            field=_field(SET_NULL, "receipt", related_name="cases", **NULLABLE),
        ),
        migrations.AlterField(
            model_name="comment",
            name="case",
            field=_field(CASCADE, "case", related_name="comments"),
        ),
        migrations.AlterField(
            model_name="notice",
            name="case",
            field=_field(CASCADE, "case", related_name="notices", **NULLABLE),
        ),
        migrations.AlterField(
            model_name="effect",
            name="grant",
            field=_field(PROTECT, "grant", related_name="effects", **NULLABLE),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="source",
            field=_field(CASCADE, "webhooksource", related_name="deliveries"),
        ),
    ]
