"""How a test that commits (`transactional_db`, `live_server`) leaves the database for the
next: as Django's flush leaves it (every model's table empty, then post_migrate's rows: the
content types, the permissions and the roles' groups), in a fraction of its time.

Django's flush TRUNCATEs every table, and on PostgreSQL a TRUNCATE makes new files for each
table and index, empty or not: 0.4 s for this project's 48 tables, after every such test (a
few hundred of them). Here the tables that hold rows are found in one statement and emptied
with DELETE, with the triggers off for that transaction (`session_replication_role`: the
foreign keys' checks and the audit trail's append-only guard, which a TRUNCATE passes by
too); then post_migrate runs, as after a flush. Sequences are not reset, as a flush without
`reset_sequences` does not reset them. SQLite, and a test case that asks for a flush of its
own (`available_apps`, `serialized_rollback`, `reset_sequences`), get Django's flush.
"""

from __future__ import annotations

from typing import Any

from django.core.management.sql import emit_post_migrate_signal
from django.db import connections, transaction
from django.test import TransactionTestCase

# Django's own, for what this does not cover (not in django-stubs: a private method).
_flush = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]


def tables_emptied(alias: str) -> list[str]:
    """Empty every model's table of the database `alias` (PostgreSQL); the tables that held
    rows."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f"EXISTS (SELECT FROM {quote(t)})" for t in tables))
        row = cursor.fetchone()
        held = [table for table, rows in zip(tables, row, strict=True) if rows]
        if held:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("; ".join(f"DELETE FROM {quote(table)}" for table in held))
    emit_post_migrate_signal(0, False, alias)
    return held


def _fixture_teardown(self: TransactionTestCase) -> Any:
    own = self.available_apps is not None or self.serialized_rollback or self.reset_sequences
    aliases = self._databases_names(include_mirrors=False)  # type: ignore[attr-defined]
    if own or any(connections[alias].vendor != "postgresql" for alias in aliases):
        return _flush(self)
    for alias in aliases:
        tables_emptied(alias)
    return None


def install() -> None:
    """Every TransactionTestCase (pytest-django's `transactional_db` is one) ends this way."""
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[attr-defined]
