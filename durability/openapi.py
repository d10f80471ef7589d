"""The OpenAPI 3.1 document of /api/v1/ and /v1/traces, generated from the validation schemas."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from durability.api import schemas
from trajectories import api as trajectories_api
from trajectories import otlp
from trajectories import schemas as trajectories_schemas

REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    texts = {
        400: "Malformed JSON or invalid fields; `fields` names each bad field.",
        401: "Missing, wrong or revoked API key.",
        404: "No such effect in this project.",
        409: "The effect's state does not allow this.",
        413: "Body over 1 MiB.",
        415: "Content-Type is not application/json.",
        500: UNEXPECTED,
    }
    answers = {str(s): _json(schemas.ErrorOut, texts[s]) for s in (*statuses, 500)}
    answers["503"] = {
        **_json(
            schemas.ErrorOut,
            "The database is unavailable; nothing was changed or the "
            "write is idempotent on its key: retry after Retry-After.",
        ),
        "headers": RETRY_AFTER,
    }
    return answers


# Every operation can fail this way; none should (the contract test sends thousands of
# requests to make sure), but a client must be able to read the answer when one does.
UNEXPECTED = (
    "An unexpected error. Each write is one transaction and idempotent on its key: sending "
    "the same request again is safe."
)


def _operation(path: str, method: str) -> str:
    """A link's `operationRef` to the operation at `path` and `method`."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _links(*names: str) -> dict[str, Any]:
    """Links from an answer to the operations that read or report on what it names (an
    effect by its id or key, the first grant of a page): a client, or a stateful test,
    follows them."""
    by_key = {"requestBody": {"key": "$request.body#/key"}}
    links = {
        "effect": {
            "operationRef": _operation("/api/v1/effects/{effect_id}", "get"),
            "parameters": {"effect_id": "$response.body#/effect/id"},
        },
        "effect_by_key": {
            "operationRef": _operation("/api/v1/effects", "get"),
            "parameters": {"key": "$request.body#/key"},
        },
        "receipt": {"operationRef": _operation("/api/v1/receipts", "post"), **by_key},
        "failure": {"operationRef": _operation("/api/v1/failures", "post"), **by_key},
        "timeout": {"operationRef": _operation("/api/v1/timeouts", "post"), **by_key},
        "grant": {
            "operationRef": _operation("/api/v1/grants/{grant_id}", "get"),
            "parameters": {"grant_id": "$response.body#/grants/0/id"},
        },
    }
    return {name: links[name] for name in names}


EFFECT_LINKS = ("effect", "effect_by_key", "receipt", "failure", "timeout")


def _linked(response: dict[str, Any], *names: str) -> dict[str, Any]:
    return {**response, "links": _links(*names)} if names else response


def _post(
    summary: str, body: type[BaseModel], answers: dict[str, Any], *errors: int
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {**answers, **_errors(400, 401, 413, 415, *errors)},
        }
    }


def _get(summary: str, parameters: list[dict[str, Any]], *errors: int) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": parameters,
            "responses": {
                "200": _json(schemas.EffectDetailOut, "The effect and the decision it gets now."),
                **_errors(401, 404, *errors),
            },
        }
    }


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    parameter = {"name": name, "in": "query", "required": False, "schema": schema}
    return parameter | ({"description": description} if description else {})


def _grants_get(
    summary: str, answer: type[BaseModel], parameters: list[dict[str, Any]], *links: str
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": parameters,
            "responses": {
                "200": _linked(_json(answer, summary), *links),
                **_errors(400, 401),
                "404": _json(schemas.ErrorOut, "No such grant in this project."),
            },
        }
    }


RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before sending the same request again.",
        "schema": {"type": "integer"},
    }
}
OVERLOAD = {
    429: "The project's concurrent ingest slots are all taken; retry after Retry-After.",
    503: "The database is unavailable or too slow; retry after Retry-After.",
}


def _events() -> dict[str, Any]:
    """POST /api/v1/events: a multi-status answer, one result per event."""
    answers = {
        "207": _json(
            trajectories_schemas.EventBatchOut,
            "Each event's own result, in order: stored, duplicate (an id seen before: "
            "nothing changed) or rejected with its reason.",
        ),
        "400": _json(schemas.ErrorOut, "Malformed JSON, or not a batch of 1 to 1,000 events."),
        "401": _json(schemas.ErrorOut, "Missing, wrong or revoked API key."),
        "413": _json(schemas.ErrorOut, f"Body over {trajectories_api.EVENTS_MAX_BODY:,} bytes."),
        "415": _json(schemas.ErrorOut, "Content-Type is not application/json."),
        "500": _json(schemas.ErrorOut, UNEXPECTED),
    }
    for status, text in OVERLOAD.items():
        answers[str(status)] = {
            **_json(schemas.ErrorOut, f"{text} Nothing stored."),
            "headers": RETRY_AFTER,
        }
    return {
        "post": {
            "summary": "Record run and span events (a trajectory), each accepted on its own",
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _ref(trajectories_schemas.EventBatchIn)}
                },
            },
            "responses": answers,
        }
    }


def _otlp(json_schema: dict[str, Any], message: str) -> dict[str, Any]:
    """A body in both OTLP encodings: protobuf `message`, or JSON following `json_schema`."""
    return {
        otlp.PROTOBUF: {"schema": {"description": f"A serialized {message}."}},
        otlp.JSON: {"schema": json_schema},
    }


def _rpc_status(description: str, *content_types: str) -> dict[str, Any]:
    """An OTLP error: a google.rpc.Status in the request's encoding (or the ones given)."""
    content = _otlp(_ref(trajectories_schemas.OtlpStatusOut), "google.rpc.Status")
    return {
        "description": description,
        "content": {t: content[t] for t in content_types or content},
    }


