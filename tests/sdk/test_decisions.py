"""One table of cases for the decision table, run against the real server and against
`tallybook.testing`'s fake, so that an agent's tests on the fake mean what they say."""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tallybook import (
    EffectConflict,
    EffectDenied,
    EffectInDoubt,
    EffectUnsettled,
    ServerUnavailable,
    Tallybook,
    testing,
)
from tallybook.testing import FakeTallybook
from tallybook.transport import Retry, Transport

from durability.api.schemas import (
    DecisionOut,
    EffectDetailOut,
    EffectResultOut,
    FailureIn,
    IntentIn,
    ReceiptIn,
    ReceiptResultOut,
    TimeoutIn,
)
from durability.ledger import settling
from durability.ledger.commands import ReceiptEvidence
from durability.ledger.machine import Event
from durability.models import Effect
from tests.authority.support import grant
from tests.sdk.support import FAST

# The table both SDKs' suites run (sdk-ts/packages/sdk/test/decisions.test.ts reads it too):
# its "steps" and "claims_about" say what the entries mean.
TABLE = json.loads((Path(__file__).parent / "decisions.json").read_text())
KEY = TABLE["key"]
RAISES = {"wait": EffectInDoubt, "denied": EffectDenied, "conflict": EffectConflict}

# (what the agent or the operator does, the decision the block is given, the state after,
# and, where the table gives them, the reasons of the effect's open cases after)
Step = tuple[str, str | None, str, list[str] | None]
CASES: dict[str, tuple[dict[str, Any], list[Step]]] = {
    name: (case["options"], [(*step, None)[:4] for step in case["steps"]])
    for name, case in TABLE["cases"].items()
}
# The spool's steps: what a process that died before sending left in the spool with the key's
# own report, and sends in one batch (the table's "steps" says each).
SPOOL_STEPS = ("batch", "batch_refused", "batch_lost", "fail_batch")


@dataclass
class Backend:
    """A client and an operator's hands, on the real server or on the fake."""

    tb: Tallybook
    operator: Any
    state: Any
    # Two grants' ids (the fake grants any), and the API itself, as the client speaks to it.
    grants: tuple[int, int]
    api: Any


@pytest.fixture(params=["server", "fake"])
def backend(request, spool_root, live_server, project, api_key):
    if request.param == "fake":
        fake = FakeTallybook()
        verdicts = {
            "not_happened": lambda: fake.fake.settle(KEY, happened=False),
            "happened": lambda: fake.fake.settle(KEY, happened=True),
            "abandon": lambda: fake.fake.abandon(KEY),
        }
        yield Backend(
            fake, lambda what: verdicts[what](), lambda: fake.fake.state(KEY), (1, 2), fake.fake
        )
        fake.close()
        return
    tb = Tallybook(live_server.url, api_key, spool=spool_root, **FAST)
    grants = (grant(project, name="payments").pk, grant(project, name="others").pk)
    api = Transport(
        live_server.url, api_key, timeout=5.0, retry=Retry(retries=0), user_agent="tests"
    )
    yield Backend(tb, _settle, lambda: Effect.objects.get(key=KEY).state, grants, api)
    api.close()
    tb.close()


def _settle(what: str) -> None:
    effect = Effect.objects.get(key=KEY)
    event = {
        "not_happened": Event.ATTEST_NOT_HAPPENED,
        "happened": Event.ATTEST_HAPPENED,
        "abandon": Event.ABANDON,
    }[what]
    evidence = ReceiptEvidence(key=KEY, system="fakepay", external_id="seen-by-alice")
    settling.effect_settle(
        project=effect.project,
        effect_id=effect.pk,
        actor="user:alice",
        event=event,
        note="checked with fakepay",
        evidence=evidence if what == "happened" else None,
    )


