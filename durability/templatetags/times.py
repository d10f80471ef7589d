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
