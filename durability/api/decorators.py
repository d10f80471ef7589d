"""The API's front door: authentication, body limits and validation, in one decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, cast, overload

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from durability.api.schemas import ErrorOut
from durability.inbound import json_loads
from durability.models import ApiKey, Project

MiB = 1024 * 1024


class ApiRequest(HttpRequest):
    """An HttpRequest that `authorize` has authenticated."""

    project: Project
    api_key: ApiKey
    actor: str


class PayloadRequest[M: BaseModel](ApiRequest):
    """An ApiRequest whose JSON body `authorize(schema=M)` has validated into `payload`."""

    payload: M


type View[R: HttpRequest, **P] = Callable[Concatenate[R, P], HttpResponse]


# PostgreSQL away or too slow (a restart, a failover, a statement timeout): a 503 that asks
# the client to send the same request again after this many seconds; every write of the
# API is idempotent on its key, so retrying is always safe.
DATABASE_AWAY = "The database is unavailable; retry shortly"
DATABASE_RETRY_AFTER = 2


def database_away() -> JsonResponse:
    return error(DATABASE_AWAY, 503, retry_after=DATABASE_RETRY_AFTER)


def error(
    message: str,
    status: int,
    fields: dict[str, str] | None = None,
    *,
    retry_after: int | None = None,
) -> JsonResponse:
    """An `ErrorOut`; with Retry-After when the client should send the same request again
    after that many seconds (a 429, a 503)."""
    response = answer(ErrorOut(error=message, fields=fields or None), status, exclude_none=True)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def answer(body: BaseModel, status: int = 200, *, exclude_none: bool = False) -> JsonResponse:
    """A JSON answer whose shape is the pydantic model `body`'s."""
    return JsonResponse(body.model_dump(mode="json", exclude_none=exclude_none), status=status)


def field_errors(exc: ValidationError) -> dict[str, str]:
    """Pydantic's errors as {"dotted.field": "message"}, one message per field."""
    fields: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"]) or "body"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "Unknown field"
        elif err["type"] == "missing":
            message = "This field is required"
        fields.setdefault(loc, message)
    return fields


class Refused(Exception):
    """A request refused before its view runs; `response` says why."""

    def __init__(self, response: JsonResponse) -> None:
        self.response = response


def _bearer(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def body_within(request: HttpRequest, max_body: int) -> bytes:
    """The body, or `Refused` with a 413 past `max_body` (declared or read); for the views
    that read raw bytes (signed webhooks) as for `authorize`."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise Refused(error("Invalid Content-Length", 400)) from None
    too_big = Refused(error(f"Request body over {max_body} bytes", 413))
    if declared > max_body:
        raise too_big
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_big from None
    if len(body) > max_body:
        raise too_big
    return body


def _parse[M: BaseModel](request: HttpRequest, body: bytes, schema: type[M]) -> M:
    """Validate a JSON body against `schema`: the model, or a 400 naming each bad field."""
    if request.content_type not in ("application/json", ""):
        raise Refused(
            error(
                "Content-Type must be application/json",
                415,
                {"Content-Type": f"Expected application/json, not {request.content_type}"},
            )
        )
    # inbound's parse refuses what pydantic's would let through (a duplicate key keeps its
    # last value, nesting has no bound); pydantic then validates the same bytes in JSON mode,
    # whose strict rules (an ISO 8601 string for a datetime) the schemas are written for.
    try:
        json_loads(body)
    except ValueError as exc:
        raise Refused(error("Malformed JSON", 400, {"body": str(exc)})) from None
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for e in errors:
            if e["type"] == "json_invalid":
                raise Refused(error("Malformed JSON", 400, {"body": e["msg"]})) from None
        if any(e["type"] == "model_type" and not e["loc"] for e in errors):
            raise Refused(
                error("The body must be a JSON object", 400, {"body": "Expected an object"})
            ) from None
        raise Refused(error("Invalid request", 400, field_errors(exc))) from None


@overload
def authorize[**P](
    *, max_body: int = MiB
) -> Callable[[View[ApiRequest, P]], View[HttpRequest, P]]: ...


@overload
def authorize[M: BaseModel, **P](
    *, schema: type[M], max_body: int = MiB
) -> Callable[[View[PayloadRequest[M], P]], View[HttpRequest, P]]: ...


def authorize(
    *, schema: type[BaseModel] | None = None, max_body: int = MiB
) -> Callable[[View[Any, ...]], View[HttpRequest, ...]]:
    """Authenticate the Bearer key and set `request.project`; cap the body at `max_body`;
    with a `schema`, validate the JSON body once and set it as `request.payload`."""

    def decorator(view: View[Any, ...]) -> View[HttpRequest, ...]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            key = ApiKey.authenticate(_bearer(request))
            if key is None:
                response = error("Missing, wrong or revoked API key", 401)
                response["WWW-Authenticate"] = 'Bearer realm="tallybook"'
                return response
            api_request = cast(PayloadRequest[BaseModel], request)
            try:
                body = body_within(request, max_body)
                if schema is not None:
                    api_request.payload = _parse(request, body, schema)
            except Refused as refused:
                return refused.response
            api_request.project = key.project
            api_request.api_key = key
            api_request.actor = f"api:{key.prefix}"
            return view(api_request, *args, **kwargs)

        return wrapper

    return decorator
