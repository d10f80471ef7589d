"""The OpenAPI 3.1 document of /api/v1/, /v1/traces and the signed webhook intake
/hooks/<name>/, generated from the validation and answer schemas."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from durability.api import schemas, webhooks
from durability.api.decorators import MiB
from durability.models import WebhookKind
from trajectories import api as trajectories_api
from trajectories import otlp
from trajectories import schemas as trajectories_schemas

REF = "#/components/schemas/{model}"


# PostgreSQL stores no NUL character, and the API refuses a string holding one (400): the
# document says so wherever a string of a request may go, so that a client's generator or a
# fuzzer reading it makes none (durability/inbound.py, `storable`).
NO_NUL: dict[str, Any] = {"not": {"pattern": "\u0000"}}
# A free JSON value of a request (an intent's `request`, a receipt's `data`, the context's
# extra keys): any JSON, its strings and its objects' names without NUL, at any depth.
STORABLE_JSON = "StorableJson"
_STORABLE_JSON_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value; no string in it, nor any object's name, holds a NUL.",
    "anyOf": [
        {"type": "string", **NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": {"$ref": REF.format(model=STORABLE_JSON)}},
        {
            "type": "object",
            "propertyNames": NO_NUL,
            "additionalProperties": {"$ref": REF.format(model=STORABLE_JSON)},
        },
    ],
}
# What pydantic writes beside a schema's own constraints: kept when a free value is replaced.
_ANNOTATIONS = ("title", "description", "default", "examples")


def _storable(node: Any) -> Any:
    """A request's schema with the API's refusal of NUL stated on every string it can hold:
    free strings get `not: {pattern: NUL}`, free JSON values the StorableJson schema."""
    if not isinstance(node, dict) or "$ref" in node:
        return node
    if not {"type", "anyOf", "allOf", "oneOf", "enum", "const", "not"} & set(node):
        # `{}`: any JSON (pydantic's Any)
        free = {key: node[key] for key in _ANNOTATIONS if key in node}
        return free | {"$ref": REF.format(model=STORABLE_JSON)}
    made = dict(node)
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        if key in node:
            made[key] = [_storable(item) for item in node[key]]
    for key in ("properties", "patternProperties"):
        if key in node:
            made[key] = {name: _storable(value) for name, value in node[key].items()}
    if isinstance(node.get("items"), dict):
        made["items"] = _storable(node["items"])
    # An object whose other names are kept (a dict, the context's extra keys): its names are
    # stored too. One that ignores other names (OTLP's messages) or refuses them needs none.
    if node.get("additionalProperties") is True:
        made["additionalProperties"] = {"$ref": REF.format(model=STORABLE_JSON)}
    elif isinstance(node.get("additionalProperties"), dict):
        made["additionalProperties"] = _storable(node["additionalProperties"])
    if node.get("additionalProperties", False) is not False and node.get("type") == "object":
        made.setdefault("propertyNames", NO_NUL)
    if node.get("type") == "string" and not {"pattern", "enum", "const", "format"} & set(node):
        if "not" in made:
            made["allOf"] = [{"not": made.pop("not")}, NO_NUL]
        else:
            made.update(NO_NUL)
    return made


def _requests(defs: dict[str, Any]) -> dict[str, Any]:
    """The schemas a request body can reach (the `...In` models and what they refer to),
    each with the refusal of NUL stated."""
    names = [name for name in defs if name.endswith("In")]
    reached: set[str] = set()
    while names:
        name = names.pop()
        if name in reached:
            continue
        reached.add(name)
        text = json.dumps(defs[name])
        names += [n for n in defs if f'"{REF.format(model=n)}"' in text]
    return {name: _storable(defs[name]) for name in reached}


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


def _batch(
    summary: str, body: type[BaseModel], results: type[BaseModel], description: str
) -> dict[str, Any]:
    """A batch of the SDK's reports: a multi-status answer, one result per item; the batch
    itself refused (400) only when it is no batch of 1 to 100 objects."""
    operation = _post(summary, body, {"207": _json(results, description)})
    answers = operation["post"]["responses"]
    answers["400"] = _json(schemas.ErrorOut, "Malformed JSON, or not a batch of 1 to 100 items.")
    answers["413"] = _json(schemas.ErrorOut, f"Body over {schemas.BATCH_MAX_BODY:,} bytes.")
    return operation


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


# The signature schemes of the webhook intake: HMAC-SHA256 with the source's secret, in
# headers named by durability/api/webhooks.py (not the agents' bearer key).
HOOK_SECURITY_SCHEMES = {
    "tallybook_signature": {
        "type": "apiKey",
        "in": "header",
        "name": webhooks.SIGNATURE[WebhookKind.GENERIC],
        "description": "A generic source's signature: `sha256=<hex>`, the HMAC-SHA256 with "
        f"the source's secret of the {webhooks.TIMESTAMP} value, a `.`, then the raw body. "
        "Compared in constant time.",
    },
    "tallybook_timestamp": {
        "type": "apiKey",
        "in": "header",
        "name": webhooks.TIMESTAMP,
        "description": "The Unix time (at most 20 ASCII digits) a generic delivery was signed "
        "at; signed with the body, it must lie within the source's replay window (default "
        "300 s) either way.",
    },
    "github_signature": {
        "type": "apiKey",
        "in": "header",
        "name": webhooks.SIGNATURE[WebhookKind.GITHUB],
        "description": "A GitHub source's signature: `sha256=<hex>`, the HMAC-SHA256 of the "
        "raw body with the source's secret (GitHub signs no timestamp).",
    },
}


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string", "maxLength": 255},
    }


HOOK_BODY = {
    "description": "What the source's kind reads. Not checked against its Content-Type: any "
    "body is parsed as JSON (UTF-8, no duplicate keys, NaN or Infinity, at most 64 levels "
    "deep).",
    "anyOf": [
        {
            "title": "Generic delivery",
            "type": "object",
            "description": "Any JSON object: the source's mapping names, by dotted paths (list "
            "items by index), the values read: `key` and `external_id`, and optionally "
            "`observed_at` (ISO 8601 or Unix seconds), `amount` and `currency`, `target`.",
        },
        {
            "title": "GitHub push",
            "type": "object",
            "description": "A `push` event: each commit whose message carries the source's "
            "trailer (default `Tallybook-Key: <key>`) becomes a receipt; other events are "
            "acknowledged without receipts.",
            "properties": {
                "ref": {"type": "string"},
                "repository": {
                    "type": "object",
                    "properties": {"full_name": {"type": "string"}},
                },
                "commits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "message": {"type": "string"},
                            "timestamp": {"type": "string", "format": "date-time"},
                            "url": {"type": "string"},
                        },
                    },
                },
            },
        },
    ],
}


def _hook() -> dict[str, Any]:
    """POST /hooks/<name>/: a provider's signed delivery, verified before it is read."""
    answers = {
        "201": _json(
            schemas.HookDeliveryOut,
            "Verified and stored, with every receipt it maps to (all or nothing): one for a "
            "generic delivery; for a GitHub push one per commit carrying the trailer, "
            "`ignored` counting the others; none for other GitHub events.",
        ),
        "200": _json(
            schemas.HookDeliveryOut,
            "Received before (the same delivery id, or the same signed bytes under another): "
            "`duplicate` is true, `receipts` empty, and nothing changed.",
        ),
        "400": _json(
            schemas.ErrorOut,
            "Malformed JSON (`fields.body` says why), a delivery id that cannot be stored "
            "(`fields` names its header), or an invalid Content-Length. Nothing stored.",
        ),
        "401": _json(
            schemas.ErrorOut,
            "Not verified: a missing or wrong signature; for a generic source a missing or "
            "malformed timestamp, or one outside the replay window. Nothing stored.",
        ),
        "404": _json(schemas.ErrorOut, "No such webhook source, or it is disabled."),
        "413": _json(schemas.ErrorOut, f"Body over {MiB:,} bytes."),
        "422": _json(
            schemas.ErrorOut,
            "The payload does not map to storable receipts: `fields` names each bad value by "
            "its path in the payload. Nothing stored, so the provider's retry can succeed.",
        ),
    }
    # Documented for every operation, driven by tests/api/test_json_answers.py and
    # test_database_away.py.
    unexpected = _errors()
    return {
        "post": {
            "summary": "Receive a provider's signed delivery as provider-confirmed receipts",
            "description": "The webhook intake of a source configured per project (Authority "
            "→ Webhook sources), signed with the source's secret: a generic source by "
            f"{webhooks.SIGNATURE[WebhookKind.GENERIC]} and {webhooks.TIMESTAMP}, a GitHub "
            f"source by {webhooks.SIGNATURE[WebhookKind.GITHUB]}. See docs/webhooks.md.",
            "security": [
                {"tallybook_signature": [], "tallybook_timestamp": []},
                {"github_signature": []},
            ],
            "parameters": [
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "description": "The webhook source's name.",
                    "schema": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
                },
                _header(
                    webhooks.DELIVERY[WebhookKind.GENERIC],
                    "A generic delivery's id: received once. Without one, identical bodies "
                    "are one delivery.",
                ),
                _header(webhooks.DELIVERY[WebhookKind.GITHUB], "A GitHub delivery's id."),
                _header(
                    webhooks.GITHUB_EVENT,
                    "A GitHub delivery's event: only `push` maps to receipts.",
                ),
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": HOOK_BODY}},
            },
            "responses": {**answers, **unexpected},
        }
    }


