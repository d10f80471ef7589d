"""Keyset pagination, the one way every page and list of the API pages through rows.

A `Keyset` is an order (Django's `order_by` names, `-` for descending, the last a unique
tie-breaker such as the id): `after` orders rows and keeps those that follow a position in
that order, `page` takes one page of them. A page fetches one row more than it shows, to
know whether another page follows, and its `next` is the cursor of its last row when one
does. How a position is spelt in a URL (`?before=<id>`, `?after=<µs>.<id>`, ...) is each
page's own: it reads its cursor into a position, and writes a row's cursor for `next`.

    RUNS = Keyset("-started", "-pk")
    page = RUNS.page(runs, position, size=50)   # position: (started, pk), or None
    page.rows, page.next(lambda run: f"{micros(run.started)}-{run.pk}")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(moment: datetime) -> int:
    """A moment as whole microseconds since the epoch, as cursors spell a time."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def moment(value: int) -> datetime:
    """The moment `value` microseconds after the epoch; OverflowError if no datetime holds
    it."""
    return EPOCH + timedelta(microseconds=value)


@dataclass(frozen=True)
class Page[Row]:
    """The rows of one page, and whether rows follow its last."""

    rows: list[Row]
    more: bool

    @classmethod
    def of(cls, ordered: QuerySet[Any, Row], size: int) -> Page[Row]:
        """The first `size` rows of `ordered`, in one statement that reads one more."""
        taken = list(ordered[: size + 1])
        return cls(taken[:size], len(taken) > size)

    def next[Cursor](self, cursor: Callable[[Row], Cursor]) -> Cursor | None:
        """The cursor of the page that follows (`cursor` of the last row), or None."""
        return cursor(self.rows[-1]) if self.more and self.rows else None


class Keyset:
    """An order over rows and the rows after a position in it."""

    def __init__(self, *order: str) -> None:
        self.order = order
        self.fields = tuple(name.removeprefix("-") for name in order)
        descending = [name.startswith("-") for name in order]
        # The look-ups of a row past a value of the position, field by field, and of a row
        # not before the position's first value.
        self._past = tuple(
            f"{field}__{'lt' if down else 'gt'}"
            for field, down in zip(self.fields, descending, strict=True)
        )
        self._bound = f"{self.fields[0]}__{'lte' if descending[0] else 'gte'}"

    def after[Row](
        self, rows: QuerySet[Any, Row], position: Sequence[Any] | None
    ) -> QuerySet[Any, Row]:
        """`rows` in this order, only those after `position` (the values of this order's
        fields for a row, in order) when one is given.

        With two fields or more, the first is bounded on its own (`>=`, or `<=` descending),
        so that an index leading with it is read as a range; within that bound, a row
        follows if it is past the position on the first field, or equal to it on the fields
        before another that it is past on.
        """
        rows = rows.order_by(*self.order)
        if position is None:
            return rows
        if len(position) != len(self.order):
            raise ValueError(f"a position of {self.order} has {len(self.order)} values")
        if len(position) == 1:
            return rows.filter(**{self._past[0]: position[0]})
        follows = Q(**{self._past[0]: position[0]})
        for i in range(1, len(position)):
            equal = dict(zip(self.fields[1:i], position[1:i], strict=True))
            follows |= Q(**equal, **{self._past[i]: position[i]})
        return rows.filter(**{self._bound: position[0]}).filter(follows)

    def page[Row](
        self, rows: QuerySet[Any, Row], position: Sequence[Any] | None, size: int
    ) -> Page[Row]:
        """The page of `size` rows after `position` (the first page without one)."""
        return Page.of(self.after(rows, position), size)

    def position(self, row: Any) -> tuple[Any, ...]:
        """A row's values of this order's fields: its position, to continue after it."""
        if isinstance(row, dict):
            return tuple(row[name] for name in self.fields)
        return tuple(getattr(row, name) for name in self.fields)
