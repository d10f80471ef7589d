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

The rows post_migrate makes (the content types, the permissions, the groups and their
permissions) are kept where a test left them as post_migrate made them: emptied and made
again, they cost ~110 statements after every such test. The first emptying of each database
in a process notes a digest of each of those tables (every row, its id too) after
post_migrate; the next finds them in the same statement that finds the tables holding rows,
and empties them and runs post_migrate only when one differs.
"""

from __future__ import annotations

from typing import Any

from django.core.management.sql import emit_post_migrate_signal
from django.db import connections, transaction
from django.test import TransactionTestCase

# Django's own, for what this does not cover (not in django-stubs: a private method).
_flush = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]


# For each database: the digest of each table post_migrate fills, as post_migrate left it.
_MADE_BY_POST_MIGRATE: dict[str, dict[str, str | None]] = {}


def _digest(quote: Any, table: str) -> str:
    """SQL for a digest of every row of `table` (NULL when it is empty)."""
    return f"(SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {quote(table)} t)"


def tables_emptied(alias: str) -> list[str]:
    """Empty every model's table of the database `alias` (PostgreSQL), but those post_migrate
    fills when they hold what it made; the tables emptied."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    made = _MADE_BY_POST_MIGRATE.get(alias, {})
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(
            "SELECT "
            + ", ".join(
                _digest(quote, t) + " IS NOT DISTINCT FROM %s"
                if t in made
                else f"EXISTS (SELECT FROM {quote(t)})"
                for t in tables
            ),
            [made[t] for t in tables if t in made],
        )
        row = cursor.fetchone()
        as_made = {t for t, same in zip(tables, row, strict=True) if t in made and same}
        remake = len(as_made) < len(made)
        held = [
            table
            for table, found in zip(tables, row, strict=True)
            if (table in made and remake) or (table not in made and found)
        ]
        if held:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("; ".join(f"DELETE FROM {quote(table)}" for table in held))
    if remake or not made:
        emit_post_migrate_signal(0, False, alias)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT " + ", ".join(f"EXISTS (SELECT FROM {quote(t)})" for t in tables)
            )
            filled = [t for t, rows in zip(tables, cursor.fetchone(), strict=True) if rows]
            digests = []
            if filled:
                cursor.execute("SELECT " + ", ".join(_digest(quote, t) for t in filled))
                digests = cursor.fetchone()
            _MADE_BY_POST_MIGRATE[alias] = dict(zip(filled, digests, strict=True))
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