def _traces() -> dict[str, Any]:
    """POST /v1/traces, as OTLP/HTTP wants it: every error a google.rpc.Status."""
    answers = {
        "200": {
            "description": "Stored; `partialSuccess` counts the spans rejected and says why.",
            "content": _otlp(
                _ref(trajectories_schemas.OtlpExportOut),
                "opentelemetry.proto.collector.trace.v1.ExportTraceServiceResponse",
            ),
        },
        "400": _rpc_status("Not an OTLP export request, or a body that does not inflate."),
        "401": _rpc_status("Missing, wrong or revoked API key."),
        "413": _rpc_status(
            f"Body over {trajectories_api.OTLP_MAX_BODY:,} bytes, inflating to over "
            f"{otlp.MAX_INFLATED:,}, or over {otlp.MAX_SPANS:,} spans. Nothing stored."
        ),
        "415": _rpc_status(f"Content-Type is neither {otlp.PROTOBUF} nor {otlp.JSON}.", otlp.JSON),
        "500": _json(schemas.ErrorOut, UNEXPECTED),
    }
    for code, text in OVERLOAD.items():
        answers[str(code)] = {**_rpc_status(f"{text} Nothing stored."), "headers": RETRY_AFTER}
    return {
        "post": {
            "summary": "Export OpenTelemetry spans (OTLP/HTTP, protobuf or JSON, gzip allowed)",
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": _otlp(
                    _ref(trajectories_schemas.OtlpExportIn),
                    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest",
                ),
            },
            "responses": answers,
        }
    }


@cache
def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [
        schemas.IntentIn,
        schemas.ReceiptIn,
        schemas.FailureIn,
        schemas.TimeoutIn,
        schemas.DecisionOut,
        schemas.ReceiptResultOut,
        schemas.EffectResultOut,
        schemas.EffectDetailOut,
        schemas.GrantOut,
        schemas.GrantListOut,
        schemas.ErrorOut,
        trajectories_schemas.EventBatchIn,
        trajectories_schemas.EventBatchOut,
        trajectories_schemas.OtlpExportIn,
        trajectories_schemas.OtlpExportOut,
        trajectories_schemas.OtlpStatusOut,
    ]
    _, defs = models_json_schema(
        [(m, "validation" if m.__name__.endswith("In") else "serialization") for m in models],
        ref_template=REF,
    )
    decision = _json(schemas.DecisionOut, "The decision for an effect that already existed.")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tallybook ingest API",
            "version": "1",
            "description": "Record intents before external effects and receipts after them; "
            "ask whether an effect already happened; send the trajectories (runs, model "
            "requests, tool calls) that the effects link to.\n\n"
            "Every answer is JSON (OTLP's may be protobuf). An error is an `ErrorOut`: "
            "`error` says what is wrong and `fields` names each bad field, parameter or "
            "header. An unknown URL is a 404 and a method a path does not take a 405 with "
            "`Allow`, both `ErrorOut`. Strings may not hold NUL characters, and times must "
            "lie between 2000-01-01 and one day from now once converted to UTC.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/api/v1/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "This OpenAPI 3.1 document.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            "/api/v1/intents": _post(
                "Record an intent and get a decision",
                schemas.IntentIn,
                {
                    "201": _linked(
                        _json(schemas.DecisionOut, "The intent created the effect."), *EFFECT_LINKS
                    ),
                    "200": _linked(decision, *EFFECT_LINKS),
                    "409": _json(schemas.DecisionOut, "`conflict`: same key, another request."),
                },
            ),
            "/api/v1/receipts": _post(
                "Record a receipt: evidence that an effect happened",
                schemas.ReceiptIn,
                {
                    "201": _linked(
                        _json(schemas.ReceiptResultOut, "A new receipt."), "effect_by_key"
                    ),
                    "200": _json(schemas.ReceiptResultOut, "The same receipt again: no change."),
                },
            ),
            "/api/v1/failures": _post(
                "Record a failed attempt",
                schemas.FailureIn,
                {
                    "200": _linked(
                        _json(schemas.EffectResultOut, "The effect after the failure."),
                        "effect",
                        "effect_by_key",
                    )
                },
                404,
                409,
            ),
            "/api/v1/timeouts": _post(
                "Make an attempt's timeout authoritative",
                schemas.TimeoutIn,
                {
                    "200": _linked(
                        _json(schemas.EffectResultOut, "The effect, now timed out."),
                        "effect",
                        "effect_by_key",
                    )
                },
                404,
                409,
            ),
            "/api/v1/effects/{effect_id}": _get(
                "An effect, its attempts, receipts, open cases and current decision",
                [
                    {
                        "name": "effect_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer"},
                    }
                ],
            ),
            "/api/v1/grants": _grants_get(
                "The project's grants, every version, newest first (100 a page)",
                schemas.GrantListOut,
                [
                    _query("status", {"enum": ["live", "expired", "revoked", "superseded"]}),
                    _query("lineage", {"type": "string", "format": "uuid"}),
                    _query(
                        "before",
                        {"type": "integer", "minimum": 0, "maximum": 10**18 - 1},
                        "Grant id to continue before.",
                    ),
                ],
                "grant",
            ),
            "/api/v1/grants/{grant_id}": _grants_get(
                "One grant version",
                schemas.GrantOut,
                [
                    {
                        "name": "grant_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer"},
                    }
                ],
            ),
            "/api/v1/events": _events(),
            "/v1/traces": _traces(),
            "/api/v1/effects": _get(
                "The effect with this key",
                [
                    {
                        "name": "key",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                    }
                ],
                400,
            ),
        },
    }


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(openapi_document())
