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
SQLITE_FORWARD = [
    """CREATE TRIGGER durability_audit_no_update BEFORE UPDATE ON durability_auditentry
       BEGIN SELECT RAISE(ABORT, 'durability_auditentry is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER durability_audit_no_delete BEFORE DELETE ON durability_auditentry
       BEGIN SELECT RAISE(ABORT, 'durability_auditentry is append-only: DELETE refused'); END;""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER durability_audit_no_update;",
    "DROP TRIGGER durability_audit_no_delete;",
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("durability", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
