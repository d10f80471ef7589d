"""The machine-facing surface's middleware: every answer JSON, the ones Django gives on its own
too; and a way past the pages' middleware, which does nothing for a machine's request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus

from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse

from durability.api.decorators import database_away, error

# The paths agents, tracers and providers call: /api/v1/, OTLP's /v1/traces, /hooks/<source>/.
PREFIXES = ("/api/", "/v1/", "/hooks/")
# Answers already in a machine's format: ours (JSON), and OTLP's protobuf.
MACHINE_TYPES = ("application/json", "application/x-protobuf")


class JsonErrors:
    """Middleware: an error answer under PREFIXES that is not already JSON (or protobuf)
    becomes an `ErrorOut` with the same status.

    An unknown URL (404), a method the view does not take (405), an exception (500) or a
    refused Host header (400) are answered by Django before or after our views, as HTML
    pages meant for people; a client of the API could not read them. Outermost, so it sees
    what every other middleware answers too.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """PostgreSQL away (stopped, restarting, failing over, connections exhausted): a 503
        with Retry-After, which the SDK and OTLP exporters retry, instead of a 500 that says
        the request itself was wrong (OTLP's view answers its own, in the request's encoding)."""
        if not request.path_info.startswith(PREFIXES):
            return None
        if isinstance(exception, OperationalError | InterfaceError):
            return database_away()
        return None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or not request.path_info.startswith(PREFIXES):
            return response
        content_type = response.get("Content-Type", "").partition(";")[0].strip()
        if content_type in MACHINE_TYPES:
            return response
        status = response.status_code
        if status == 404:
            return error("No such URL in this API", 404, {"path": request.path_info[:200]})
        if status == 405:
            allowed = response.get("Allow", "")
            answer = error(
                f"{request.method} is not allowed here",
                405,
                {"method": f"Allowed: {allowed}" if allowed else "Not allowed"},
            )
            answer["Allow"] = allowed
            return answer
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        return error(phrase, status)


GetResponse = Callable[[HttpRequest], HttpResponse]
# The view's end of the chain, from the `MachinesRejoin` just built to the `MachinesBypass`
# built next (Django builds a handler's middleware innermost first, in one thread).
_rejoin = threading.local()


class MachinesBypass:
    """Middleware: a request under PREFIXES goes straight to its view (through the
    `MachinesRejoin` at the end of MIDDLEWARE), past the middleware between the two.

    What lies between is the pages' own: static files, sessions, CSRF, the logged-in user,
    messages, framing and content-security headers, htmx, the login lockouts. A machine's
    request authenticates with its API key and is answered JSON, so none of them has
    anything to do for it but cost (about a quarter of a millisecond a request); the
    middleware above this one (JSON errors, the security headers, Content-Length, the
    request's origin) serve both. Django calls the view middleware's `process_view` (CSRF:
    the API's views are exempt) and `process_exception` for every request whichever way it
    came.
    """

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        view = getattr(_rejoin, "view", None)
        if view is None:
            raise ImproperlyConfigured("MachinesBypass needs MachinesRejoin last in MIDDLEWARE")
        _rejoin.view = None
        self.view: GetResponse = view

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(PREFIXES):
            return self.view(request)
        return self.get_response(request)


class MachinesRejoin:
    """Middleware, the last: where `MachinesBypass` sends a machine's request, the view."""

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        _rejoin.view = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)