def _act(backend: Backend, what: str, options: dict[str, Any], n: int) -> str | None:
    """Do one step; the decision the block was given (None for an operator's step)."""
    tb = backend.tb
    if what in ("not_happened", "happened", "abandon"):
        backend.operator(what)
        return None
    if what == "late":
        tb.receipt(KEY, system="fakepay", external_id=f"re_late_{n}")
        return None
    request = {"order": 42, "other": what == "other"}
    if what == "die":
        intent = {"key": KEY, "kind": "payment", "target": "fakepay", "request": request}
        intent |= {"worker": "a process that died", **options}
        answer = backend.api.request("POST", "/api/v1/intents", intent)
        assert answer.status == 201, answer.body
        return str(answer.body["decision"])
    if what in SPOOL_STEPS:
        _left_in_spool(backend, what, n)
        return None
    block = tb.effect(KEY, kind="payment", target="fakepay", request=request, **options)
    try:
        with block as fx:
            if what == "receipt":
                fx.receipt(system="fakepay", external_id=f"re_{n}")
            elif what == "fail":
                fx.fail("declined", definitive=True)
            elif what == "crash":
                raise ConnectionError("fakepay hung up")
            elif what == "leave":
                pass
    except tuple(RAISES.values()) as report:
        return report.decision
    except (ConnectionError, EffectUnsettled):
        pass
    return fx.decision


def _left_in_spool(backend: Backend, what: str, n: int) -> None:
    """The key's report and two others, written to the spool as a process that died before
    sending them left them; the client sends them in one batch (flushed by the caller)."""
    spool = backend.tb.spool
    keys = (KEY, f"{KEY}:step{n}:1", f"{KEY}:step{n}:2")
    endpoint = "failures" if what == "fail_batch" else "receipts"
    bodies: list[dict[str, Any]] = [
        {"key": key, "error": "declined", "definitive": True}
        if endpoint == "failures"
        else {"key": key, "system": "fakepay", "external_id": f"re_{n}"}
        for key in keys
    ]
    if what == "batch_refused":
        bodies[1]["colour"] = "red"
    if what == "batch_lost":
        _lose_an_answer(backend)
    # Locked until all are written, so that the sender finds the three together.
    for entry in [spool.put(endpoint, body) for body in bodies]:
        spool.release(entry)


def _lose_an_answer(backend: Backend) -> None:
    """The next batch reaches the server, which records it; its answer is lost on the way."""
    transport = backend.tb._configured().transport
    send = transport.request
    lost: list[str] = []

    def losing(method: str, path: str, body: Any = None, **options: Any) -> Any:
        answer = send(method, path, body, **options)
        if path.endswith("/batch") and not lost:
            lost.append(path)
            raise ServerUnavailable(f"{method} {path}: the connection was reset")
        return answer

    transport.request = losing  # type: ignore[method-assign]


@pytest.mark.parametrize("case", list(CASES))
def test_the_fake_and_the_server_decide_alike(backend, case):
    options, steps = CASES[case]
    refused = 0
    for n, (what, decision, state, cases) in enumerate(steps):
        assert _act(backend, what, options, n) == decision, (case, n, what)
        assert backend.tb.flush()
        assert backend.state() == state, (case, n, what)
        detail = backend.api.request("GET", f"/api/v1/effects?key={KEY}").body
        if cases is not None:
            assert sorted(c["reason"] for c in detail["cases"]) == cases, (case, n, what)
        if what == "batch_lost":
            assert len(detail["receipts"]) == 1, (case, n, what)
        refused += what == "batch_refused"
        assert len(list(backend.tb.spool.rejected.glob("*.json"))) == refused, (case, n, what)


# A later intent for the key claiming otherwise than the first (kind, target, grant, amount)
# is a conflict even for the same request: what was checked and approved is the first claim.
# (the change to the first intent's options, what the answer says differs; None: nothing)
CLAIMS: dict[str, tuple[dict[str, Any], str | None]] = {
    name: (claim["change"], claim["differs"]) for name, claim in TABLE["claims"].items()
}
REQUEST = TABLE["request"]


