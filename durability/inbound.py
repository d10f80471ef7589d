"""What every entrance does to input from outside before it is validated or stored.

The ledger's API, the events and OTLP ingest, the signed webhooks and the reconcilers'
providers all pass their times and their JSON through here, so an odd value is refused the
same way wherever it comes in: with a `ValueError` whose message says what is wrong, which
each entrance turns into its own refusal (a field error, a span refused alone in OTLP's
`partialSuccess`, a webhook's 400, a probe answered `unknown`).
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

# Times an agent, a tracer or a provider reports about the world (when a receipt was
# observed, when a span or run started or ended) must lie between these. Nothing Tallybook
# records happened before 2000; a later bound of now + 1 day allows for clocks that run
# ahead without letting a year-10000 value in, which pages could not show and every later
# comparison (deadlines, overdue cases, run durations) would get wrong.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
CLOCK_SKEW = timedelta(days=1)

# The deepest JSON nesting accepted anywhere. Requests, receipts' data and span attributes
# are shallow documents; a deep one is an attack on the parser, the jsonb column or the
# recursive checks that follow.
MAX_DEPTH = 64


def instant(value: datetime) -> datetime:
    """`value` in UTC, or ValueError if it is not a time the world can have reported.

    A naive value is taken as UTC. The range check is on the converted value, which is
    also what is returned: PostgreSQL and every page see the same instant.
    """
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        utc = aware.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError("out of range once converted to UTC") from None
    latest = timezone.now() + CLOCK_SKEW
    if utc < EARLIEST or utc > latest:
        raise ValueError(
            f"must lie between {EARLIEST:%Y-%m-%d} and one day from now ({latest:%Y-%m-%d})"
        )
    return utc


def instant_from_unix(seconds: Any) -> datetime:
    """A time given as Unix seconds (an int or a finite float; not a bool or a string)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError("expected Unix seconds as a number")
    if not math.isfinite(seconds) or abs(seconds) > 1e11:
        raise ValueError("Unix seconds out of range")
    return instant(datetime.fromtimestamp(seconds, UTC))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST_MICROS = (EARLIEST - _EPOCH) // timedelta(microseconds=1)
_SKEW_MICROS = CLOCK_SKEW // timedelta(microseconds=1)


def instant_from_unix_nanos(nanos: int) -> datetime:
    """A time given as Unix nanoseconds (OTLP's fixed64), range-checked before any overflow."""
    if type(nanos) is int and nanos >= 0:
        # OTLP gives two of these per span: the range checked on integers, the instant
        # built once (the same one `instant` would return).
        micros = nanos // 1000
        if _EARLIEST_MICROS <= micros <= time.time_ns() // 1000 + _SKEW_MICROS:
            return _EPOCH + timedelta(microseconds=micros)
    if isinstance(nanos, bool) or not isinstance(nanos, int):
        raise ValueError("expected Unix nanoseconds as an integer")
    if not 0 <= nanos < 2**64:
        raise ValueError("Unix nanoseconds out of range")
    seconds, rest = divmod(nanos, 1_000_000_000)
    if seconds > 1e11:
        raise ValueError("Unix nanoseconds out of range")
    return instant(datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=rest // 1000))


def provider_time(value: Any) -> datetime | None:
    """A time a provider reports, ISO 8601 text or Unix seconds, in UTC and in range; None
    (the provider said nothing) stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("expected ISO 8601 or Unix seconds") from None
        return instant(parsed)
    return instant_from_unix(value)


def decimal_digits(text: str, *, max_digits: int = 20) -> int:
    """The integer an ASCII decimal string spells ("123"), or ValueError.

    `str.isdigit()` accepts superscripts and other scripts' digits that `int()` refuses or
    reads differently, and `int()` of a 5,000-digit string is slow; both are refused here.
    """
    if not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        raise ValueError(f"expected a decimal integer of at most {max_digits} ASCII digits")
    return int(text)


def json_path(document: Any, path: str) -> Any:
    """The value at a dotted path into parsed JSON (`data.items.0.id`, list items by
    number), or None where there is none."""
    value = document
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isascii() and part.isdigit() and len(part) < 19:
            index = int(part)
            value = value[index] if index < len(value) else None
        else:
            return None
    return value


def number_param(value: str | None) -> int | None:
    """A page's integer parameter (a cursor, a count, an id) from its query or form, or None
    when it is absent or not one: at most 18 ASCII digits, which PostgreSQL's bigint holds."""
    try:
        return decimal_digits(value or "", max_digits=18)
    except ValueError:
        return None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return document


def _depth_within(document: Any) -> None:
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:20]} is out of range for a number")
    return number


# One decoder for every call: json.loads given hooks builds a new one each time, and OTLP
# parses two JSON texts of every span (its messages).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant, parse_float=_finite
)


def json_loads(body: bytes | str) -> Any:
    """Parse JSON from outside: ValueError for malformed JSON, a duplicate key in an object
    (which would otherwise keep the last value and hide the first), nesting deeper than
    MAX_DEPTH, a number too large for a float (1e400), text that is not UTF-8, or the
    non-standard NaN and Infinity."""
    try:
        # json.loads would also take UTF-16 and UTF-32; RFC 8259 says UTF-8.
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        document = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise ValueError("JSON must be UTF-8") from None
    # A document cannot nest deeper than it has brackets: most are not walked at all.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _depth_within(document)
    return document


# The only escapes that spell what PostgreSQL cannot store: NUL and the surrogates.
_UNSTORABLE_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def storable_strings(body: bytes) -> bool:
    """Whether every string `json_loads` reads from JSON text (a key or a value) is one
    PostgreSQL can store (`storable_text`), known from the text alone: JSON refuses raw
    control characters, NUL among them, and UTF-8 has no surrogates, so only an escape
    (`\\u0000`, `\\ud800`-`\\udfff`) spells either. An escaped backslash before such a
    `u` counts too: a false alarm only costs the full check."""
    return _UNSTORABLE_ESCAPE.search(body) is None


type Path = tuple[str | int, ...]


def unstorable_at(value: Any, path: Path = ()) -> tuple[Path, bool, str] | None:
    """Where among the keys and strings of `value`, however nested, PostgreSQL cannot store
    one (`storable_text`): the path to it (keys, list indexes), whether it is the last key
    of that path itself rather than its value, and why; None when it can store them all."""
    if isinstance(value, str):
        try:
            storable_text(value)
        except ValueError as exc:
            return path, False, str(exc)
        return None
    items: Any
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        inner = (*path, key)
        if isinstance(key, str) and (bad := unstorable_at(key)) is not None:
            return inner, True, bad[2]
        if (found := unstorable_at(item, inner)) is not None:
            return found
    return None


def storable_text(text: str) -> str:
    """`text`, or ValueError if PostgreSQL cannot store it: a NUL character, or a lone
    surrogate (JSON's "\\ud800" decodes to one, and it has no UTF-8 form)."""
    if "\x00" in text:
        raise ValueError("NUL characters (\\u0000) cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("lone surrogates (\\ud800-\\udfff) cannot be stored") from None
    return text
