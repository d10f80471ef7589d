"""GET /api/v1/openapi.json describes the API truthfully: paths, methods, bodies and answers,
the ledger's, the trajectories' (/api/v1/events, OTLP's /v1/traces) and the signed webhook
intake's (/hooks/<name>/) alike."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from pydantic import BaseModel, TypeAdapter

from durability.api import schemas, webhooks
from durability.api.decorators import MiB
from durability.models import ApiKey, WebhookKind, WebhookSource
from durability.openapi import NO_NUL, REF, STORABLE_JSON, _storable
from tests.api.support import deliver
from tests.ledger import support as ledger
from tests.trajectories.support import (
    PROTOBUF,
    ingest_stalled,
    post_traces,
    request,
    slots_taken,
    span,
    to_json,
)
from trajectories import schemas as trajectories_schemas
from trajectories.api import EVENTS_MAX_BODY, OTLP_MAX_BODY

__all__ = ["ingest_stalled", "slots_taken"]

# The ledger's endpoints (issue 2); every status documented for them is produced below.
LEDGER_PATHS = {
    "/api/v1/intents",
    "/api/v1/receipts",
    "/api/v1/failures",
    "/api/v1/timeouts",
    "/api/v1/effects",
    "/api/v1/effects/{effect_id}",
    "/api/v1/openapi.json",
}
# The trajectories' endpoints (issue 4).
TRAJECTORY_PATHS = {"/api/v1/events", "/v1/traces"}
# The signed webhook intake (issue 12).
HOOK_PATH = "/hooks/{name}/"
METHODS = {"get", "post", "put", "patch", "delete"}
# The protobuf message of each OTLP answer: the export response, or a google.rpc.Status.
PROTOBUF_ANSWERS = {"200": ExportTraceServiceResponse}


@pytest.fixture
def document(client) -> dict[str, Any]:
    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    assert r["Content-Type"] == "application/json"
    doc: dict[str, Any] = r.json()
    return doc


def _openapi_path(route: str) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


def _model(ref: str) -> type[BaseModel]:
    name = ref.removeprefix(REF.format(model=""))
    model: type[BaseModel] = getattr(schemas, name, None) or getattr(trajectories_schemas, name)
    assert issubclass(model, BaseModel)
    return model


def test_it_is_an_openapi_3_1_document(document):
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] and document["info"]["version"]
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
    }
    for path, item in document["paths"].items():
        assert path.startswith("/api/v1/") or path in {"/v1/traces", HOOK_PATH}
        for method, operation in item.items():
            assert method in METHODS, (path, method)
            assert operation["summary"]
            assert operation["responses"], (path, method)
            for status, response in operation["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d", status), (path, status)
                assert response["description"]
                assert "application/json" in response["content"]
            for parameter in operation.get("parameters", []):
                assert parameter["in"] in {"path", "query", "header"}
                if parameter["in"] == "path":
                    assert parameter["required"] is True
                    assert "{" + parameter["name"] + "}" in path


def test_every_reference_resolves(document):
    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if "$ref" in node else []
            return own + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    found = refs(document)
    assert found
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in document["components"]["schemas"], ref


def _routes(patterns: list[URLPattern | URLResolver], prefix: str = "") -> list[str]:
    """Every route of a URLconf, with the prefixes of the includes it passes through."""
    routes = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes += _routes(pattern.url_patterns, route)
        else:
            routes.append(route)
    return routes


def test_every_api_path_in_the_urls_is_documented_and_nothing_else(document):
    # The root URLconf and every room's urls it includes, trajectories' among them.
    routed = {
        _openapi_path(route)
        for route in _routes(get_resolver().url_patterns)
        if route.startswith(("api/", "v1/", "hooks/"))
    }
    assert routed == set(document["paths"])
    assert set(document["paths"]) >= LEDGER_PATHS | TRAJECTORY_PATHS | {HOOK_PATH}


def test_the_documented_methods_are_the_ones_the_endpoints_accept(api, document):
    effect_id = api.intent("k1").json()["effect"]["id"]
    for path, item in document["paths"].items():
        url = (
            path.replace("{effect_id}", str(effect_id))
            .replace("{grant_id}", "1")
            .replace("{name}", "ghost")
        )
        for method in METHODS:
            r = getattr(api.client, method)(url, headers={"Authorization": f"Bearer {api.key}"})
            if method in item:
                assert r.status_code != 405, (method, path)
            else:
                assert r.status_code == 405, (method, path)


def test_the_request_bodies_are_the_validation_schemas(document):
    components = document["components"]["schemas"]
    # Every body but the webhook intake's, which is the provider's JSON (below).
    bodies = [
        operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, item in document["paths"].items()
        for operation in item.values()
        if "requestBody" in operation and path != HOOK_PATH
    ]
    assert {_model(ref).__name__ for ref in bodies} >= {
        "IntentIn",
        "ReceiptIn",
        "FailureIn",
        "TimeoutIn",
        "EventBatchIn",
        "OtlpExportIn",
    }
    for ref in bodies:
        model = _model(ref)
        expected = model.model_json_schema(ref_template=REF, mode="validation")
        # As validation states them, with the refusal of NUL written on every free string.
        for name, definition in expected.pop("$defs", {}).items():
            assert components[name] == _storable(definition), name
        assert components[model.__name__] == _storable(expected), model.__name__


def _free_strings(node: Any, at: str = "") -> list[str]:
    """Where a request schema admits any string: no pattern, enum, format or NUL refusal."""
    found = []
    if isinstance(node, dict):
        if (
            node.get("type") == "string"
            and not {"pattern", "enum", "const", "format"} & set(node)
            and node.get("not") != NO_NUL["not"]
            and NO_NUL not in node.get("allOf", [])
        ):
            found.append(at)
        for key, value in node.items():
            if key not in ("not", "propertyNames"):
                found += _free_strings(value, f"{at}/{key}")
    elif isinstance(node, list):
        for n, value in enumerate(node):
            found += _free_strings(value, f"{at}/{n}")
    return found


def test_the_document_says_no_string_of_a_request_may_hold_a_nul(document):
    # The API refuses one with a 400 (test_bad_input.py); a client's generator reads it here.
    components = document["components"]["schemas"]
    requests = {name: schema for name, schema in components.items() if name.endswith("In")}
    assert not _free_strings(requests)
    intent = components["IntentIn"]["properties"]
    assert intent["key"]["not"] == {"pattern": "\u0000"}
    assert intent["request"]["$ref"] == REF.format(model=STORABLE_JSON)
    context = components["Context"]
    assert context["additionalProperties"] == {"$ref": REF.format(model=STORABLE_JSON)}
    assert context["propertyNames"] == NO_NUL
    # Any JSON at any depth: its strings, and its objects' names.
    storable = components[STORABLE_JSON]["anyOf"]
    assert {"type": "string", **NO_NUL} in storable
    assert any(arm.get("propertyNames") == NO_NUL for arm in storable)


def test_the_document_states_the_range_of_a_time_from_outside(document):
    observed_at = document["components"]["schemas"]["ReceiptIn"]["properties"]["observed_at"]
    moment = observed_at["anyOf"][0]
    assert "no earlier than 2000-01-01 and no later than one day from now" in moment["description"]
    lower = re.compile(moment["pattern"])
    assert lower.match("2026-11-29T12:00:00Z") and lower.match("2000-01-02T00:00:00Z")
    assert not lower.match("1999-12-31T23:59:59Z") and not lower.match("1074-06-26T09:43:13Z")


def test_the_bodies_are_required_and_json_or_for_otlp_also_protobuf(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "post":
                assert operation["requestBody"]["required"] is True, path
                content = set(operation["requestBody"]["content"])
                otlp = {"application/json", PROTOBUF}
                assert content == (otlp if path == "/v1/traces" else {"application/json"})


def test_the_overloaded_answers_document_retry_after(document):
    for path in TRAJECTORY_PATHS:
        responses = document["paths"][path]["post"]["responses"]
        for status in ("429", "503"):
            assert responses[status]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if path != "/api/v1/openapi.json":
                retry_after = operation["responses"]["503"]["headers"]["Retry-After"]
                assert retry_after["schema"] == {"type": "integer"}, (method, path)


def test_the_webhook_intake_is_signed_by_the_sources_headers_not_the_api_key(document):
    schemes = document["components"]["securitySchemes"]
    hook = document["paths"][HOOK_PATH]["post"]
    # A generic source signs with both its headers, a GitHub one with its own.
    assert hook["security"] == [
        {"tallybook_signature": [], "tallybook_timestamp": []},
        {"github_signature": []},
    ]
    headers = {
        name: (scheme["type"], scheme["in"], scheme["name"])
        for name, scheme in schemes.items()
        if name != "bearer"
    }
    assert headers == {
        "tallybook_signature": ("apiKey", "header", webhooks.SIGNATURE[WebhookKind.GENERIC]),
        "tallybook_timestamp": ("apiKey", "header", webhooks.TIMESTAMP),
        "github_signature": ("apiKey", "header", webhooks.SIGNATURE[WebhookKind.GITHUB]),
    }
    assert all("HMAC-SHA256" in schemes[name]["description"] for name in schemes if "sig" in name)
    # Every other operation takes the bearer key, or (this document) nothing.
    for path, item in document["paths"].items():
        for operation in item.values():
            if path not in (HOOK_PATH, "/api/v1/openapi.json"):
                assert operation["security"] == [{"bearer": []}], path
    parameters = {(p["in"], p["name"]) for p in hook["parameters"]}
    assert parameters == {
        ("path", "name"),
        ("header", webhooks.DELIVERY[WebhookKind.GENERIC]),
        ("header", webhooks.DELIVERY[WebhookKind.GITHUB]),
        ("header", webhooks.GITHUB_EVENT),
    }
    body = hook["requestBody"]["content"]["application/json"]["schema"]
    assert [kind["title"] for kind in body["anyOf"]] == ["Generic delivery", "GitHub push"]
    assert all(kind["type"] == "object" for kind in body["anyOf"])


# -- real answers against the documented ones --------------------------------------------


def _post_badly(api: Any, path: str) -> list[Any]:
    """Malformed JSON, an oversized body, no key, and the wrong Content-Type."""
    return [
        api.post(path, b"{"),
        api.post(path, b"x" * (MiB + 1)),
        api.client.post(f"/api/v1/{path}", "{}", content_type="application/json"),
        api.client.post(
            f"/api/v1/{path}",
            "{}",
            content_type="text/plain",
            headers={"Authorization": f"Bearer {api.key}"},
        ),
    ]


def test_real_answers_validate_against_the_documented_schemas(api, client, document):
    """Drive every documented status of the ledger's endpoints; check each answer's shape."""
    first = api.intent("k1", timeout_s=30, context={"workflow": "w", "extra": 1})
    effect_id = first.json()["effect"]["id"]
    calls: list[tuple[str, str, Any]] = [
        ("post", "/api/v1/intents", first),
        ("post", "/api/v1/intents", api.intent("k1")),
        ("post", "/api/v1/intents", api.intent("k1", request={"amount": 2})),
        ("post", "/api/v1/receipts", api.receipt("k1", "re_1", data={"x": [1]})),
        ("post", "/api/v1/receipts", api.receipt("k1", "re_1")),
        ("post", "/api/v1/receipts", api.receipt("k1", "re_2")),
        ("post", "/api/v1/receipts", api.receipt("nobody", "re_3")),
        ("post", "/api/v1/intents", api.intent("k2")),
        ("post", "/api/v1/timeouts", api.timeout("k2")),
        ("post", "/api/v1/timeouts", api.timeout("k1")),
        ("post", "/api/v1/timeouts", api.timeout("nope")),
        ("post", "/api/v1/intents", api.intent("k3")),
        ("post", "/api/v1/failures", api.failure("k3", definitive=True)),
        ("post", "/api/v1/failures", api.failure("k1")),
        ("post", "/api/v1/failures", api.failure("nope")),
        ("get", "/api/v1/effects/{effect_id}", api.get(f"effects/{effect_id}")),
        ("get", "/api/v1/effects/{effect_id}", api.get("effects/999999")),
        ("get", "/api/v1/effects/{effect_id}", client.get(f"/api/v1/effects/{effect_id}")),
        ("get", "/api/v1/effects", api.get("effects", key="k2")),
        ("get", "/api/v1/effects", api.get("effects", key="nope")),
        ("get", "/api/v1/effects", api.get("effects")),
        ("get", "/api/v1/effects", client.get("/api/v1/effects", {"key": "k2"})),
        ("get", "/api/v1/openapi.json", client.get("/api/v1/openapi.json")),
    ]
    for path in ("intents", "receipts", "failures", "timeouts"):
        calls += [("post", f"/api/v1/{path}", r) for r in _post_badly(api, path)]
    # A 500 and a 503 are documented for every operation but no request here should produce
    # one: tests/api/test_json_answers.py drives a 500 and test_database_away.py a 503.
    assert _checked(document, calls) == _documented(document, LEDGER_PATHS) - _unexpected(
        document, LEDGER_PATHS
    )


def _unexpected(document: dict[str, Any], paths: set[str]) -> set[tuple[str, str, str]]:
    return {(m, p, s) for m, p, s in _documented(document, paths) if s in ("500", "503")}


def _documented(document: dict[str, Any], paths: set[str]) -> set[tuple[str, str, str]]:
    return {
        (method, path, status)
        for path, item in document["paths"].items()
        if path in paths
        for method, operation in item.items()
        for status in operation["responses"]
    }


def _checked(document: dict[str, Any], calls: list[tuple[str, str, Any]]) -> set[Any]:
    """Check each answer against its documented status, content type and schema.

    Returns the (method, path, status) seen.
    """
    seen = set()
    for method, path, response in calls:
        status = str(response.status_code)
        documented = document["paths"][path][method]["responses"]
        assert status in documented, (method, path, status, response.content[:200])
        content_type = response["Content-Type"]
        assert content_type in documented[status]["content"], (path, status, content_type)
        if "Retry-After" in documented[status].get("headers", {}):
            assert response["Retry-After"].isdigit(), (path, status)
        if content_type == PROTOBUF:
            message = PROTOBUF_ANSWERS.get(status, status_pb2.Status)
            assert message.FromString(response.content).SerializeToString() == response.content
            seen.add((method, path, status))
            continue
        schema = documented[status]["content"][content_type]["schema"]
        body = response.json()
        if "$ref" in schema:
            parsed = _model(schema["$ref"]).model_validate(body)
            # The round trip drops keys the schema does not name: none may be undocumented.
            assert parsed.model_dump(mode="json", exclude_unset=True) == body, (path, status)
        else:
            assert schema == {"type": "object"} and isinstance(body, dict)
        seen.add((method, path, status))
    return seen


def _events_badly(api: Any) -> list[Any]:
    """Malformed JSON, an oversized body, no key, and the wrong Content-Type."""
    return [
        api.post("events", b"{"),
        api.post("events", b"x" * (EVENTS_MAX_BODY + 1)),
        api.client.post("/api/v1/events", "{}", content_type="application/json"),
        api.client.post(
            "/api/v1/events",
            "{}",
            content_type="text/plain",
            headers={"Authorization": f"Bearer {api.key}"},
        ),
    ]


def _traces_badly(api: Any) -> list[Any]:
    """Undecodable protobuf and JSON, an oversized body, no key, and the wrong Content-Type."""
    return [
        post_traces(api.client, api.key, b"\xff\xff not protobuf"),
        api.client.post(
            "/v1/traces",
            "{not json",
            content_type="application/json",
            headers={"Authorization": f"Bearer {api.key}"},
        ),
        post_traces(api.client, api.key, b"x" * (OTLP_MAX_BODY + 1)),
        api.client.post("/v1/traces", b"", content_type=PROTOBUF),
        api.client.post(
            "/v1/traces",
            "x",
            content_type="text/plain",
            headers={"Authorization": f"Bearer {api.key}"},
        ),
    ]


EVENT = {
    "id": "e1",
    "type": "span",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "span_id": "00f067aa0ba902b7",
    "kind": "model",
    "name": "chat gpt-4o",
    "start": "2026-11-29T10:00:00Z",
    "input_tokens": 12,
}
RUN_EVENT = {"id": "e0", "type": "run", "run_id": "run-1", "agent": "refunds", "status": "ok"}


def _overloaded(api: Any) -> list[tuple[str, str, Any]]:
    """Both endpoints, in each OTLP encoding, while ingest cannot go on."""
    message = request(span("1111111111111111"))
    return [
        ("post", "/api/v1/events", api.post("events", {"events": [EVENT]})),
        ("post", "/v1/traces", post_traces(api.client, api.key, message)),
        ("post", "/v1/traces", post_traces(api.client, api.key, message, as_json=True)),
    ]


def test_the_trajectory_endpoints_answer_429_as_documented(api, document, slots_taken):
    seen = _checked(document, _overloaded(api))
    assert {status for _, _, status in seen} == {"429"}


def test_the_trajectory_endpoints_answer_503_as_documented(api, document, ingest_stalled):
    seen = _checked(document, _overloaded(api))
    assert {status for _, _, status in seen} == {"503"}


def test_the_trajectory_endpoints_real_answers_validate_against_the_documented_schemas(
    api, document
):
    """Drive every other documented status of the trajectories' endpoints, and check the
    requests sent against the documented request schemas."""
    good = request(
        span("00f067aa0ba902b7", "root", attributes={"gen_ai.operation.name": "chat"}),
        span("0000000000000000", "a span id of zeros is rejected"),
    )
    batch = {"events": [RUN_EVENT, EVENT, {"id": "bad", "type": "span"}, EVENT]}
    calls: list[tuple[str, str, Any]] = [
        ("post", "/api/v1/events", api.post("events", batch)),
        ("post", "/v1/traces", post_traces(api.client, api.key, good)),
        ("post", "/v1/traces", post_traces(api.client, api.key, good, as_json=True)),
    ]
    calls += [("post", "/api/v1/events", r) for r in _events_badly(api)]
    calls += [("post", "/v1/traces", r) for r in _traces_badly(api)]
    seen = _checked(document, calls)
    assert seen == _documented(document, TRAJECTORY_PATHS) - {
        ("post", path, status) for path in TRAJECTORY_PATHS for status in ("429", "503", "500")
    }
    assert calls[0][2].json()["results"][2]["result"] == "rejected"
    assert calls[2][2].json()["partialSuccess"]["rejectedSpans"] == "1"
    trajectories_schemas.EventBatchIn.model_validate(batch)
    event = TypeAdapter(trajectories_schemas.EventIn)
    for item in (RUN_EVENT, EVENT):
        event.validate_python(item)
    trajectories_schemas.OtlpExportIn.model_validate(to_json(good))


REFUND = {
    "created": 1_760_000_000,
    "data": {
        "object": {
            "id": "re_1",
            "amount": 1250,
            "currency": "eur",
            "metadata": {"tallybook_key": "refund:1"},
        }
    },
}


def _pushed(*commits: dict[str, Any]) -> bytes:
    payload = {"ref": "refs/heads/main", "repository": {"full_name": "acme/shop"}}
    return json.dumps({**payload, "commits": list(commits)}).encode()


def _commit(sha: str, message: str, timestamp: Any = "2025-10-09T10:00:00+02:00") -> Any:
    url = f"https://github.com/acme/shop/commit/{sha}"
    return {"id": sha, "message": message, "timestamp": timestamp, "url": url}


def test_the_webhook_intakes_real_answers_validate_against_the_documented_schemas(
    client, document, project, stripe, github
):
    """Drive every documented status of POST /hooks/<name>/, both kinds of source, each
    signed with its source's secret; check each answer's shape."""
    ledger.intent(project, "refund:1")
    ledger.intent(project, "fix:42", kind="git.push", target="acme/shop")
    refund = json.dumps(REFUND).encode()
    unmapped = json.dumps({**REFUND, "data": {"object": {"id": "re_2"}}}).encode()
    push = _pushed(_commit("a" * 40, "Fix\n\nTallybook-Key: fix:42\n"), _commit("b" * 40, "x"))
    bad_commit = _pushed(_commit("c" * 40, "Fix\n\nTallybook-Key: fix:43\n", timestamp=1e20))
    ping = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    ghost = WebhookSource(name="ghost", secret="s", kind=WebhookKind.GENERIC)
    now = str(int(time.time()))
    answers = [
        deliver(client, stripe, refund, timestamp=now),
        deliver(client, stripe, refund, delivery="d-2", timestamp=now),  # a replay
        deliver(client, stripe, b"{", delivery="d-3"),
        deliver(client, stripe, refund, delivery="d-" + "x" * 300),
        deliver(client, stripe, refund, delivery="d-4", secret="not-the-secret"),
        deliver(client, stripe, refund, delivery="d-5", **{webhooks.TIMESTAMP: "1"}),
        deliver(client, stripe, b"x" * (MiB + 1), delivery="d-6"),
        deliver(client, stripe, unmapped, delivery="d-7"),
        deliver(client, ghost, refund),
        deliver(client, github, push, delivery="gh-1"),
        deliver(client, github, push, delivery="gh-1"),
        deliver(client, github, push, delivery="gh-2", secret="not-the-secret"),
        deliver(client, github, bad_commit, delivery="gh-3"),
        deliver(client, github, ping, delivery="gh-4", **{webhooks.GITHUB_EVENT: "ping"}),
    ]
    WebhookSource.objects.filter(pk=github.pk).update(enabled=False)
    answers.append(deliver(client, github, push, delivery="gh-5"))
    statuses = [r.status_code for r in answers]
    assert statuses == [201, 200, 400, 400, 401, 401, 413, 422, 404, 201, 200, 401, 422, 201, 404]
    seen = _checked(document, [("post", HOOK_PATH, r) for r in answers])
    # 500 and 503: tests/api/test_json_answers.py and test_database_away.py drive them.
    assert seen == _documented(document, {HOOK_PATH}) - _unexpected(document, {HOOK_PATH})
    stored, replayed = answers[0].json(), answers[1].json()
    assert stored["receipts"][0]["effect"]["state"] == "succeeded" and not stored["duplicate"]
    assert replayed == {"delivery": "d-2", "duplicate": True, "receipts": [], "ignored": 0}
    assert answers[9].json()["ignored"] == 1 and answers[13].json()["receipts"] == []
    # A method the intake does not take: the document's 405 for every path, an ErrorOut.
    wrong = client.get(f"/hooks/{stripe.name}/")
    assert wrong.status_code == 405 and wrong["Allow"] == "POST"
    assert schemas.ErrorOut.model_validate(wrong.json()).model_dump(exclude_none=True) == (
        wrong.json()
    )


def test_the_document_needs_no_key(client, db):
    ApiKey.objects.all().delete()
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert json.loads(client.get("/api/v1/openapi.json").content)["paths"]


def test_the_all_zero_trace_and_span_ids_are_refused_in_the_document_too(document):
    components = document["components"]["schemas"]
    rule = {"not": {"pattern": "^0+$"}}

    def field(model: str, name: str) -> dict[str, Any]:
        schema: dict[str, Any] = components[model]["properties"][name]
        return next((s for s in schema.get("anyOf", []) if s.get("type") == "string"), schema)

    for model, name in [
        ("IntentIn", "trace_id"),
        ("IntentIn", "span_id"),
        ("ReceiptIn", "trace_id"),
        ("ReceiptIn", "span_id"),
        ("SpanEventIn", "trace_id"),
        ("SpanEventIn", "span_id"),
        ("OtlpSpan", "traceId"),
        ("OtlpSpan", "spanId"),
    ]:
        assert rule.items() <= field(model, name).items(), (model, name)
    assert rule.items() <= components["RunEventIn"]["properties"]["trace_ids"]["items"].items()
