"""Spans and the tool calls they ask for, partitioned by day on PostgreSQL (issue 15).

A span's partition key is its trace's first-seen UTC day (RunTrace.day). Nothing keeps a
foreign key into the partitioned tables: requested tool calls and effect links name their
span by value (trace_id, span_id). Existing traces take the day their first span was
received. SQLite keeps plain tables: the last step runs on PostgreSQL only.
"""

import datetime

import trajectories.models
from django.db import migrations, models

# Partitions made ahead of today by the migration; the scheduler keeps them ahead after it.
AHEAD = 7
PARTITIONED = ("Span", "RequestedToolCall")


def _utc_date(vendor, expression):
    if vendor == "postgresql":
        return f"(({expression}) AT TIME ZONE 'UTC')::date"
    return f"date({expression})"


def backfill(apps, schema_editor):
    """The new columns from the foreign keys and spans they replace, in SQL."""
    run = schema_editor.execute
    first_received = _utc_date(schema_editor.connection.vendor, "min(s.received)")
    run(
        "UPDATE trajectories_runtrace SET day = COALESCE((SELECT "
        f"{first_received} FROM trajectories_span s "
        "WHERE s.project_id = trajectories_runtrace.project_id "
        "AND s.trace_id = trajectories_runtrace.trace_id), day)"
    )
    run(
        "UPDATE trajectories_span SET day = COALESCE((SELECT t.day FROM trajectories_runtrace t "
        "WHERE t.project_id = trajectories_span.project_id "
        "AND t.trace_id = trajectories_span.trace_id), day)"
    )
    run(
        "UPDATE trajectories_run SET "
        "first_day = (SELECT min(s.day) FROM trajectories_span s "
        "WHERE s.run_id = trajectories_run.id), "
        "last_day = (SELECT max(s.day) FROM trajectories_span s "
        "WHERE s.run_id = trajectories_run.id)"
    )
    run(
        "UPDATE trajectories_requestedtoolcall SET "
        "trace_id = (SELECT s.trace_id FROM trajectories_span s "
        "WHERE s.id = trajectories_requestedtoolcall.span_id), "
        "span_hex = (SELECT s.span_id FROM trajectories_span s "
        "WHERE s.id = trajectories_requestedtoolcall.span_id), "
        "day = (SELECT s.day FROM trajectories_span s "
        "WHERE s.id = trajectories_requestedtoolcall.span_id)"
    )
    for kind in ("tool", "model"):
        run(
            f"UPDATE trajectories_effectlink SET "
            f"{kind}_trace_id = COALESCE((SELECT s.trace_id FROM trajectories_span s "
            f"WHERE s.id = trajectories_effectlink.{kind}_span_id), ''), "
            f"{kind}_span_hex = COALESCE((SELECT s.span_id FROM trajectories_span s "
            f"WHERE s.id = trajectories_effectlink.{kind}_span_id), '')"
        )


def unbackfill(apps, schema_editor):
    """Back: the effect links' foreign keys from the values (the spans still stored)."""
    for kind in ("tool", "model"):
        schema_editor.execute(
            f"UPDATE trajectories_effectlink SET {kind}_span_id = (SELECT s.id "
            "FROM trajectories_span s WHERE s.project_id = trajectories_effectlink.project_id "
            f"AND s.trace_id = trajectories_effectlink.{kind}_trace_id "
            f"AND s.span_id = trajectories_effectlink.{kind}_span_hex)"
        )


def forget_requested_calls(apps, schema_editor):
    """Back: the requested tool calls go (their foreign key returns NOT NULL; they only help
    links that are resolved already)."""
    schema_editor.execute("DELETE FROM trajectories_requestedtoolcall")


def partition(apps, schema_editor):
    """On PostgreSQL, each table rebuilt as partitioned by range of day: a partition for each
    day it holds and for today and AHEAD days after, a DEFAULT one, its rows copied."""
    _rebuild(apps, schema_editor, partitioned=True)


def unpartition(apps, schema_editor):
    """Back: each table rebuilt plain, its rows copied."""
    _rebuild(apps, schema_editor, partitioned=False)


