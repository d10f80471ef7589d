"""The OpenAPI 3.1 document of /api/v1/, generated from the validation schemas."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from durability import schemas

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
            "ask whether an effect already happened.",
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
                            "description": "The OpenAPI 3.1 document of /api/v1/.",
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
