"""A project being deleted (Project.deleting), and the one way its audit trail may go.

The audit table refuses every DELETE (0002); a project's deletion must take its trail with
it. The trigger now lets a DELETE through only inside `durability_audit_delete`, which sets
`tallybook.audit_delete`, and only of an entry whose project is marked as being deleted: a
session that sets the setting itself still cannot delete a live project's entries.
0028's rule for pruning stays as it was.
"""

import importlib

from django.db import migrations, models

POSTGRES_FORWARD = """
CREATE OR REPLACE FUNCTION durability_audit_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE'
        AND current_setting('tallybook.audit_prune', true) = 'on'
        AND OLD.action IN ('failure', 'timeout') AND OLD.effect_id IS NOT NULL
        AND OLD.pruned IS NULL AND NEW.pruned IS NOT NULL
        AND OLD.data_digest <> '' AND NEW.data = '{}'::jsonb
        AND (NEW.id, NEW.project_id, NEW.seq, NEW.at, NEW.actor, NEW.action, NEW.effect_id,
             NEW.case_id, NEW.from_state, NEW.to_state, NEW.data_digest, NEW.prev_hash,
             NEW.hash)
            IS NOT DISTINCT FROM
            (OLD.id, OLD.project_id, OLD.seq, OLD.at, OLD.actor, OLD.action, OLD.effect_id,
             OLD.case_id, OLD.from_state, OLD.to_state, OLD.data_digest, OLD.prev_hash,
             OLD.hash)
    THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE'
        AND current_setting('tallybook.audit_delete', true) = 'on'
        AND EXISTS (SELECT 1 FROM durability_project p
                    WHERE p.id = OLD.project_id AND p.deleting IS NOT NULL)
    THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'durability_auditentry is append-only: %% refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE FUNCTION durability_audit_delete(project bigint, at_most integer) RETURNS integer
    SET tallybook.audit_delete = 'on'
AS $$
DECLARE
    deleted integer;
BEGIN
    DELETE FROM durability_auditentry WHERE id IN (
        SELECT e.id FROM durability_auditentry e
        JOIN durability_project p ON p.id = e.project_id AND p.deleting IS NOT NULL
        WHERE e.project_id = project LIMIT at_most
    );
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END;
$$ LANGUAGE plpgsql;
"""
POSTGRES_BACKWARD = "DROP FUNCTION durability_audit_delete(bigint, integer);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)
        # 0028's trigger function again, which refuses every DELETE.
        previous = importlib.import_module("durability.migrations.0028_audit_prune_attempts_only")
        schema_editor.execute(previous.POSTGRES_FORWARD)


class Migration(migrations.Migration):
    dependencies = [("durability", "0029_tenant_project_columns")]

    operations = [
        migrations.AddField(
            model_name="project",
            name="deleting",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(forward, backward),
    ]
