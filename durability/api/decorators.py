"""The API's front door: authentication, body limits and validation, in one decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from durability.models import ApiKey, Project

MiB = 1024 * 1024


class ApiRequest(HttpRequest):
    """An HttpRequest that `authorize` has authenticated."""

    project: Project
    api_key: ApiKey
    actor: str


def error(message: str, status: int, fields: dict[str, str] | None = None) -> JsonResponse:
    body: dict[str, Any] = {"error": message}
    if fields:
        body["fields"] = fields
    return JsonResponse(body, status=status)


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


def _bearer(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def authorize(
    *, max_body: int = MiB
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Authenticate the Bearer key and set `request.project`; cap the body at `max_body`."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            key = ApiKey.authenticate(_bearer(request))
            if key is None:
                response = error("Missing, wrong or revoked API key", 401)
                response["WWW-Authenticate"] = 'Bearer realm="tallybook"'
                return response
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return error("Invalid Content-Length", 400)
            if declared > max_body:
                return error(f"Request body over {max_body} bytes", 413)
            try:
                if len(request.body) > max_body:
                    return error(f"Request body over {max_body} bytes", 413)
            except RequestDataTooBig:
                return error(f"Request body over {max_body} bytes", 413)
            api_request: ApiRequest = request  # type: ignore[assignment]
            api_request.project = key.project
            api_request.api_key = key
            api_request.actor = f"api:{key.prefix}"
            return view(api_request, *args, **kwargs)

        return wrapper

    return decorator


def parse[M: BaseModel](request: HttpRequest, schema: type[M]) -> M | JsonResponse:
    """Validate a JSON body against `schema`: the model, or a 400 naming each bad field."""
    if request.content_type not in ("application/json", ""):
        return error(
            "Content-Type must be application/json",
            415,
            {"Content-Type": f"Expected application/json, not {request.content_type}"},
        )
    try:
        return schema.model_validate_json(request.body or b"")
    except ValidationError as exc:
        for e in exc.errors(include_url=False):
            if e["type"] == "json_invalid":
                return error("Malformed JSON", 400, {"body": e["msg"]})
        if any(e["type"] == "model_type" and not e["loc"] for e in exc.errors()):
            return error("The body must be a JSON object", 400, {"body": "Expected an object"})
        return error("Invalid request", 400, field_errors(exc))