def _claim(backend: Backend, change: dict[str, Any]) -> dict[str, Any]:
    """The first intent's options (kind, target, authority, amount) with `change`; a grant
    is the index of one of the backend's."""
    claim = {**TABLE["first_claim"], **change}
    which = claim.pop("grant")
    return claim | {"authority": None if which is None else {"grant": backend.grants[which]}}


@pytest.mark.parametrize("outcome", ["receipt", "fail"])
@pytest.mark.parametrize("change", list(CLAIMS))
def test_the_fake_and_the_server_decide_alike_on_another_claim(backend, change, outcome):
    changed, differs = CLAIMS[change]
    with backend.tb.effect(KEY, request=REQUEST, **_claim(backend, {})) as fx:
        assert fx.decision == "proceed"
        if outcome == "receipt":
            fx.receipt(system="fakepay", external_id="re_1")
        else:
            fx.fail("declined", definitive=True)
    assert backend.tb.flush()
    state = backend.state()
    block = backend.tb.effect(KEY, request=REQUEST, **_claim(backend, changed))

    if differs is None:
        with block as fx:
            assert fx.decision == ("completed" if outcome == "receipt" else "proceed")
            if not fx.completed:
                fx.receipt(system="fakepay", external_id="re_2")
        assert backend.tb.flush()
        assert backend.state() == "succeeded"
        return
    with pytest.raises(EffectConflict) as raised, block:
        pytest.fail("a conflict is not performed")
    report = raised.value
    assert report.case is not None and report.case.reason == "key_reuse_conflict"
    assert f"a different {differs};" in report.reason
    assert report.case.summary == f"Key {KEY!r} was reused with a different {differs}."
    assert backend.state() == state


def test_the_fake_answers_a_conflict_as_the_server_does(backend):
    """The API's answer itself: status, shape and words, and one case for repeats."""
    first = {"key": KEY, "request": REQUEST, **_claim(backend, {})}
    assert backend.api.request("POST", "/api/v1/intents", first).status == 201

    answers = [
        backend.api.request("POST", "/api/v1/intents", first | change)
        for change in (
            {"amount": {"value": "900", "currency": "EUR"}, "target": "paypal"},
            {"request": {"order": 43}},
        )
    ]

    assert [a.status for a in answers] == [409, 409]
    claimed, requested = (a.body for a in answers)
    assert set(claimed) == {"decision", "reason", "effect", "receipt", "case"}
    assert (claimed["decision"], claimed["receipt"]) == ("conflict", None)
    assert claimed["reason"] == (
        f"Key {KEY!r} was first recorded with a different target, amount; do not perform it: "
        "what was checked and approved is the first intent's request and claim. Give a "
        "different effect its own key."
    )
    case = claimed["case"]
    assert set(case) == {"id", "reason", "severity", "summary", "opened", "closed", "url"}
    assert (case["reason"], case["severity"]) == ("key_reuse_conflict", "high")
    assert case["closed"] is None
    assert case["summary"] == f"Key {KEY!r} was reused with a different target, amount."
    assert (claimed["effect"]["state"], claimed["effect"]["attempt"]) == ("pending", 1)
    assert requested["case"]["id"] == case["id"]
    assert requested["reason"].startswith(
        f"Key {KEY!r} was first recorded with a different request (fingerprint "
    )


def test_the_fake_answers_a_completed_tool_with_its_result():
    tb = FakeTallybook()
    sent = []

    @tb.tool("email:{to}", kind="email", target="fakesmtp", receipt="id")
    def send_email(to: str) -> dict:
        sent.append(to)
        return {"id": f"msg-{len(sent)}"}

    assert send_email("ann@example.com") == send_email("ann@example.com") == {"id": "msg-1"}
    assert sent == ["ann@example.com"]
    assert tb.fake.effects["email:ann@example.com"].receipts[0]["data"] == {
        "result": {"id": "msg-1"}
    }
    tb.close()


