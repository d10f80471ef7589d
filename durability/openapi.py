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
    }
    return {str(s): _json(schemas.ErrorOut, texts[s]) for s in statuses}


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
    summary: str, answer: type[BaseModel], parameters: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": parameters,
            "responses": {
                "200": _json(answer, summary),
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
            "requests, tool calls) that the effects link to.",
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
                    "201": _json(schemas.DecisionOut, "The intent created the effect."),
                    "200": decision,
                    "409": _json(schemas.DecisionOut, "`conflict`: same key, another request."),
                },
            ),
            "/api/v1/receipts": _post(
                "Record a receipt: evidence that an effect happened",
                schemas.ReceiptIn,
                {
                    "201": _json(schemas.ReceiptResultOut, "A new receipt."),
                    "200": _json(schemas.ReceiptResultOut, "The same receipt again: no change."),
                },
            ),
            "/api/v1/failures": _post(
                "Record a failed attempt",
                schemas.FailureIn,
                {"200": _json(schemas.EffectResultOut, "The effect after the failure.")},
                404,
                409,
            ),
            "/api/v1/timeouts": _post(
                "Make an attempt's timeout authoritative",
                schemas.TimeoutIn,
                {"200": _json(schemas.EffectResultOut, "The effect, now timed out.")},
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
                    _query("before", {"type": "integer"}, "Grant id to continue before."),
                ],
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
