"""CSV as every export writes it: streamed line by line, and no cell a spreadsheet would
run as a formula.

Agents and operators write the text of many cells (keys, targets, reasons). A spreadsheet
opening the file runs a cell that starts with `=`, `+`, `-` or `@` (and some a tab or a
carriage return before one) as a formula; OWASP's rule prefixes such a cell with `'`,
which the spreadsheet shows as text and drops from the value.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> Any:
    """The value as a cell: text that a spreadsheet would read as a formula gets `'` first."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class _Echo:
    """A file-like object whose write hands back what it was given, for streaming CSV."""

    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    """Each row as one line of CSV, every cell through `cell` (for a StreamingHttpResponse)."""
    writer = csv.writer(_Echo())
    for row in rows:
        yield writer.writerow([cell(value) for value in row])
