"""The keys version: one row, bumped by triggers in the same transaction as any change to an
API key or a project that a process may have cached (durability.models.KeysVersion)."""

from django.db import migrations, models

# Row triggers compare whole rows but for the columns the hot path writes (a key's use time,
# a project's audit head), so a column added later is covered too; deletions bump once per
# statement.
POSTGRES_FORWARD = """
INSERT INTO durability_keysversion (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE FUNCTION durability_keys_version_bump() RETURNS trigger AS $$
BEGIN
    INSERT INTO durability_keysversion (id, version) VALUES (1, 1)
    ON CONFLICT (id) DO UPDATE SET version = durability_keysversion.version + 1;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER durability_apikey_keys_version_update
    AFTER UPDATE ON durability_apikey FOR EACH ROW
    WHEN (to_jsonb(OLD) - 'last_used_at' IS DISTINCT FROM to_jsonb(NEW) - 'last_used_at')
    EXECUTE FUNCTION durability_keys_version_bump();
CREATE TRIGGER durability_apikey_keys_version_delete
    AFTER DELETE ON durability_apikey FOR EACH STATEMENT
    EXECUTE FUNCTION durability_keys_version_bump();
CREATE TRIGGER durability_project_keys_version_update
    AFTER UPDATE ON durability_project FOR EACH ROW
    WHEN (to_jsonb(OLD) - 'audit_seq' - 'audit_head'
          IS DISTINCT FROM to_jsonb(NEW) - 'audit_seq' - 'audit_head')
    EXECUTE FUNCTION durability_keys_version_bump();
CREATE TRIGGER durability_project_keys_version_delete
    AFTER DELETE ON durability_project FOR EACH STATEMENT
    EXECUTE FUNCTION durability_keys_version_bump();
"""
POSTGRES_BACKWARD = """
DROP TRIGGER durability_apikey_keys_version_update ON durability_apikey;
DROP TRIGGER durability_apikey_keys_version_delete ON durability_apikey;
DROP TRIGGER durability_project_keys_version_update ON durability_project;
DROP TRIGGER durability_project_keys_version_delete ON durability_project;
DROP FUNCTION durability_keys_version_bump();
"""
# SQLite's triggers are (re)created after every migrate: durability.audit.sqlite_triggers_ensure.


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)
    else:
        apps.get_model("durability", "KeysVersion").objects.get_or_create(id=1)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("durability", "0015_audit_policy_cases")]

    operations = [
        migrations.CreateModel(
            name="KeysVersion",
            fields=[
                (
                    "id",
                    models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False),
                ),
                ("version", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="keysversion_one_row"
                    )
                ],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