@cache
def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [
        schemas.IntentIn,
        schemas.ReceiptIn,
        schemas.FailureIn,
        schemas.TimeoutIn,
        schemas.ReceiptBatchIn,
        schemas.FailureBatchIn,
        schemas.DecisionOut,
        schemas.ReceiptResultOut,
        schemas.EffectResultOut,
        schemas.ReceiptBatchOut,
        schemas.FailureBatchOut,
        schemas.EffectDetailOut,
        schemas.GrantOut,
        schemas.GrantListOut,
        schemas.ErrorOut,
        schemas.HookDeliveryOut,
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
    requests = _requests(defs["$defs"])
    decision = _json(schemas.DecisionOut, "The decision for an effect that already existed.")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tallybook ingest API",
            "version": "1",
            "description": "Record intents before external effects and receipts after them; "
            "ask whether an effect already happened; send the trajectories (runs, model "
            "requests, tool calls) that the effects link to; and, for providers, deliver "
            "signed webhooks (`/hooks/{name}/`, signed with the webhook source's secret, not "
            "an API key) that become provider-confirmed receipts.\n\n"
            "Every answer is JSON (OTLP's may be protobuf). An error is an `ErrorOut`: "
            "`error` says what is wrong and `fields` names each bad field, parameter or "
            "header. An unknown URL is a 404 and a method a path does not take a 405 with "
            "`Allow`, both `ErrorOut`. Strings may not hold NUL characters, and times must "
            "lie between 2000-01-01 and one day from now once converted to UTC.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": defs["$defs"] | requests | {STORABLE_JSON: _STORABLE_JSON_SCHEMA},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                **HOOK_SECURITY_SCHEMES,
            },
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
            "/api/v1/receipts/batch": _batch(
                "Record up to 100 receipts, each on its own",
                schemas.ReceiptBatchIn,
                schemas.ReceiptBatchOut,
                "Each receipt's result, in order: the status and body POST /api/v1/receipts "
                "would have answered for it alone. Each is its own transaction: one answered "
                "201 or 200 is committed, one answered 400 changed nothing.",
            ),
            "/api/v1/failures/batch": _batch(
                "Record up to 100 failed attempts, each on its own",
                schemas.FailureBatchIn,
                schemas.FailureBatchOut,
                "Each failure's result, in order: the status and body POST /api/v1/failures "
                "would have answered for it alone, each its own transaction.",
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
            "/hooks/{name}/": _hook(),
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
