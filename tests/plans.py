"""PostgreSQL's plans of the statements a test ran, as EXPLAIN (FORMAT JSON) gives them: one
walk over their nodes, and the tables and indexes those nodes read; and the tables a plan
test grows, thousands of rows in one statement each."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connection, models, transaction

from durability.models import Attempt, Project, Receipt

Node = dict[str, Any]
# One project's effects, as `e`: a FROM clause for grow(), its parameter the project's id.
EFFECTS = "durability_effect e WHERE e.project_id = %s"


def explain(sql: str) -> list[Node]:
    """The plan of `sql`, a statement as Django ran it (its values in it)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        plan: list[Node] = cursor.fetchone()[0]
    return plan


def nodes(plan: list[Node] | Node) -> Iterator[Node]:
    """Every node of `plan` (EXPLAIN's answer, or a node of it), each before the nodes below
    it, those of its subplans too."""
    if isinstance(plan, list):  # EXPLAIN's answer: one {"Plan": <its top node>} per statement
        for statement in plan:
            yield from nodes(statement["Plan"])
        return
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def tables(plan: list[Node]) -> set[str]:
    """The tables the plan reads."""
    return {node["Relation Name"] for node in nodes(plan) if "Relation Name" in node}


def scans(plan: list[Node], table: str) -> list[Node]:
    """The nodes of the plan that read `table`."""
    return [node for node in nodes(plan) if node.get("Relation Name") == table]


def index_names(scan: Node) -> list[str]:
    """The indexes a scan reads its table by: its own index, or for a bitmap heap scan those
    of its bitmap (below a BitmapAnd or a BitmapOr too); none for a sequential scan."""
    if scan["Node Type"] == "Bitmap Heap Scan":
        (bitmap,) = [child for child in scan["Plans"] if child["Parent Relationship"] == "Outer"]
        return [n["Index Name"] for n in nodes(bitmap) if n["Node Type"] == "Bitmap Index Scan"]
    return [scan["Index Name"]] if "Index Name" in scan else []


def indexes(plan: list[Node], table: str) -> set[str]:
    """The indexes the plan reads `table` by; none for a sequential scan."""
    return {name for scan in scans(plan, table) for name in index_names(scan)}


@contextlib.contextmanager
def for_the_module(django_db_blocker: Any) -> Iterator[None]:
    """Rows made within it stay for the tests of a module (a module-scoped fixture's), and
    are rolled back after the last: each test's own transaction is a savepoint in this one,
    as a Django TestCase's setUpTestData is in its class's. Growing and analyzing the tables
    takes seconds, which each test of a module paid again for the same rows."""
    with django_db_blocker.unblock(), transaction.atomic():
        yield
        transaction.set_rollback(True)


def grow(
    model: type[models.Model],
    rows: int | str,
    params: tuple[Any, ...] = (),
    sql: dict[str, str] | None = None,
    **values: Any,
) -> int:
    """Insert rows into `model`'s table in one INSERT ... SELECT: one row for each of
    `generate_series(0, rows - 1) AS n` (`rows` a count) or of the FROM clause `rows` (with
    `params`). A field named in `sql` takes that SQL expression over those rows (`n`, or the
    clause's columns); one named in `values`, that value; any other, its default. The number
    of rows inserted.

    The rows are made as bulk_create would make them, without building a model instance for
    each (tens of thousands of them are most of a plan test's set-up otherwise) and without
    PostgreSQL's foreign key triggers (session_replication_role = replica for the statement):
    a test's rows are consistent by construction, and else each one's deferred check runs
    again when the test's transaction is checked at its end. The tables these tests grow have
    no trigger on insert of their own.
    """
    sql = sql or {}
    one = model(**values)  # the value of each field not given as SQL, as bulk_create saves it
    names, selected, arguments = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.name not in sql:
            continue
        assert field.column is not None  # a concrete field's
        names.append(connection.ops.quote_name(field.column))
        if field.name in sql:
            selected.append(sql[field.name])
        else:
            selected.append("%s")
            arguments.append(field.get_db_prep_save(field.pre_save(one, True), connection))
    source = f"generate_series(0, {int(rows) - 1}) AS n" if isinstance(rows, int) else rows
    statement = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({', '.join(names)}) "
        f"SELECT {', '.join(selected)} FROM {source}"
    )
    with connection.cursor() as cursor:
        cursor.execute("SHOW session_replication_role")
        (role,) = cursor.fetchone()
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(statement, [*arguments, *(params if isinstance(rows, str) else ())])
            inserted: int = cursor.rowcount
        finally:
            cursor.execute(f"SET session_replication_role = {role}")
    return inserted


def attempts_and_receipts(owner: Project, **attempt: Any) -> None:
    """Two attempts (numbered 1 and 2, with `attempt`'s values) and a receipt of the effect's
    key (its external id too) for each of `owner`'s effects."""
    grow(
        Attempt,
        EFFECTS.replace(" WHERE", ", generate_series(1, 2) AS number WHERE"),
        (owner.pk,),
        sql={"effect": "e.id", "number": "number"},
        project=owner,
        **attempt,
    )
    grow(
        Receipt,
        EFFECTS,
        (owner.pk,),
        sql={"effect": "e.id", "key": "e.key", "external_id": "e.key"},
        project=owner,
        system="stripe",
    )
