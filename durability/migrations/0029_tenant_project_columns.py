"""Every large table gets `project_id`, and every tenant index and unique constraint leads
with it, so that the tables can be distributed by project (docs/scaling.md, issue 15).

The new columns are filled from their parent (the effect, the case, the webhook source) by
one UPDATE ... FROM per table, then made NOT NULL. Audit entries already had the column:
their rows are not touched (the table refuses UPDATE), only their index is re-led. The
parents' id-led indexes that the re-led ones replace are dropped.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The table, its parent's table and the column that names the parent.
FILLED = [
    ("durability_attempt", "durability_effect", "effect_id"),
    ("durability_probe", "durability_effect", "effect_id"),
    ("durability_comment", "durability_case", "case_id"),
    ("durability_resolution", "durability_case", "case_id"),
    ("durability_casealert", "durability_case", "case_id"),
    ("durability_webhookdelivery", "durability_webhooksource", "source_id"),
]


def fill_projects(apps, schema_editor):
    for table, parent, column in FILLED:
        schema_editor.execute(
            f"UPDATE {table} SET project_id = p.project_id FROM {parent} p "
            f"WHERE p.id = {table}.{column}"
        )
    if schema_editor.connection.vendor == "postgresql":
        # The new foreign keys are deferred: check them now, or the NOT NULL that follows
        # refuses to alter a table with pending trigger events.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        schema_editor.execute("SET CONSTRAINTS ALL DEFERRED")


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0028_audit_prune_attempts_only"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="attempt",
            name="attempt_effect_number_uniq",
        ),
        migrations.RemoveConstraint(
            model_name="auditentry",
            name="audit_effect_seq_uniq",
        ),
        migrations.RemoveConstraint(
            model_name="case",
            name="case_one_open_per_effect_reason",
        ),
        migrations.RemoveConstraint(
            model_name="notice",
            name="notice_overdue_once",
        ),
        migrations.RemoveConstraint(
            model_name="webhookdelivery",
            name="webhook_delivery_once_uniq",
        ),
        migrations.RemoveConstraint(
            model_name="webhookdelivery",
            name="webhook_delivery_signed_once_uniq",
        ),
        migrations.RemoveIndex(
            model_name="effect",
            name="effect_grant_created_idx",
        ),
        migrations.RemoveIndex(
            model_name="probe",
            name="probe_effect_recent_idx",
        ),
        migrations.RemoveIndex(
            model_name="receipt",
            name="receipt_effect_idx",
        ),
        migrations.RemoveIndex(
            model_name="webhookdelivery",
            name="webhook_delivery_recent_idx",
        ),
        migrations.AddField(
            model_name="attempt",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AddField(
            model_name="casealert",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AddField(
            model_name="comment",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AddField(
            model_name="probe",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AddField(
            model_name="resolution",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AddField(
            model_name="webhookdelivery",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.RunPython(fill_projects, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name="attempt",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="casealert",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="comment",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="probe",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="resolution",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="case",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="durability.case",
            ),
        ),
        migrations.AlterField(
            model_name="case",
            name="effect",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="cases",
                to="durability.effect",
            ),
        ),
        migrations.AlterField(
            model_name="case",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="cases",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="case",
            name="receipt",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="cases",
                to="durability.receipt",
            ),
        ),
        migrations.AlterField(
            model_name="comment",
            name="case",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="comments",
                to="durability.case",
            ),
        ),
        migrations.AlterField(
            model_name="effect",
            name="payload_archive",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="durability.archive",
            ),
        ),
        migrations.AlterField(
            model_name="notice",
            name="bulk",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="notices",
                to="durability.bulkaction",
            ),
        ),
        migrations.AlterField(
            model_name="notice",
            name="case",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="notices",
                to="durability.case",
            ),
        ),
        migrations.AlterField(
            model_name="notice",
            name="comment",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="notices",
                to="durability.comment",
            ),
        ),
        migrations.AlterField(
            model_name="notice",
            name="project",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="notices",
                to="durability.project",
            ),
        ),
        migrations.AlterField(
            model_name="probe",
            name="effect",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="probes",
                to="durability.effect",
            ),
        ),
        migrations.AlterField(
            model_name="probe",
            name="receipt",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="probes",
                to="durability.receipt",
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="source",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="deliveries",
                to="durability.webhooksource",
            ),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(
                condition=models.Q(("case__isnull", False)),
                fields=["project", "case", "-id"],
                name="audit_of_case_recent_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="case",
            index=models.Index(fields=["project", "effect", "opened"], name="case_of_effect_idx"),
        ),
        migrations.AddIndex(
            model_name="case",
            index=models.Index(
                condition=models.Q(("receipt__isnull", False)),
                fields=["project", "receipt"],
                name="case_of_receipt_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="comment",
            index=models.Index(
                fields=["project", "case", "created", "id"], name="comment_of_case_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="effect",
            index=models.Index(
                fields=["project", "grant", "created"],
                include=("state", "amount"),
                name="effect_grant_created_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="notice",
            index=models.Index(
                condition=models.Q(("case__isnull", False)),
                fields=["project", "case"],
                name="notice_of_case_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="probe",
            index=models.Index(
                fields=["project", "effect", "-started"], name="probe_of_effect_recent_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="receipt",
            index=models.Index(
                fields=["project", "effect", "received", "id"], name="receipt_of_effect_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="webhookdelivery",
            index=models.Index(
                fields=["project", "source", "-received"], name="webhook_delivery_recent_idx"
            ),
        ),
        migrations.AddConstraint(
            model_name="attempt",
            constraint=models.UniqueConstraint(
                fields=("project", "effect", "number"), name="attempt_of_effect_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="auditentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(("effect__isnull", False)),
                fields=("project", "effect", "seq"),
                name="audit_of_effect_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="case",
            constraint=models.UniqueConstraint(
                condition=models.Q(("closed__isnull", True)),
                fields=("project", "effect", "reason"),
                name="case_one_open_per_effect_reason",
            ),
        ),
        migrations.AddConstraint(
            model_name="notice",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "overdue")),
                fields=("project", "case"),
                name="notice_overdue_once",
            ),
        ),
        migrations.AddConstraint(
            model_name="webhookdelivery",
            constraint=models.UniqueConstraint(
                fields=("project", "source", "delivery_id"), name="webhook_delivery_once_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="webhookdelivery",
            constraint=models.UniqueConstraint(
                condition=models.Q(("signed_digest", ""), _negated=True),
                fields=("project", "source", "signed_digest"),
                name="webhook_delivery_signed_once_uniq",
            ),
        ),
    ]