def _rebuild(apps, schema_editor, *, partitioned):
    if schema_editor.connection.vendor != "postgresql":
        return
    run = schema_editor.execute
    today = datetime.datetime.now(datetime.UTC).date()
    for name in PARTITIONED:
        model = apps.get_model("trajectories", name)
        table, new = model._meta.db_table, f"{model._meta.db_table}_rebuilt"
        run(
            f'CREATE TABLE "{new}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
            "INCLUDING IDENTITY)" + (" PARTITION BY RANGE (day)" if partitioned else "")
        )
        if partitioned:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(f'SELECT DISTINCT day FROM "{table}"')
                days = {row[0] for row in cursor.fetchall()}
            days |= {today + datetime.timedelta(days=n) for n in range(AHEAD + 1)}
            for day in sorted(days):
                run(
                    f'CREATE TABLE "{table}_p{day:%Y%m%d}" PARTITION OF "{new}" '
                    "FOR VALUES FROM (%s) TO (%s)",
                    [day, day + datetime.timedelta(days=1)],
                )
            run(f'CREATE TABLE "{table}_default" PARTITION OF "{new}" DEFAULT')
        run(f'INSERT INTO "{new}" SELECT * FROM "{table}"')
        run(f'DROP TABLE "{table}"')
        run(f'ALTER TABLE "{new}" RENAME TO "{table}"')
        run(f'ALTER SEQUENCE "{new}_id_seq" RENAME TO "{table}_id_seq"')
        run(
            f"SELECT setval('\"{table}_id_seq\"', "
            f'(SELECT coalesce(max(id), 0) + 1 FROM "{table}"), false)'
        )
        # The partition key is part of every unique index, the primary key's too.
        key = "id, day" if partitioned else "id"
        run(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_pkey" PRIMARY KEY ({key})')
        for field in model._meta.concrete_fields:
            if field.remote_field is not None:
                target = field.remote_field.model._meta
                run(
                    f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_{field.column}_fk" '
                    f'FOREIGN KEY ("{field.column}") REFERENCES "{target.db_table}" '
                    f'("{target.pk.column}") DEFERRABLE INITIALLY DEFERRED'
                )
        for index in model._meta.indexes:
            schema_editor.add_index(model, index)
        for constraint in model._meta.constraints:
            if isinstance(constraint, models.UniqueConstraint):
                schema_editor.add_constraint(model, constraint)


class Migration(migrations.Migration):
    # The tables' rebuild runs in the migration's transaction: none of it is seen half done.

    dependencies = [
        ("durability", "0022_notices_invitations"),
        ("trajectories", "0004_search_run_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="runtrace",
            name="day",
            field=models.DateField(default=trajectories.models.today),
        ),
        migrations.AddField(
            model_name="span",
            name="day",
            field=models.DateField(default=trajectories.models.today),
        ),
        migrations.AddField(
            model_name="run",
            name="first_day",
            field=models.DateField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="last_day",
            field=models.DateField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="requestedtoolcall",
            name="trace_id",
            field=models.CharField(default="", max_length=32),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="requestedtoolcall",
            name="span_hex",
            field=models.CharField(default="", max_length=16),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="requestedtoolcall",
            name="day",
            field=models.DateField(default=trajectories.models.today),
        ),
        migrations.AddField(
            model_name="effectlink",
            name="tool_trace_id",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="effectlink",
            name="tool_span_hex",
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.AddField(
            model_name="effectlink",
            name="model_trace_id",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="effectlink",
            name="model_span_hex",
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.RunPython(backfill, unbackfill),
        migrations.RemoveConstraint(model_name="requestedtoolcall", name="requested_call_uniq"),
        migrations.RemoveField(model_name="requestedtoolcall", name="span"),
        migrations.RunPython(migrations.RunPython.noop, forget_requested_calls),
        migrations.RenameField(
            model_name="requestedtoolcall", old_name="span_hex", new_name="span_id"
        ),
        migrations.AddConstraint(
            model_name="requestedtoolcall",
            constraint=models.UniqueConstraint(
                fields=("project", "trace_id", "span_id", "tool_call_id", "day"),
                name="requested_call_uniq",
            ),
        ),
        migrations.RemoveField(model_name="effectlink", name="tool_span"),
        migrations.RemoveField(model_name="effectlink", name="model_span"),
        migrations.RenameField(
            model_name="effectlink", old_name="tool_span_hex", new_name="tool_span_id"
        ),
        migrations.RenameField(
            model_name="effectlink", old_name="model_span_hex", new_name="model_span_id"
        ),
        migrations.RemoveConstraint(model_name="span", name="span_identity_uniq"),
        migrations.AddConstraint(
            model_name="span",
            constraint=models.UniqueConstraint(
                fields=("project", "trace_id", "span_id", "day"), name="span_identity_uniq"
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["last_day"], name="run_last_day_idx"),
        ),
        migrations.AddIndex(
            model_name="runtrace",
            index=models.Index(fields=["day"], name="runtrace_day_idx"),
        ),
        migrations.RunPython(partition, unpartition),
    ]
