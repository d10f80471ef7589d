"""The desk's address in the links Tallybook hands out.

`SITE_URL` when it is set; otherwise, while a request is answered, the address that
request came to (so an agent talking to http://10.0.0.5:8000 is given case links it can
open), and the default `SITE_URL` in background work.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse

_origin: ContextVar[str | None] = ContextVar("tallybook_request_origin", default=None)


def site_url() -> str:
    if settings.SITE_URL_CONFIGURED:
        return str(settings.SITE_URL)
    return _origin.get() or str(settings.SITE_URL)


class RequestOrigin:
    """Middleware: remember the scheme and host (checked against ALLOWED_HOSTS) of each request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _origin.set(f"{request.scheme}://{request.get_host()}")
        try:
            return self.get_response(request)
        finally:
            _origin.reset(token)