def test_the_fake_takes_the_fields_the_api_takes():
    for path, schema in {
        "/api/v1/intents": IntentIn,
        "/api/v1/receipts": ReceiptIn,
        "/api/v1/failures": FailureIn,
        "/api/v1/timeouts": TimeoutIn,
    }.items():
        required, optional = testing.TAKES[path]
        fields = schema.model_fields
        assert set(required) == {n for n, f in fields.items() if f.is_required()}, path
        assert set(required + optional) == set(fields), path


def _models(annotation: Any) -> list[type[BaseModel]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _as_declared(schema: type[BaseModel], body: dict[str, Any]) -> None:
    """`body` has the fields the server's answer `schema` declares, nested, and no other."""
    schema.model_validate(body)
    assert set(body) == set(schema.model_fields), schema.__name__
    for name, declared in schema.model_fields.items():
        value = body[name]
        for inner in _models(declared.annotation):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _as_declared(inner, item)


TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_the_fake_answers_the_fields_the_server_answers(backend):
    """Amounts, grants, deadlines, attempts, ids: what an agent's test may read off an
    answer is there on the fake as on the server, alike where the two can agree."""
    api = backend.api
    claim = _claim(backend, {})
    intent = {"key": KEY, "request": REQUEST, "timeout_s": 600, "worker": "w1", **claim}
    intent |= {"run_id": "run-1", "trace_id": TRACE, "span_id": SPAN}
    intent["context"] = {"workflow_version": "3"}
    proceed = api.request("POST", "/api/v1/intents", intent)
    assert proceed.status == 201
    _as_declared(DecisionOut, proceed.body)
    assert proceed.body["effect"]["deadline"] is not None

    receipt = {"key": KEY, "system": "fakepay", "external_id": "re_1", "attempt": 1}
    receipt |= {"amount": {"value": "50.0", "currency": "EUR"}, "target": "fakepay"}
    receipt |= {"trace_id": TRACE, "span_id": SPAN, "observed_at": "2026-01-15T10:00:00Z"}
    recorded = api.request("POST", "/api/v1/receipts", receipt)
    assert (recorded.status, recorded.body["created"]) == (201, True)
    _as_declared(ReceiptResultOut, recorded.body)
    stored = recorded.body["receipt"]
    assert stored["amount"] == {"value": "50", "currency": "EUR"}
    assert (stored["target"], stored["trace_id"], stored["span_id"]) == ("fakepay", TRACE, SPAN)
    again = api.request("POST", "/api/v1/receipts", receipt)
    assert (again.status, again.body["created"]) == (200, False)
    _as_declared(ReceiptResultOut, again.body)

    status = api.request("GET", f"/api/v1/effects?key={KEY}")
    assert status.status == 200
    detail = status.body
    _as_declared(EffectDetailOut, detail)
    assert (detail["decision"], detail["request"]) == ("completed", REQUEST)
    assert detail["amount"] == {"value": "50", "currency": "EUR"}
    assert detail["authority"] == claim["authority"]
    assert detail["grant"]["id"] == backend.grants[0]
    (attempt,) = detail["attempts"]
    assert (attempt["number"], attempt["worker"], attempt["run_id"]) == (1, "w1", "run-1")
    assert (attempt["trace_id"], attempt["context"]["workflow_version"]) == (TRACE, "3")
    assert [r["external_id"] for r in detail["receipts"]] == ["re_1"]

    orphan = api.request("POST", "/api/v1/receipts", receipt | {"key": "refund:none"})
    assert (orphan.status, orphan.body["effect"]) == (201, None)
    _as_declared(ReceiptResultOut, orphan.body)
    assert orphan.body["case"]["reason"] == "orphan_receipt"

    api.request("POST", "/api/v1/intents", {"key": "refund:43", "request": 43, **claim})
    for path, body in (
        ("/api/v1/failures", {"key": "refund:43", "error": "hung up"}),
        ("/api/v1/timeouts", {"key": "refund:43", "reason": "no answer"}),
    ):
        reported = api.request("POST", path, body)
        assert reported.status == 200, path
        _as_declared(EffectResultOut, reported.body)
        assert reported.body["effect"]["state"] == "timed_out"
        assert reported.body["case"]["reason"] == "uncertain"


def test_the_fake_refuses_a_field_the_server_refuses(backend):
    intent = {"key": KEY, "kind": "payment", "target": "fakepay", "amout": "50"}
    refused = backend.api.request("POST", "/api/v1/intents", intent)
    assert refused.status == 400
    assert refused.body == {"error": "Invalid request", "fields": {"amout": "Unknown field"}}
    unnamed = backend.api.request("POST", "/api/v1/receipts", {"key": KEY, "system": "fakepay"})
    assert (unnamed.status, unnamed.body["fields"]) == (
        400,
        {"external_id": "This field is required"},
    )


def test_the_fake_answers_batches_and_events_as_the_server_does(backend):
    """The multi-status routes the SDK's sender reads one result at a time: the batches of
    receipts and failures, and run and span events, each item answered on its own."""
    api = backend.api
    intent = {"key": KEY, "request": REQUEST, **_claim(backend, {})}
    assert api.request("POST", "/api/v1/intents", intent).status == 201

    receipt = {"key": KEY, "system": "fakepay", "external_id": "re_1"}
    receipts = [receipt, receipt | {"colour": "red"}, receipt]
    batch = api.request("POST", "/api/v1/receipts/batch", {"receipts": receipts})
    assert batch.status == 207
    results = batch.body["results"]
    assert [(r["index"], r["status"]) for r in results] == [(0, 201), (1, 400), (2, 200)]
    assert results[0]["body"]["effect"]["state"] == "succeeded"
    assert results[1]["body"] == {"error": "Invalid request", "fields": {"colour": "Unknown field"}}
    assert results[2]["body"]["created"] is False

    failures = [{"key": KEY, "error": "declined"}, {"key": "refund:none", "error": "declined"}]
    batch = api.request("POST", "/api/v1/failures/batch", {"failures": failures})
    assert batch.status == 207
    assert [r["status"] for r in batch.body["results"]] == [409, 404]
    for empty in ({"receipts": []}, {"receipts": [receipt] * 101}, {"failures": "all"}):
        path = f"/api/v1/{next(iter(empty))}/batch"
        assert api.request("POST", path, empty).status == 400, empty

    run = {"type": "run", "id": "ev-1", "run_id": "run-1", "status": "running"}
    events = [run, {"type": "run", "id": "ev-2"}, {"type": "trace", "id": "ev-3"}]
    first = api.request("POST", "/api/v1/events", {"events": events})
    again = api.request("POST", "/api/v1/events", {"events": [run]})
    assert (first.status, again.status) == (207, 207)
    assert {k: first.body[k] for k in ("stored", "duplicates", "rejected")} == {
        "stored": 1,
        "duplicates": 0,
        "rejected": 2,
    }
    assert first.body["results"] == [
        {"index": 0, "id": "ev-1", "status": 201, "result": "stored"},
        {
            "index": 1,
            "id": "ev-2",
            "status": 400,
            "result": "rejected",
            "error": "Invalid event",
            "fields": {"run_id": "This field is required"},
        },
        {
            "index": 2,
            "id": "ev-3",
            "status": 400,
            "result": "rejected",
            "error": "Unknown event type",
            "fields": {"type": "Expected 'run' or 'span'"},
        },
    ]
    assert again.body == {
        "stored": 0,
        "duplicates": 1,
        "rejected": 0,
        "results": [{"index": 0, "id": "ev-1", "status": 200, "result": "duplicate"}],
    }
