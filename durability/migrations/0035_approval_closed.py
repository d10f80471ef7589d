"""An approval can be closed: its effect stopped awaiting it without a signature (decided
through the state machine directly, as the demo's seed once did). Such approvals left open
are closed here, so that no inbox keeps asking for them."""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def close_stale(apps, schema_editor):
    Approval = apps.get_model("durability", "Approval")
    Effect = apps.get_model("durability", "Effect")
    updated = Effect.objects.filter(pk=OuterRef("effect_id")).values("updated")
    Approval.objects.filter(status="open").exclude(effect__state="awaiting_approval").update(
        status="closed", decided=Subquery(updated)
    )


class Migration(migrations.Migration):

    dependencies = [
        ("durability", "0034_effect_timeout_default"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="approval",
            name="approval_status_valid",
        ),
        migrations.AlterField(
            model_name="approval",
            name="status",
            field=models.CharField(
                choices=[
                    ("open", "Open"),
                    ("approved", "Approved"),
                    ("denied", "Denied"),
                    ("closed", "Closed"),
                ],
                default="open",
                max_length=8,
            ),
        ),
        migrations.AddConstraint(
            model_name="approval",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["open", "approved", "denied", "closed"])),
                name="approval_status_valid",
            ),
        ),
        migrations.RunPython(close_stale, migrations.RunPython.noop),
    ]
