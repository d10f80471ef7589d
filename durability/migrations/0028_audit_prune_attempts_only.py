"""Only an effect's failure and timeout entries may have their data pruned.

0027's trigger let the pruning shape of UPDATE through for any entry that keeps a digest,
whenever `tallybook.audit_prune` is on; a session may set that custom setting itself. The
trigger now also checks what retention prunes (durability.retention.services
PRUNED_ACTIONS): the data of an effect's `failure` or `timeout` entry. A verdict, a grant
change or a project's entry can never be emptied, by the function or by anyone else.
"""

from django.db import migrations

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
    RAISE EXCEPTION 'durability_auditentry is append-only: %% refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION durability_audit_prune(entry_ids bigint[], pruned_at timestamptz)
    RETURNS integer
    SET tallybook.audit_prune = 'on'
AS $$
DECLARE
    changed integer;
BEGIN
    UPDATE durability_auditentry AS e SET data = '{}'::jsonb, pruned = pruned_at
        WHERE e.id = ANY(entry_ids) AND e.pruned IS NULL AND e.data_digest <> ''
        AND e.action IN ('failure', 'timeout') AND e.effect_id IS NOT NULL;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END;
$$ LANGUAGE plpgsql;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0027_retention_payloads_archives"),
    ]

    # Backward: 0027's functions are re-made by migrating back past it.
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
