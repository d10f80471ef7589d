"""The API's front door: authentication, body limits and validation, in one decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, cast, overload

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from durability import rows
from durability.api.schemas import STORABLE, ErrorOut
from durability.inbound import json_loads, storable_strings
from durability.models import GONE_UNDER_A_WRITE, ApiKey, KeysVersion, Project, project_gone

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


class ModelResponse(JsonResponse):
    """A JSON answer whose shape is a pydantic model's, encoded by pydantic in one step (no
    dict of its dump for the json module to walk again)."""

    def __init__(self, body: BaseModel, status: int = 200, *, exclude_none: bool = False) -> None:
        HttpResponse.__init__(
            self,
            body.model_dump_json(exclude_none=exclude_none),
            content_type="application/json",
            status=status,
        )


def answer(body: BaseModel, status: int = 200, *, exclude_none: bool = False) -> JsonResponse:
    """A JSON answer whose shape is the pydantic model `body`'s."""
    return ModelResponse(body, status, exclude_none=exclude_none)


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


class ItemRefused(Exception):
    """One item of a batch refused: `body` says why, `status` is what its single route would
    have answered."""

    def __init__(self, body: ErrorOut, status: int) -> None:
        self.body = body
        self.status = status


def validated[M: BaseModel](schema: type[M], item: Any, body: bytes) -> M:
    """One item of a batch (as parsed from JSON in `body`) validated as its single route
    validates a whole body; ItemRefused (400) naming each bad field."""
    if not isinstance(item, dict):
        raise ItemRefused(
            ErrorOut(error="The body must be a JSON object", fields={"body": "Expected an object"}),
            400,
        )
    try:
        return schema.model_validate(item, context=STORABLE if storable_strings(body) else None)
    except ValidationError as exc:
        raise ItemRefused(
            ErrorOut(error="Invalid request", fields=field_errors(exc)), 400
        ) from None


def _bearer(request: HttpRequest) -> str:
    # From META: `request.headers` would build the map of every header for this one.
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def body_within(request: HttpRequest, max_body: int) -> bytes:
    """The body, or `Refused` with a 413 past `max_body` (declared or read); for the views
    that read raw bytes (signed webhooks) as for `authorize`."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise Refused(error("Invalid Content-Length", 400)) from None
    if declared > max_body:
        raise _too_big(max_body)
    try:
        body = request.body
    except RequestDataTooBig:
        raise _too_big(max_body) from None
    if len(body) > max_body:
        raise _too_big(max_body)
    return body


def _too_big(max_body: int) -> Refused:
    return Refused(error(f"Request body over {max_body} bytes", 413))


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
    # One parse: inbound's, which refuses what pydantic's would let through (a duplicate key
    # keeps its last value, nesting has no bound, 1e400 is infinity); pydantic validates the
    # document it read in strict mode, whose rules the schemas are written for either way
    # (a time is ISO 8601 text, not a number). Unless the body escapes a NUL or a surrogate,
    # no field needs its check for what PostgreSQL cannot store (schemas.STORABLE).
    try:
        document = json_loads(body)
    except ValueError as exc:
        raise Refused(error("Malformed JSON", 400, {"body": str(exc)})) from None
    if not isinstance(document, dict):
        raise Refused(error("The body must be a JSON object", 400, {"body": "Expected an object"}))
    try:
        return schema.model_validate(document, context=STORABLE if storable_strings(body) else None)
    except ValidationError as exc:
        raise Refused(error("Invalid request", 400, field_errors(exc))) from None


@overload
def authorize[**P](
    *, max_body: int = MiB, keys_ahead: bool = False
) -> Callable[[View[ApiRequest, P]], View[HttpRequest, P]]: ...


@overload
def authorize[M: BaseModel, **P](
    *, schema: type[M], max_body: int = MiB, keys_ahead: bool = False
) -> Callable[[View[PayloadRequest[M], P]], View[HttpRequest, P]]: ...


def authorize(
    *, schema: type[BaseModel] | None = None, max_body: int = MiB, keys_ahead: bool = False
) -> Callable[[View[Any, ...]], View[HttpRequest, ...]]:
    """Authenticate the Bearer key and set `request.project`; cap the body at `max_body`;
    with a `schema`, validate the JSON body once and set it as `request.payload`.

    A write refused because the key's project was deleted meanwhile (its transaction then
    commits after the project row is gone) is answered as the key would be a moment later:
    401, nothing stored.

    With `keys_ahead` (the ledger's writes, whose first statements are a batch of reads
    under the key's lock) a key this process cached is used at once, and the keys version
    it was cached under is checked in the view's first round trip (`rows.ahead`): if a key
    or project changed meanwhile, the view's transaction rolls back before it wrote
    anything, and the request is authenticated afresh and run again.
    """

    def decorator(view: View[Any, ...]) -> View[HttpRequest, ...]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            raw = _bearer(request)
            cached = ApiKey.cached(raw) if keys_ahead else None
            key = cached[0] if cached is not None else ApiKey.authenticate(raw)
            if key is None:
                return _unknown_key()
            api_request = cast(PayloadRequest[BaseModel], request)
            try:
                body = body_within(request, max_body)
                if schema is not None:
                    api_request.payload = _parse(request, body, schema)
            except Refused as refused:
                return refused.response
            if cached is not None:
                version = cached[1]
                try:
                    with rows.ahead(KeysVersion.CURRENT, (), lambda now: now.scalar() == version):
                        return _as(api_request, key, view, *args, **kwargs)
                except rows.Stale:
                    key = ApiKey.authenticate(raw)
                    if key is None:
                        return _unknown_key()
            return _as(api_request, key, view, *args, **kwargs)

        return wrapper

    return decorator


def _unknown_key() -> HttpResponse:
    response = error("Missing, wrong or revoked API key", 401)
    response["WWW-Authenticate"] = 'Bearer realm="tallybook"'
    return response


def _as(
    request: PayloadRequest[BaseModel], key: ApiKey, view: View[Any, ...], *args: Any, **kwargs: Any
) -> HttpResponse:
    request.project = key.project
    request.api_key = key
    request.actor = f"api:{key.prefix}"
    try:
        return view(request, *args, **kwargs)
    except GONE_UNDER_A_WRITE:
        # The project was deleted under the request (its key authenticated before the
        # revocation): answered as the key is from now on, and its transaction rolled back.
        if project_gone(key.project_id):
            return _unknown_key()
        raise
