"""Every answer of the machine-facing surface is JSON, the ones Django gives on its own too."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

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
