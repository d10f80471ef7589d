"""{% when value %}: the one way a page shows a moment.

In the operator's time zone (the one `durability.accounts.timezones.OperatorTimeZone`
activated), as `2026-12-01 07:49` (`seconds=True` where seconds matter: attempts, deadlines,
receipts, audit entries), or as a distance (`relative=True`: "just now", "12 s ago",
"in 5 min"); always in a `<time>` whose `datetime` is the instant in UTC and whose `title`
is the exact local time with its zone, shown on hover. `plain=True` gives the text alone, for
where no element may stand (an SVG `<title>`). CSV exports and the API keep ISO 8601 UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

NBSP = "\u00a0"
# Closer than this, a distance is "just now": a count of seconds would only flicker.
JUST_NOW_S = 10


def _local(value: datetime) -> datetime:
    aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    return timezone.localtime(aware)


def exact(value: datetime) -> str:
    """The moment to the millisecond, in the current zone, with the zone's name and offset."""
    local = _local(value)
    offset = local.strftime("%z")
    zone = local.tzname() or "UTC"
    shown = f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {zone}"
    if zone == "UTC":
        return shown
    return f"{shown} (UTC{offset[:3]}:{offset[3:]})"


def absolute(value: datetime, *, seconds: bool = False) -> str:
    local = _local(value)
    return local.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def distance(value: datetime, *, now: datetime) -> str:
    """How far the moment lies from now, in words a person says: never "0 minutes ago"."""
    aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    delta = (now - aware).total_seconds()
    s = int(abs(delta))
    if s < JUST_NOW_S:
        return "just now"
    if s < 60:
        span = f"{s}{NBSP}s"
    elif s < 3600:
        span = f"{s // 60}{NBSP}min"
    elif s < 48 * 3600:
        hours, minutes = divmod(s // 60, 60)
        span = f"{hours}{NBSP}h" + (f" {minutes}{NBSP}min" if hours < 10 and minutes else "")
    else:
        span = f"{s // 86400}{NBSP}d"
    return f"{span} ago" if delta > 0 else f"in {span}"


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
    aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    instant = aware.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return format_html('<time datetime="{}" title="{}">{}</time>', instant, exact(value), text)


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
