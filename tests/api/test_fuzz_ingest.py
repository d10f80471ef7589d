"""Property-based fuzzing of the JSON entrances: the ledger's (intents, receipts, failures,
timeouts) and the events'. Arbitrary JSON, near-valid bodies and odd bytes never get a 5xx,
and an input that is refused stores nothing (every table's row count, before and after).

Derandomized, with a bounded number of examples: the same inputs on every run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from durability.api.schemas import FailureIn, IntentIn, ReceiptIn, TimeoutIn
from tests.api.test_bad_input import VALID
from tests.ledger.support import row_counts

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=100,
    # One project and its key for all the examples of a test: the row counts are compared
    # around each request, so what earlier examples stored does not matter.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values that have broken parsers and databases: NUL, a lone surrogate, times out of range
# or with offsets PostgreSQL refuses, ids of zeros, numbers past every column, long text.
ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "²",
    "٣",
    "1" * 5000,
    "x" * 70_000,
    "0" * 16,
    "0" * 32,
    "4bf92f3577b34da6a3ce929d0e0e4736",
    "00f067aa0ba902b7",
    "2026-11-29T10:00:00Z",
    "2026-11-29T10:00:00+22:00",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-14:00",
    "10000-01-01T00:00:00Z",
    "1999-12-31T23:59:59Z",
    "NaN",
    "Infinity",
    "sk-abcdefghijklmnopqrstuvwxyz012345",
    "run",
    "span",
]
ODD_NUMBERS = [0, -1, 1, 2**31, 2**63, -(2**63), 2**64, 10**30, 1e20, 1e308, 30.0, 0.5, -0.0]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(ODD_NUMBERS)
    | st.text(max_size=40)
    | st.sampled_from(ODD_STRINGS)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=10) | st.sampled_from(ODD_STRINGS[:6]), children, max_size=4
        )
    ),
    max_leaves=12,
)

# The server's request model of each endpoint, and every field it takes.
LEDGER_SCHEMAS: dict[str, type[BaseModel]] = {
    "intents": IntentIn,
    "receipts": ReceiptIn,
    "failures": FailureIn,
    "timeouts": TimeoutIn,
}
LEDGER_FIELDS = {path: list(schema.model_fields) for path, schema in LEDGER_SCHEMAS.items()}


@st.composite
def near_valid(draw: st.DrawFn, valid: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """`valid` with a few of its fields (or unknown ones) replaced, removed or added."""
    body = dict(valid)
    for field in draw(st.lists(st.sampled_from([*fields, "surprise"]), min_size=1, max_size=4)):
        if draw(st.booleans()) and field in body:
            del body[field]
        else:
            body[field] = draw(json_values)
    return body


def _post(api: Any, path: str, raw: bytes) -> Any:
    r = api.post(path, raw)
    assert r.status_code < 500, (path, raw[:300], r.content[:300])
    assert r["Content-Type"] == "application/json", (path, r.status_code)
    return r


def _refused(r: Any) -> bool:
    """Refused outright: malformed, invalid, too big, or about an effect that does not exist."""
    if r.status_code in (400, 413, 415):
        return True
    return (
        r.status_code == 404 and r.json().get("fields", {}).get("key") == "No effect has this key"
    )


@pytest.fixture
def effect_k1(api):
    """The effect the valid bodies name, so that near-valid ones reach the ledger."""
    assert api.intent("k1").status_code == 201


@FUZZ
@given(data=st.data())
def test_near_valid_ledger_bodies_never_fail_and_refused_ones_store_nothing(api, effect_k1, data):
    path = data.draw(st.sampled_from(list(VALID)))
    body = data.draw(near_valid(VALID[path], LEDGER_FIELDS[path]))
    before = row_counts()
    r = _post(api, path, json.dumps(body).encode())
    if _refused(r):
        assert r.json()["error"] and (r.status_code != 400 or r.json()["fields"]), r.content
        assert row_counts() == before, (path, body)


@FUZZ
@given(path=st.sampled_from(list(VALID)), body=json_values)
def test_arbitrary_json_to_the_ledger_never_fails_and_refused_json_stores_nothing(
    api, effect_k1, path, body
):
    before = row_counts()
    r = _post(api, path, json.dumps(body).encode())
    if _refused(r):
        assert row_counts() == before, (path, body)


@st.composite
def odd_json_text(draw: st.DrawFn) -> bytes:
    """A valid body written as no JSON encoder would: a key twice, deep nesting, NaN,
    a number past every float, a lone surrogate escape, or cut short."""
    path = draw(st.sampled_from(list(VALID)))
    text = json.dumps(VALID[path])
    first = text[1 : text.index(",")]
    odd = draw(
        st.sampled_from(
            [
                "{" + first + ", " + text[1:],
                text[:-1] + ', "request": ' + "[" * 100 + "]" * 100 + "}",
                text[:-1] + ', "data": NaN}',
                text[:-1] + ', "data": -Infinity}',
                text[:-1] + ', "request": 1e999}',
                text[:-1] + ', "request": "\\ud800"}',
                text[:-1] + ', "request": {"a": 1, "a": 2}}',
                text[: draw(st.integers(0, len(text) - 1))],
            ]
        )
    )
    return json.dumps({"path": path, "raw": odd}).encode()


@FUZZ
@given(case=odd_json_text())
def test_json_no_encoder_would_write_is_refused_and_stores_nothing(api, effect_k1, case):
    decoded = json.loads(case)
    before = row_counts()
    r = _post(api, decoded["path"], decoded["raw"].encode("utf-8", "surrogatepass"))
    assert r.status_code == 400, r.content
    assert row_counts() == before


# -- events ----------------------------------------------------------------------------------

SPAN_EVENT: dict[str, Any] = {
    "id": "e",
    "type": "span",
    "run_id": "run-1",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "span_id": "00f067aa0ba902b7",
    "parent_span_id": None,
    "kind": "model",
    "name": "chat",
    "start": "2026-11-29T10:00:00Z",
    "end": "2026-11-29T10:00:01Z",
    "input_tokens": 3,
    "attributes": {"gen_ai.system": "openai"},
    "output": [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1"}]}],
}
RUN_EVENT: dict[str, Any] = {
    "id": "r",
    "type": "run",
    "run_id": "run-1",
    "agent": "refunds",
    "status": "ok",
    "started": "2026-11-29T10:00:00Z",
    "ended": "2026-11-29T10:00:02Z",
    "trace_ids": ["4bf92f3577b34da6a3ce929d0e0e4736"],
}
EVENT_FIELDS = {
    "span": [*SPAN_EVENT, "status", "status_message", "tool_call_id", "tool_name", "input"],
    "run": [*RUN_EVENT, "workflow", "workflow_version", "conversation_id", "attributes"],
}


@FUZZ
@given(data=st.data())
def test_a_near_valid_event_never_fails_and_if_rejected_stores_nothing(api, data):
    kind = data.draw(st.sampled_from(["span", "run"]))
    valid = SPAN_EVENT if kind == "span" else RUN_EVENT
    event = data.draw(near_valid(valid, EVENT_FIELDS[kind]))
    # A fresh id, unless the fuzzing replaced it: an id seen before would change nothing.
    if event.get("id") == valid["id"]:
        event["id"] = f"{kind}-{data.draw(st.uuids())}"
    before = row_counts()
    r = _post(api, "events", json.dumps({"events": [event]}).encode())
    if r.status_code == 207:
        (result,) = r.json()["results"]
        if result["result"] == "rejected":
            assert result["fields"], result
            assert row_counts() == before, event
    else:
        assert r.status_code == 400 and row_counts() == before, r.content


@FUZZ
@given(events=st.lists(json_values, min_size=1, max_size=5) | json_values)
def test_arbitrary_json_as_events_never_fails_and_rejected_events_store_nothing(api, events):
    before = row_counts()
    r = _post(api, "events", json.dumps({"events": events}).encode())
    if r.status_code != 207 or r.json()["stored"] == 0:
        assert row_counts() == before, events
