"""The time zone each page shows its moments in (durability/templatetags/times.py).

The operator's own choice (their Preference) when they made one; otherwise their browser's,
which desk.js sends once in the `tallybook_tz` cookie; otherwise UTC. A name that is not a
zone of the zoneinfo database is ignored wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from durability.models import Preference

COOKIE = "tallybook_tz"
SESSION = "tallybook_time_zone"


@cache
def zone_names() -> frozenset[str]:
    """Every zone the zoneinfo database knows (read from disk once per process)."""
    return frozenset(available_timezones())


def zone_named(name: str | None) -> ZoneInfo | None:
    return ZoneInfo(name) if name and name in zone_names() else None


def chosen_zone_remember(request: HttpRequest, user: Any) -> None:
    """Keep the user's choice in their session, so that no page asks the database for it;
    at login (a signal receiver) and whenever they choose."""
    chosen = Preference.objects.filter(user=user).values_list("time_zone", flat=True).first()
    request.session[SESSION] = chosen or ""


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
