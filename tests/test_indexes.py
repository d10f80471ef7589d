"""Every index serves a query no other index serves: none is a plain index whose columns (and
operator classes) lead another index of its table, which any query using the shorter one
can use instead, and which costs upkeep on every insert.

Read from the database that the migrations made, so Django's own foreign-key indexes count.
"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# Each index of our tables (partitioned parents, not their partitions): its table, name,
# whether it is unique, partial or over expressions, its columns and operator classes.
INDEXES = """
SELECT t.relname, i.indexrelid::regclass::text, i.indisunique,
       i.indpred IS NOT NULL OR i.indexprs IS NOT NULL,
       (SELECT array_agg(k.attnum ORDER BY k.n)
          FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)),
       (SELECT array_agg(c.opclass ORDER BY c.n)
          FROM unnest(i.indclass) WITH ORDINALITY AS c(opclass, n)),
       am.amname
FROM pg_index i
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_class x ON x.oid = i.indexrelid
JOIN pg_am am ON am.oid = x.relam
WHERE t.relnamespace = 'public'::regnamespace AND NOT t.relispartition
  AND (t.relname LIKE 'durability\\_%' OR t.relname LIKE 'trajectories\\_%')
"""


def _redundant() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(INDEXES)
        indexes = cursor.fetchall()
    found = []
    for table, name, unique, partial, keys, classes, method in indexes:
        if unique or partial or method != "btree":
            continue  # a unique index is a constraint; a partial one serves its own queries
        for (
            other_table,
            other,
            _,
            other_partial,
            other_keys,
            other_classes,
            other_method,
        ) in indexes:
            if (
                other_table == table
                and other != name
                and not other_partial
                and other_method == method
                and other_keys[: len(keys)] == keys
                and other_classes[: len(classes)] == classes
            ):
                found.append(f"{name} (led {other})")
                break
    return sorted(found)


def test_no_index_is_the_leading_part_of_another_index_of_its_table() -> None:
    assert _redundant() == []


def test_the_check_finds_an_index_that_another_one_leads() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX test_grant_project_idx ON durability_grant (project_id)")

    assert _redundant() == ["test_grant_project_idx (led grant_project_pk_uniq)"]
