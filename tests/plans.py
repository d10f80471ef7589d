"""PostgreSQL's plans of the statements a test ran, as EXPLAIN (FORMAT JSON) gives them: one
walk over their nodes, and the tables and indexes those nodes read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection

Node = dict[str, Any]


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
