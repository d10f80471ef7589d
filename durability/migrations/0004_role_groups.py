"""The roles viewer, operator and admin as groups with their permissions."""

from django.db import migrations

from durability.accounts.roles import groups_sync


def forward(apps, schema_editor):
    groups_sync(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("durability", "0003_desk_roles_comments_bulk_indexes"),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
