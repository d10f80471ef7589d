"""Audit entries about an effect chain per effect, so projects don't serialise on one head."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durability", "0004_role_groups")]

    operations = [
        migrations.AlterModelOptions(
            name="auditentry",
            options={"ordering": ["id"], "verbose_name_plural": "audit entries"},
        ),
        migrations.RemoveConstraint(model_name="auditentry", name="audit_project_seq_uniq"),
        migrations.RemoveIndex(model_name="auditentry", name="audit_project_actor_idx"),
        migrations.RemoveIndex(model_name="auditentry", name="audit_project_action_idx"),
        migrations.AddField(
            model_name="effect",
            name="audit_head",
            field=models.CharField(
                default="0000000000000000000000000000000000000000000000000000000000000000",
                editable=False,
                max_length=64,
            ),
        ),
        migrations.AddField(
            model_name="effect",
            name="audit_seq",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(fields=["project", "-id"], name="audit_project_recent_idx"),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(fields=["project", "actor", "-id"], name="audit_project_actor_idx"),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(
                fields=["project", "action", "-id"], name="audit_project_action_idx"
            ),
        ),
        migrations.AddConstraint(
            model_name="auditentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(effect__isnull=False),
                fields=("effect", "seq"),
                name="audit_effect_seq_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="auditentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(effect__isnull=True),
                fields=("project", "seq"),
                name="audit_project_seq_uniq",
            ),
        ),
    ]
