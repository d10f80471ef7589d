"""Bad input: a 4xx naming the field, never a 5xx, and nothing stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durability.api.decorators import MiB
from durability.models import ApiKey
from tests.ledger.support import row_counts

INTENT: dict[str, Any] = {
    "key": "k1",
    "kind": "payment",
    "target": "stripe",
    "request": {"amount": 1},
}
RECEIPT: dict[str, Any] = {"key": "k1", "system": "stripe", "external_id": "re_1"}
FAILURE: dict[str, Any] = {"key": "k1", "error": "boom", "definitive": True}
TIMEOUT: dict[str, Any] = {"key": "k1", "reason": "no answer"}
VALID: dict[str, dict[str, Any]] = {
    "intents": INTENT,
    "receipts": RECEIPT,
    "failures": FAILURE,
    "timeouts": TIMEOUT,
}


@pytest.fixture
def counted(api):
    """An existing effect "k0", and the row counts to compare against afterwards."""
    assert api.intent("k0").status_code == 201
    return row_counts()


def assert_refused(r: Any, status: int, *fields: str) -> dict[str, Any]:
    assert r.status_code == status, r.content
    body: dict[str, Any] = r.json()
    assert isinstance(body["error"], str) and body["error"]
    for field in fields:
        assert field in body["fields"], body
        assert isinstance(body["fields"][field], str) and body["fields"][field]
    return body


@pytest.mark.parametrize("path", list(VALID))
@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b'{"key": "k1",}', b"not json", b"\xff\xfe{}", b'{"key": "k1"} trailing'],
    ids=["empty", "unclosed", "trailing-comma", "word", "bad-utf8", "trailing-data"],
)
def test_malformed_json_is_a_400_on_the_body(api, counted, path, raw):
    body = assert_refused(api.post(path, raw), 400, "body")
    assert body["error"] == "Malformed JSON"
    assert row_counts() == counted


@pytest.mark.parametrize("path", list(VALID))
@pytest.mark.parametrize("raw", ["[]", '"k1"', "1", "null", "true", '[{"key": "k1"}]'])
def test_a_body_that_is_not_an_object_is_a_400(api, counted, path, raw):
    body = assert_refused(api.post(path, raw), 400, "body")
    assert body["fields"]["body"] == "Expected an object"
    assert row_counts() == counted


@pytest.mark.parametrize("path", list(VALID))
def test_every_required_field_is_named_when_missing(api, counted, path):
    body = assert_refused(api.post(path, {}), 400)
    required = {"key", "kind", "target", "system", "external_id", "error", "reason"}
    assert set(body["fields"]) == required & set(VALID[path])
    assert set(body["fields"].values()) == {"This field is required"}
    assert row_counts() == counted


WRONG = [
    ("intents", {"key": 1}, "key"),
    ("intents", {"key": None}, "key"),
    ("intents", {"kind": ["payment"]}, "kind"),
    ("intents", {"timeout_s": "30"}, "timeout_s"),
    ("intents", {"timeout_s": 30.5}, "timeout_s"),
    ("intents", {"timeout_s": True}, "timeout_s"),
    ("intents", {"timeout_s": 0}, "timeout_s"),
    ("intents", {"timeout_s": 8 * 24 * 3600}, "timeout_s"),
    ("intents", {"replay": 1}, "replay"),
    ("intents", {"replay": "sometimes"}, "replay"),
    ("intents", {"replay": "NEVER"}, "replay"),
    ("intents", {"context": []}, "context"),
    ("intents", {"context": {"workflow_version": 2}}, "context.workflow_version"),
    ("intents", {"authority": "root"}, "authority"),
    ("intents", {"fingerprint": ""}, "fingerprint"),
    ("intents", {"run_id": "r" * 256}, "run_id"),
    ("intents", {"kind": "   "}, "kind"),
    ("intents", {"surprise": 1}, "surprise"),
    ("receipts", {"attempt": 0}, "attempt"),
    ("receipts", {"attempt": "1"}, "attempt"),
    ("receipts", {"observed_at": "yesterday"}, "observed_at"),
    ("receipts", {"observed_at": 1700000000}, "observed_at"),
    ("receipts", {"external_id": ""}, "external_id"),
    ("receipts", {"strength": "operator_attested"}, "strength"),
    ("failures", {"definitive": "yes"}, "definitive"),
    ("failures", {"definitive": 1}, "definitive"),
    ("failures", {"error": ""}, "error"),
    ("timeouts", {"reason": None}, "reason"),
    ("timeouts", {"reason": "x" * 4001}, "reason"),
]


@pytest.mark.parametrize(("path", "change", "field"), WRONG, ids=lambda v: str(v)[:40])
def test_a_wrong_value_is_a_400_naming_its_field(api, counted, path, change, field):
    body = assert_refused(api.post(path, {**VALID[path], **change}), 400, field)
    if field == "surprise" or field == "strength":
        assert body["fields"][field] == "Unknown field"
    assert row_counts() == counted


@pytest.mark.parametrize("path", list(VALID))
def test_a_key_over_255_characters_is_refused_and_255_is_not(api, counted, path):
    assert_refused(api.post(path, {**VALID[path], "key": "k" * 256}), 400, "key")
    assert_refused(api.post(path, {**VALID[path], "key": ""}), 400, "key")
    assert row_counts() == counted
    assert api.intent("k" * 255).status_code == 201


BAD_IDS = [
    ("trace_id", "A" * 32),
    ("trace_id", "a" * 31),
    ("trace_id", "a" * 33),
    ("trace_id", "g" * 32),
    ("trace_id", "0" * 32),
    ("trace_id", 12345),
    ("span_id", "B" * 16),
    ("span_id", "b" * 15),
    ("span_id", "z" * 16),
    ("span_id", "0" * 16),
    ("span_id", "0x" + "1" * 14),
]


@pytest.mark.parametrize("path", ["intents", "receipts"])
@pytest.mark.parametrize(("field", "value"), BAD_IDS)
def test_bad_hex_ids_are_a_400_naming_the_id(api, counted, path, field, value):
    assert_refused(api.post(path, {**VALID[path], field: value}), 400, field)
    assert row_counts() == counted


@pytest.mark.parametrize(
    "change",
    [
        {"key": "k\x00"},
        {"kind": "pay\x00ment"},
        {"request": {"note": "a\x00b"}},
        {"request": {"a\x00": 1}},
        {"context": {"workflow": "w\x00"}},
        {"context": {"extra": ["\x00"]}},
        {"authority": {"by": "\x00"}},
    ],
    ids=lambda v: next(iter(v)),
)
def test_nul_characters_the_database_cannot_store_are_a_400(api, counted, change):
    body = assert_refused(api.post("intents", {**INTENT, **change}), 400)
    assert set(body["fields"]) & {next(iter(change)), f"{next(iter(change))}.workflow"}
    assert row_counts() == counted


def test_a_nul_in_receipt_data_is_a_400(api, counted):
    assert_refused(api.post("receipts", {**RECEIPT, "data": ["\x00"]}), 400, "data")
    assert row_counts() == counted


def _intent_with_raw_request(raw: str) -> bytes:
    """An intent whose `request` is `raw`, verbatim: JSON that json.dumps would not write."""
    return b'{"key": "k1", "kind": "payment", "target": "stripe", "request": ' + raw.encode() + b"}"


@pytest.mark.parametrize(
    "raw",
    ['"\\ud800"', '"x\\udfff"', "NaN", "Infinity", "-Infinity", "1e999"],
    ids=["lone-high", "lone-low", "nan", "inf", "-inf", "overflow"],
)
def test_values_json_cannot_carry_faithfully_are_a_400(api, counted, raw):
    r = api.post("intents", _intent_with_raw_request(raw))
    assert 400 <= r.status_code < 500, r.content
    assert row_counts() == counted


@pytest.mark.parametrize("attempt", [2**31, 2**63, 10**30])
def test_an_attempt_number_beyond_the_column_is_a_400(api, counted, attempt):
    assert_refused(api.post("receipts", {**RECEIPT, "attempt": attempt}), 400, "attempt")
    assert row_counts() == counted


@pytest.mark.parametrize(
    "observed_at",
    ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0000-01-01T00:00:00Z"],
)
def test_an_external_timestamp_out_of_range_is_a_400(api, counted, observed_at):
    r = api.post("receipts", {**RECEIPT, "observed_at": observed_at})
    assert_refused(r, 400, "observed_at")
    assert row_counts() == counted


def test_deeply_nested_json_is_a_400(api, counted):
    deep = "[" * 10_000 + "]" * 10_000
    assert_refused(api.post("intents", _intent_with_raw_request(deep)), 400, "body")
    assert row_counts() == counted


@pytest.mark.parametrize("path", [*VALID, "events"])
@pytest.mark.parametrize(
    "raw",
    [b'{"key": "k1", "key": "k2"}', b'{"key": "k1", "request": {"amount": 1, "amount": 900}}'],
    ids=["top-level", "nested"],
)
def test_a_duplicate_key_in_a_json_object_is_a_400_not_the_last_one_winning(
    api, counted, path, raw
):
    body = assert_refused(api.post(path, raw), 400, "body")
    assert "duplicate key" in body["fields"]["body"]
    assert row_counts() == counted


@pytest.mark.parametrize("path", list(VALID))
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_declared_json_is_a_415(api, counted, path, content_type):
    r = api.client.post(
        f"/api/v1/{path}",
        data=json.dumps(VALID[path]),
        content_type=content_type,
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert_refused(r, 415, "Content-Type")
    assert row_counts() == counted


def test_json_with_a_charset_is_accepted(api):
    r = api.client.post(
        "/api/v1/intents",
        data=json.dumps(INTENT),
        content_type="application/json; charset=utf-8",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert r.status_code == 201


# -- size --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", list(VALID))
def test_a_body_over_one_mib_is_a_413(api, counted, path):
    body = json.dumps({**VALID[path], "pad": "x" * MiB}).encode()
    assert_refused(api.post(path, body), 413)
    assert row_counts() == counted


def test_a_body_just_under_one_mib_is_read(api):
    padding = MiB - len(json.dumps({**INTENT, "request": {"blob": ""}}).encode())
    body = json.dumps({**INTENT, "request": {"blob": "x" * padding}}).encode()
    assert len(body) == MiB
    assert api.post("intents", body).status_code == 201


# -- authentication ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer ", "Bearer tb_wrong", "Bearer not-even-prefixed", "Basic dGI6eA=="],
    ids=["none", "scheme-only", "empty", "wrong", "unprefixed", "basic"],
)
def test_a_missing_or_wrong_key_is_a_401(client, counted, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    for path, body in VALID.items():
        r = client.post(
            f"/api/v1/{path}", json.dumps(body), content_type="application/json", headers=headers
        )
        assert_refused(r, 401)
        assert r["WWW-Authenticate"].startswith("Bearer")
    for path in ("effects?key=k0", "effects/1"):
        assert client.get(f"/api/v1/{path}", headers=headers).status_code == 401
    assert row_counts() == counted


def test_a_revoked_key_is_a_401(api, counted):
    ApiKey.objects.get().revoke()
    assert_refused(api.intent("k2"), 401)
    assert api.get("effects", key="k0").status_code == 401
    assert row_counts() == counted


def test_a_401_comes_before_reading_the_body(client, counted):
    r = client.post(
        "/api/v1/intents",
        b"x" * (MiB + 1),
        content_type="application/json",
        headers={"Authorization": "Bearer tb_wrong"},
    )
    assert r.status_code == 401


# -- the reads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [({}, 400, "key"), ({"key": ""}, 400, "key"), ({"key": "k" * 256}, 400, "key")]
    + [({"key": "k\x00"}, 400, "key"), ({"key": "unknown"}, 404, "key")],
    ids=["missing", "empty", "long", "nul", "unknown"],
)
def test_looking_an_effect_up_by_a_bad_key_is_a_4xx(api, params, status, field):
    assert_refused(api.get("effects", **params), status, field)


def test_an_unknown_effect_id_is_a_404(api):
    assert_refused(api.get("effects/999999"), 404)
    assert api.get("effects/not-a-number").status_code == 404


@pytest.mark.parametrize("path", list(VALID))
def test_the_post_endpoints_refuse_get_with_a_405(api, path):
    assert api.get(path).status_code == 405


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"lineage": ""}, "lineage"),
        ({"lineage": "not-a-uuid"}, "lineage"),
        ({"lineage": "{12345678-1234-5678-1234-567812345678}"}, "lineage"),
        ({"lineage": "urn:uuid:12345678-1234-5678-1234-567812345678"}, "lineage"),
        ({"lineage": "12345678123456781234567812345678"}, "lineage"),
        ({"status": ""}, "status"),
        ({"before": ""}, "before"),
        ({"before": "²"}, "before"),
        ({"before": "1" * 5000}, "before"),
        ({"before": "-1"}, "before"),
    ],
    ids=str,
)
def test_a_bad_grant_query_is_a_400_naming_the_parameter(api, params, field):
    assert_refused(api.get("grants", **params), 400, field)


def test_a_grant_query_by_a_well_formed_lineage_is_answered(api):
    r = api.get("grants", lineage="12345678-1234-5678-1234-567812345678", before="99")
    assert r.status_code == 200 and r.json()["grants"] == []


def test_a_whole_number_written_with_a_fraction_is_the_integer_json_schema_says_it_is(api):
    # JSON Schema's `integer`, which the document states, includes 30.0.
    r = api.intent("k1", timeout_s=30.0)
    assert r.status_code == 201, r.content
    receipt = api.receipt("k1", "re_1", attempt=1.0)
    assert receipt.status_code == 201 and receipt.json()["receipt"]["attempt"] == 1


def test_a_looked_up_key_postgresql_cannot_store_is_a_400_naming_key(api, counted):
    body = assert_refused(api.get("effects", key="k\x00"), 400, "key")
    assert "NUL" in body["fields"]["key"]
    assert row_counts() == counted
