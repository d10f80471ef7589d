"""{% when value %}: the one way a page shows a moment.

In the operator's time zone (the one `durability.accounts.timezones.OperatorTimeZone`
activated), as `2026-12-01 07:49` (`seconds=True` where seconds matter: attempts, deadlines,
receipts, audit entries), or as a distance (`relative=True`: "just now", "12 s ago",
"in 5 min"); always in a `<time>` whose `datetime` is the instant in UTC and whose `title`
is the exact local time with its zone, shown on hover. `plain=True` gives the text alone, for
where no element may stand (an SVG `<title>`). CSV exports and the API keep ISO 8601 UTC.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

from durability.accounts.timezones import absolute, distance, exact, utc_iso

register = template.Library()


def when_html(
    value: datetime | None,
    *,
    now: datetime,
    seconds: bool = False,
    relative: bool = False,
    plain: bool = False,
    default: str = "—",
) -> str:
    if value is None:
        return default
    text = distance(value, now=now) if relative else absolute(value, seconds=seconds)
    if plain:
        return text
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', utc_iso(value), exact(value), text
    )


@register.simple_tag(takes_context=True)
def when(
    context: template.Context,
    value: datetime | None,
    *,
    seconds: bool = False,
    relative: bool = False,
    plain: bool = False,
    default: str = "—",
) -> str:
    """{% when effect.created %}, {% when attempt.deadline seconds=True default="none" %},
    {% when case.opened relative=True %}; one "now" per page render, so distances agree."""
    cache = context.render_context
    if "tallybook_now" not in cache:
        cache["tallybook_now"] = timezone.now()
    # The <time> is safe (format_html); Django escapes the plain text and the default.
    return when_html(
        value,
        now=cache["tallybook_now"],
        seconds=seconds,
        relative=relative,
        plain=plain,
        default=default,
    )


# (unit, its length in milliseconds), largest first: a duration reads in its two largest.
_UNITS = [("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)]


def duration_words(ms: float) -> str:
    """A duration for people: `4.2 ms`, `312 ms`, `5.3 s`, `5 min 11 s`, `2 h 5 min`, `3 d 4 h`."""
    if ms < 10:
        return f"{ms:.1f} ms" if ms >= 0.1 or ms == 0 else f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 59_950:  # what would read "60.0 s" reads "1 min"
        return f"{ms / 1000:.1f} s"
    whole = round(ms / 1000) * 1000
    for i, (unit, size) in enumerate(_UNITS[:-1]):
        if whole >= size:
            small, small_size = _UNITS[i + 1]
            rest = (whole % size) // small_size
            return f"{whole // size} {unit}" + (f" {rest} {small}" if rest else "")
    return f"{whole // 1000} s"  # not reached: from 59.95 s on, a duration has minutes


@register.simple_tag
def duration(ms: float | None, default: str = "—") -> str:
    """`{% duration span.duration_ms %}`: the duration in words, the exact milliseconds on
    hover."""
    if ms is None:
        return default
    return format_html(
        '<span class="duration" title="{} ms">{}</span>', f"{ms:.3f}", duration_words(ms)
    )
