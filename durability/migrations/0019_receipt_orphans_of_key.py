"""The receipts that came before their intent (orphans), by project and key, oldest first:
every intent for a new key reads them, and the effect index's NULLs are every project's."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0018_receipt_effect_idx"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="receipt",
            index=models.Index(
                condition=models.Q(("effect__isnull", True)),
                fields=["project", "key", "received", "id"],
                name="receipt_orphans_of_key_idx",
            ),
        ),
    ]
