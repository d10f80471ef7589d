"""The time zone each page shows its moments in, and how a moment is said in it (the words
of {% when %}, durability/templatetags/times.py, and of messages).

The operator's own choice (their Preference) when they made one; otherwise their browser's,
which desk.js sends once in the `tallybook_tz` cookie; otherwise UTC. A name that is not a
zone of the zoneinfo database is ignored wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from durability.models import Preference, zone_named

COOKIE = "tallybook_tz"
SESSION = "tallybook_time_zone"


def chosen_zone_name(user: Any) -> str:
    """The zone name of the user's Preference; blank when they chose none. One query."""
    return Preference.zone_name_of(user)


def chosen_zone_remember(request: HttpRequest, user: Any) -> None:
    """Keep the user's choice in their session, so that no page asks the database for it;
    at login (a signal receiver) and whenever they choose."""
    request.session[SESSION] = chosen_zone_name(user)


def on_user_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is not None and hasattr(request, "session"):
        chosen_zone_remember(request, user)


def zone_of(request: HttpRequest) -> ZoneInfo | None:
    """The zone the operator chose, else the browser's; None for UTC."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if SESSION not in request.session:  # a session from before the choice existed
            chosen_zone_remember(request, user)
        if zone := zone_named(request.session[SESSION]):
            return zone
    return zone_named(request.COOKIES.get(COOKIE))


class OperatorTimeZone:
    """Middleware, after the authentication's: activate the request's zone while it runs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = zone_of(request)
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


# -- a moment in words ------------------------------------------------------------------

NBSP = "\u00a0"
# Closer than this, a distance is "just now": a count of seconds would only flicker.
JUST_NOW_S = 10


def _local(value: datetime) -> datetime:
    aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    return timezone.localtime(aware)


def utc_iso(value: datetime, *, timespec: str = "auto") -> str:
    """The instant in UTC, ISO 8601 with a Z: what machines read (a `<time>`'s `datetime`,
    a webhook's text)."""
    aware = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


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
