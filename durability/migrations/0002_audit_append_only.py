"""The audit table refuses UPDATE and DELETE at the database level."""

from django.db import migrations

POSTGRES_FORWARD = """
CREATE FUNCTION durability_audit_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'durability_auditentry is append-only: %% refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER durability_audit_append_only
    BEFORE UPDATE OR DELETE ON durability_auditentry
    FOR EACH ROW EXECUTE FUNCTION durability_audit_refuse_change();
"""
POSTGRES_BACKWARD = """
DROP TRIGGER durability_audit_append_only ON durability_auditentry;
DROP FUNCTION durability_audit_refuse_change();
"""
# SQLite's triggers are (re)created after every migrate: durability.audit.sqlite_triggers_ensure.


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("durability", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
