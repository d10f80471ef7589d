"""GET /api/v1/openapi.json describes the API truthfully: paths, methods, bodies and answers."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.urls import URLPattern
from pydantic import BaseModel

from durability import schemas, urls
from durability.decorators import MiB
from durability.models import ApiKey
from durability.openapi import REF

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
METHODS = {"get", "post", "put", "patch", "delete"}


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
    model: type[BaseModel] = getattr(schemas, name)
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
        assert path.startswith("/api/v1/")
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


def test_every_api_path_in_the_urls_is_documented_and_nothing_else(document):
    # durability/urls.py's own patterns: the apps it includes document their own endpoints.
    routed = {
        _openapi_path(str(pattern.pattern))
        for pattern in urls.urlpatterns
        if isinstance(pattern, URLPattern) and str(pattern.pattern).startswith("api/v1/")
    }
    assert routed == set(document["paths"])
    assert set(document["paths"]) >= LEDGER_PATHS


def test_the_documented_methods_are_the_ones_the_endpoints_accept(api, document):
    effect_id = api.intent("k1").json()["effect"]["id"]
    for path, item in document["paths"].items():
        url = path.replace("{effect_id}", str(effect_id)).replace("{grant_id}", "1")
        for method in METHODS:
            r = getattr(api.client, method)(url, headers={"Authorization": f"Bearer {api.key}"})
            if method in item:
                assert r.status_code != 405, (method, path)
            else:
                assert r.status_code == 405, (method, path)


def test_the_request_bodies_are_the_validation_schemas(document):
    components = document["components"]["schemas"]
    bodies = [
        operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for item in document["paths"].values()
        for operation in item.values()
        if "requestBody" in operation
    ]
    assert {_model(ref).__name__ for ref in bodies} >= {
        "IntentIn",
        "ReceiptIn",
        "FailureIn",
        "TimeoutIn",
    }
    for ref in bodies:
        model = _model(ref)
        expected = model.model_json_schema(ref_template=REF, mode="validation")
        for name, definition in expected.pop("$defs", {}).items():
            assert components[name] == definition, name
        assert components[model.__name__] == expected, model.__name__


def test_the_bodies_are_required_and_json(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "post":
                assert operation["requestBody"]["required"] is True, path
                assert list(operation["requestBody"]["content"]) == ["application/json"]


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
    seen = set()
    for method, path, response in calls:
        status = str(response.status_code)
        documented = document["paths"][path][method]["responses"]
        assert status in documented, (method, path, status, response.content[:200])
        schema = documented[status]["content"]["application/json"]["schema"]
        body = response.json()
        if "$ref" in schema:
            parsed = _model(schema["$ref"]).model_validate(body)
            # The round trip drops keys the schema does not name: none may be undocumented.
            assert parsed.model_dump(mode="json", exclude_unset=True) == body, (path, status)
        else:
            assert schema == {"type": "object"} and isinstance(body, dict)
        seen.add((method, path, status))
    documented_statuses = {
        (method, path, status)
        for path, item in document["paths"].items()
        if path in LEDGER_PATHS
        for method, operation in item.items()
        for status in operation["responses"]
    }
    assert documented_statuses == seen


def test_the_document_needs_no_key(client, db):
    ApiKey.objects.all().delete()
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert json.loads(client.get("/api/v1/openapi.json").content)["paths"]
