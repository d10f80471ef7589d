"""An in-memory Tallybook for an agent's own tests: no server, the same decisions.

    from tallybook.testing import FakeTallybook

    def test_the_refund_is_not_repeated():
        tb = FakeTallybook()
        refund_order(tb, 42)
        refund_order(tb, 42)          # a restart
        assert tb.fake.state("refund:42") == "succeeded"

The client is the real one (spool, rules, tools); only the server is replaced, by
`FakeServer`, which follows the decision table of the documentation: a new key
proceeds, a receipt completes it, an outcome nobody knows is in doubt until an operator
(`tb.fake.settle(...)`) says what happened, a key reused for another request or another
claim (kind, target, authority or amount: what was checked and approved) is a conflict.
Authority is granted unless `FakeServer(approval=..., denied=...)` names the kind;
approvals are given with `tb.fake.approve(key)`. It takes the fields the API takes (an
unknown or a missing one is a 400, as there) and answers the fields the API answers, amounts
and grants included; a grant's limits are not checked (`grant` names any grant, one with
no limits). The multi-status routes answer one result per item, as the server's: the batches
of receipts and failures the sender sends, and run and span events (kept by id in
`fake.events`, each run's latest status in `fake.runs`). Tallybook's own tests run one table
of cases against this fake and the real server, so the two agree.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tallybook.aio import AsyncTallybook
from tallybook.client import Config, Given, Tallybook
from tallybook.records import Json
from tallybook.spool import Spool
from tallybook.transport import Response, Retry

URL = "http://tallybook.test"
RETRYABLE_AFTER_TIMEOUT = ("safe", "idempotent")
LATE_FROM = ("timed_out", "failed", "not_happened", "abandoned")
# The fields each endpoint takes (the API's schemas, which the fake's tests compare with
# these), the required ones first.
INTENT = ("key", "kind", "target")
RECEIPT = ("key", "system", "external_id")
FAILURE = ("key", "error")
TAKES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "/api/v1/intents": (
        INTENT,
        (
            "request",
            "fingerprint",
            "replay",
            "timeout_s",
            "run_id",
            "tool_call_id",
            "trace_id",
            "span_id",
            "worker",
            "context",
            "authority",
            "amount",
        ),
    ),
    "/api/v1/receipts": (
        RECEIPT,
        ("observed_at", "data", "amount", "target", "attempt", "trace_id", "span_id"),
    ),
    "/api/v1/failures": (FAILURE, ("definitive",)),
    "/api/v1/timeouts": (("key", "reason"), ()),
    "/api/v1/events": (("events",), ()),
}
# The batch routes of the reports the SDK spools, and the field that holds their items.
BATCHES = {"/api/v1/receipts/batch": "receipts", "/api/v1/failures/batch": "failures"}
MAX_BATCH = 100
MAX_EVENTS = 1000
# What each event type requires besides its id (as the server's schemas).
EVENT_REQUIRES = {"run": ("run_id",), "span": ("trace_id", "span_id", "name", "start")}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class FakeEffect:
    id: int
    key: str
    kind: str
    target: str
    fingerprint: str
    claim: Json  # the first intent's kind, target, authority and amount (`_claim`)
    intent: Json  # the first intent, as sent
    replay: str
    state: str
    attempt: int = 0
    worker: str | None = None
    run_id: str | None = None
    late: bool = False
    deadline: str | None = None
    receipts: list[Json] = field(default_factory=list)
    cases: list[Json] = field(default_factory=list)  # open ones
    attempts: list[Json] = field(default_factory=list)
    created: str = field(default_factory=_now)
    updated: str = ""

    def __post_init__(self) -> None:
        self.updated = self.created

    def __setattr__(self, name: str, value: Any) -> None:
        # As the server's row: any change of what an answer shows moves `updated`.
        super().__setattr__(name, value)
        if name in ("state", "attempt", "late", "deadline"):
            super().__setattr__("updated", _now())

    def to_json(self) -> Json:
        return {
            "id": self.id,
            "key": self.key,
            "kind": self.kind,
            "target": self.target,
            "state": self.state,
            "late": self.late,
            "replay": self.replay,
            "fingerprint": self.fingerprint,
            "attempt": self.attempt,
            "deadline": self.deadline,
            "created": self.created,
            "updated": self.updated,
            "url": f"{URL}/effects/{self.id}/",
        }

    def detail(self, decision: str, reason: str) -> Json:
        """The effect as `GET /api/v1/effects?key=` answers it."""
        intent = self.intent
        grant = (intent.get("authority") or {}).get("grant")
        return {
            "effect": self.to_json(),
            "request": intent.get("request"),
            "payload_pruned": None,
            "authority": intent.get("authority"),
            "amount": _amount(intent.get("amount")),
            "grant": _grant(grant, intent.get("amount")) if type(grant) is int else None,
            "attempts": self.attempts,
            "receipts": self.receipts,
            "cases": self.cases,
            "decision": decision,
            "reason": reason,
            "run_id": intent.get("run_id"),
            "tool_span_id": None,
            "model_span_id": None,
        }

    def case(self, reason: str) -> Json | None:
        return next((c for c in self.cases if c["reason"] == reason), None)


class FakeServer:
    """The ledger's decision table in memory, answering the SDK as the HTTP API would."""

    url = URL
    timeout = 1.0
    retry = Retry(retries=0)

    def __init__(self, *, approval: tuple[str, ...] = (), denied: tuple[str, ...] = ()) -> None:
        self.approval, self.denied = approval, denied
        self.effects: dict[str, FakeEffect] = {}
        self.closed_cases: list[Json] = []
        self.orphans: list[Json] = []  # receipts for a key no intent recorded
        self.events: dict[str, Json] = {}  # run and span events by id, as received
        self.runs: dict[str, str] = {}  # the runs' latest status, from their run events
        self._ids = 0
        self._lock = threading.Lock()

    # -- what an operator does on the desk -------------------------------------------------

    def state(self, key: str) -> str:
        return self.effects[key].state

    def open_cases(self, key: str) -> list[str]:
        """The reasons of the effect's open cases."""
        return [case["reason"] for case in self.effects[key].cases]

    def settle(self, key: str, *, happened: bool, external_id: str = "operator") -> None:
        """An operator's verdict on an effect in doubt."""
        with self._lock:
            effect = self._in(key, "timed_out")
            if happened:
                effect.receipts.append(
                    self._receipt(key, "operator", external_id, "operator_attested")
                )
            effect.state = "succeeded" if happened else "not_happened"
            self._close(effect, "uncertain")

    def abandon(self, key: str) -> None:
        with self._lock:
            effect = self._in(key, "timed_out", "succeeded")
            effect.state = "abandoned"
            effect.cases.clear()

    def approve(self, key: str, *, approve: bool = True) -> None:
        with self._lock:
            effect = self._in(key, "awaiting_approval")
            effect.state = "pending" if approve else "denied"
            self._close(effect, "approval_required")

    # -- the API -----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: Retry | None = None,
        budget: float | None = None,
    ) -> Response:
        # Through JSON, as over HTTP: nothing the client keeps is shared with the ledger.
        body = json.loads(json.dumps(body))
        with self._lock:
            if method == "GET" and path.startswith("/api/v1/effects?key="):
                return self._status(unquote(path.split("=", 1)[1]))
            handler = {
                "/api/v1/intents": self._intent,
                "/api/v1/receipts": self._receipt_in,
                "/api/v1/failures": self._failure,
                "/api/v1/timeouts": self._timeout,
                "/api/v1/events": self._events_in,
            }.get(path.removesuffix("/batch") if path in BATCHES else path)
            if method != "POST" or handler is None:
                return Response(404, {"error": f"the fake has no {method} {path}"})
            if path in BATCHES:
                return self._batch(path, body, handler)
            if (refused := _refused(path, body)) is not None:
                return refused
            return handler(body)

    def _batch(self, path: str, body: Any, handler: Callable[[Json], Response]) -> Response:
        """A batch of reports: each answered as its single route would, in order (207); the
        batch itself refused (400) only when it is no batch of 1 to MAX_BATCH items."""
        items = body.get(BATCHES[path]) if isinstance(body, dict) else None
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH or len(body) != 1:
            fields = {BATCHES[path]: f"A list of 1 to {MAX_BATCH} items"}
            return Response(400, {"error": "Invalid request", "fields": fields})
        single = path.removesuffix("/batch")
        results = []
        for index, item in enumerate(items):
            answer = _refused(single, item) or handler(item)
            results.append({"index": index, "status": answer.status, "body": answer.body})
        return Response(207, {"results": results})

    def _events_in(self, body: Json) -> Response:
        """Run and span events: each stored, a duplicate (an id seen before) or rejected on
        its own (207), as the server answers them."""
        events = body["events"]
        if not isinstance(events, list) or not 1 <= len(events) <= MAX_EVENTS:
            fields = {"events": f"A list of 1 to {MAX_EVENTS} events"}
            return Response(400, {"error": "Invalid request", "fields": fields})
        counts = dict.fromkeys(("stored", "duplicate", "rejected"), 0)
        results: list[Json] = []
        for index, event in enumerate(events):
            event_id = event.get("id") if isinstance(event, dict) else None
            result: Json = {"index": index, "id": event_id if isinstance(event_id, str) else None}
            if (problem := _event_problem(event)) is not None:
                result |= {"status": 400, "result": "rejected", **problem}
            elif event["id"] in self.events:
                result |= {"status": 200, "result": "duplicate"}
            else:
                self.events[event["id"]] = event
                if event["type"] == "run" and event.get("status"):
                    self.runs[event["run_id"]] = event["status"]
                result |= {"status": 201, "result": "stored"}
            counts[result["result"]] += 1
            results.append(result)
        return Response(
            207,
            {
                "stored": counts["stored"],
                "duplicates": counts["duplicate"],
                "rejected": counts["rejected"],
                "results": results,
            },
        )

    def close(self) -> None:
        """Nothing to close: the transport's interface."""

    def _intent(self, intent: Json) -> Response:
        key = intent["key"]
        fingerprint = intent.get("fingerprint") or _fingerprint(intent.get("request"))
        claim = _claim(intent)
        effect = self.effects.get(key)
        if effect is None:
            effect = self.effects[key] = FakeEffect(
                id=self._next_id(),
                key=key,
                kind=intent["kind"],
                target=intent["target"],
                fingerprint=fingerprint,
                claim=claim,
                intent=intent,
                replay=intent.get("replay", "never"),
                state="pending",
            )
            if intent["kind"] in self.denied:
                effect.state = "denied"
                return self._answer(201, "denied", effect, self._open(effect, "authority_denied"))
            if intent["kind"] in self.approval:
                effect.state = "awaiting_approval"
                case = self._open(effect, "approval_required")
                return self._answer(201, "wait", effect, case)
            self._attempt(effect, intent)
            return self._answer(201, "proceed", effect)
        if effect.fingerprint != fingerprint or _fingerprint(effect.claim) != _fingerprint(claim):
            return self._conflict(effect, fingerprint, claim)
        if effect.state == "pending":
            if effect.attempt == 0 or (intent.get("worker") and intent["worker"] == effect.worker):
                if effect.attempt == 0:
                    self._attempt(effect, intent)
                return self._answer(200, "proceed", effect)
            if intent.get("run_id") and intent["run_id"] == effect.run_id and effect.worker:
                # The same run resumed in another process: the attempt was interrupted.
                effect.state = "timed_out"
                self._open(effect, "uncertain")
        if effect.state in ("failed", "not_happened") or (
            effect.state == "timed_out" and effect.replay in RETRYABLE_AFTER_TIMEOUT
        ):
            effect.state, effect.late = "pending", False
            self._close(effect, "uncertain")
            self._attempt(effect, intent)
            return self._answer(200, "proceed", effect)
        return self._answer(200, *self._decide(effect))

    def _conflict(self, effect: FakeEffect, fingerprint: str, claim: Json) -> Response:
        """What was checked and approved is the first intent's request and claim: a later
        intent that differs in either is not performed (the server's words)."""
        differs = [k for k, v in effect.claim.items() if v != claim[k]]
        request = effect.fingerprint != fingerprint
        # As on the server: claims alike as values but not as JSON differ in authority.
        what = ", ".join(differs + ["request"] * request) or "authority"
        summary = f"Key {effect.key!r} was reused with a different {what}."
        case = self._open(effect, "key_reuse_conflict", summary=summary)
        reason = (
            f"Key {effect.key!r} was first recorded with a different {what}"
            + (
                f" (fingerprint {effect.fingerprint[:12]}…, this one {fingerprint[:12]}…)"
                if request
                else ""
            )
            + "; do not perform it: what was checked and approved is the first intent's "
            "request and claim. Give a different effect its own key."
        )
        return self._answer(409, "conflict", effect, case, reason=reason)

    def _decide(self, effect: FakeEffect) -> tuple[str, FakeEffect, Json | None]:
        if effect.state == "succeeded":
            return "completed", effect, None
        if effect.state in ("failed", "not_happened"):
            return "proceed", effect, None
        if effect.state == "timed_out":
            if effect.replay in RETRYABLE_AFTER_TIMEOUT:
                return "proceed", effect, effect.case("uncertain")
            return "wait", effect, effect.case("uncertain") or self._open(effect, "uncertain")
        if effect.state == "pending":
            return ("proceed" if effect.attempt == 0 else "wait"), effect, None
        if effect.state == "awaiting_approval":
            return "wait", effect, effect.case("approval_required")
        return "denied", effect, None

    def _receipt_in(self, receipt: Json) -> Response:
        key, system, external_id = receipt["key"], receipt["system"], receipt["external_id"]
        effect = self.effects.get(key)
        known = effect.receipts if effect else [r for r in self.orphans if r["key"] == key]
        same = next(
            (r for r in known if (r["system"], r["external_id"]) == (system, external_id)), None
        )
        if same is not None:
            effect_json = effect.to_json() if effect else None
            answer: Json = {"receipt": same, "effect": effect_json, "case": None, "created": False}
            return Response(200, answer)
        row = self._receipt(key, system, external_id, "agent_reported", receipt)
        if effect is None:
            self.orphans.append(row)
            orphan = self._case(
                "orphan_receipt",
                "high",
                f"A receipt from {system} ({external_id}) names key {key!r}, which no intent "
                "has recorded.",
            )
            return Response(201, {"receipt": row, "effect": None, "case": orphan, "created": True})
        case: Json | None = None
        if effect.state == "pending":
            effect.state = "succeeded"
        elif effect.state in LATE_FROM:
            row["late"] = effect.late = True
            effect.state = "succeeded"
            self._close(effect, "uncertain")
            case = self._open(effect, "late_success")
        elif effect.state in ("succeeded", "compensated"):
            case = self._open(effect, "duplicate_effect", severity="critical")
        else:
            case = self._open(effect, "unauthorized_effect", severity="critical")
        effect.receipts.append(row)
        return Response(
            201, {"receipt": row, "effect": effect.to_json(), "case": case, "created": True}
        )

    def _failure(self, failure: Json) -> Response:
        return self._report(failure["key"], "failed" if failure.get("definitive") else "timed_out")

    def _timeout(self, timeout: Json) -> Response:
        return self._report(timeout["key"], "timed_out")

    def _report(self, key: str, target: str) -> Response:
        """A failure or a timeout the agent reports: 404 for an unknown key, 409 where the
        effect's state refuses it."""
        effect = self.effects.get(key)
        if effect is None:
            return Response(
                404, {"error": f"no effect has the key {key!r}", "fields": {"key": "Unknown"}}
            )
        case = effect.case("uncertain") if target == "timed_out" else None
        if effect.state == target:
            return Response(200, {"effect": effect.to_json(), "case": case, "changed": False})
        if effect.state != "pending":
            return Response(409, {"error": f"effect {effect.key!r} is {effect.state}"})
        effect.state = target
        if target == "timed_out":
            case = self._open(effect, "uncertain")
        return Response(200, {"effect": effect.to_json(), "case": case, "changed": True})

    def _status(self, key: str) -> Response:
        effect = self.effects.get(key)
        if effect is None:
            return Response(404, {"error": f"no effect has the key {key!r}"})
        decision, _, _ = self._decide(effect)
        return Response(
            200, effect.detail(decision, f"The fake's decision for a {effect.state} effect.")
        )

    # -- bookkeeping -------------------------------------------------------------------------

    def _answer(
        self,
        status: int,
        decision: str,
        effect: FakeEffect,
        case: Json | None = None,
        *,
        reason: str | None = None,
    ) -> Response:
        receipt = effect.receipts[0] if decision == "completed" and effect.receipts else None
        return Response(
            status,
            {
                "decision": decision,
                "reason": reason or f"The fake's decision for a {effect.state} effect.",
                "effect": effect.to_json(),
                "receipt": receipt,
                "case": case,
            },
        )

    def _attempt(self, effect: FakeEffect, intent: Json) -> None:
        effect.attempt += 1
        effect.worker, effect.run_id = intent.get("worker"), intent.get("run_id")
        started = datetime.now(timezone.utc)
        timeout_s = intent.get("timeout_s")
        effect.deadline = (
            (started + timedelta(seconds=timeout_s)).isoformat() if timeout_s else None
        )
        effect.attempts.append(
            {
                "number": effect.attempt,
                "started": started.isoformat(),
                "deadline": effect.deadline,
                "context": intent.get("context") or {},
                "run_id": intent.get("run_id") or "",
                "worker": intent.get("worker") or "",
                "trace_id": intent.get("trace_id") or "",
                "span_id": intent.get("span_id") or "",
            }
        )

    def _open(
        self, effect: FakeEffect, reason: str, *, severity: str = "high", summary: str = ""
    ) -> Json:
        case = effect.case(reason)
        if case is None:
            case = self._case(
                reason, severity, summary or f"{reason.replace('_', ' ')}: {effect.key}"
            )
            effect.cases.append(case)
        return case

    def _case(self, reason: str, severity: str, summary: str) -> Json:
        case_id = self._next_id()
        return {
            "id": case_id,
            "reason": reason,
            "severity": severity,
            "summary": summary,
            "opened": _now(),
            "closed": None,
            "url": f"{URL}/cases/{case_id}/",
        }

    def _close(self, effect: FakeEffect, reason: str) -> None:
        if (case := effect.case(reason)) is not None:
            effect.cases.remove(case)
            case["closed"] = _now()
            self.closed_cases.append(case)

    def _receipt(
        self, key: str, system: str, external_id: str, strength: str, given: Json | None = None
    ) -> Json:
        given = given or {}
        return {
            "id": self._next_id(),
            "key": key,
            "system": system,
            "external_id": external_id,
            "observed_at": given.get("observed_at"),
            "data": given.get("data"),
            "strength": strength,
            "attempt": given.get("attempt"),
            "trace_id": given.get("trace_id") or "",
            "span_id": given.get("span_id") or "",
            "late": False,
            "received": _now(),
            "amount": _amount(given.get("amount")),
            "target": given.get("target"),
        }

    def _in(self, key: str, *states: str) -> FakeEffect:
        effect = self.effects[key]
        if effect.state not in states:
            raise ValueError(f"effect {key!r} is {effect.state}, not {' or '.join(states)}")
        return effect

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids


def _event_problem(event: Any) -> Json | None:
    """Why the server would reject this event (its error and fields); None when it takes it."""
    if not isinstance(event, dict):
        return {"error": "An event must be an object", "fields": {"": "Expected an object"}}
    kind = event.get("type")
    requires = EVENT_REQUIRES.get(kind) if isinstance(kind, str) else None
    if requires is None:
        return {"error": "Unknown event type", "fields": {"type": "Expected 'run' or 'span'"}}
    fields = {name: "This field is required" for name in ("id", *requires) if name not in event}
    return {"error": "Invalid event", "fields": fields} if fields else None


def _refused(path: str, body: Any) -> Response | None:
    """The server's 400 for a body without a field it requires or with one it does not take;
    None for a body it takes (the fields' values are the caller's to get right)."""
    if not isinstance(body, dict):
        return Response(
            400,
            {"error": "The body must be a JSON object", "fields": {"body": "Expected an object"}},
        )
    required, optional = TAKES[path]
    fields = {name: "This field is required" for name in required if name not in body}
    fields |= {name: "Unknown field" for name in body if name not in required + optional}
    return Response(400, {"error": "Invalid request", "fields": fields}) if fields else None


def _amount(amount: Json | None) -> Json | None:
    """An amount as the server answers it: its value normalised ("50.00" is "50")."""
    if not amount:
        return None
    return {"value": f"{Decimal(amount['value']).normalize():f}", "currency": amount["currency"]}


def _grant(grant_id: int, amount: Json | None) -> Json:
    """The grant `grant_id` as an effect's detail shows it: the fake grants any, unlimited."""
    return {
        "id": grant_id,
        "name": f"grant {grant_id}",
        "version": 1,
        "currency": amount["currency"] if amount else "",
        "max_amount": None,
        "max_daily_amount": None,
        "targets": ["*"],
        "url": f"{URL}/authority/grants/{grant_id}/",
    }


def _claim(intent: Json) -> Json:
    """What an intent claims besides its request, as the server compares it: "50" and
    "50.00" EUR are one amount."""
    amount = _amount(intent.get("amount"))
    return {
        "kind": intent["kind"],
        "target": intent["target"],
        "authority": intent.get("authority"),
        "amount": f"{amount['value']} {amount['currency']}" if amount else None,
    }


def _fingerprint(request: Any) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Fake:
    """The client's configuration, with the fake for a server and a spool of its own."""

    fake: FakeServer
    _given: Given

    def _configure(self) -> Config:
        # Removed with the client; the fake's receipts are in memory anyway once sent.
        self._spool_dir = tempfile.TemporaryDirectory(prefix="tallybook-fake-")
        spool = Spool(Path(self._spool_dir.name))
        return Config(self.fake, spool, self._given.fail_open, self._given.intent_budget)


class FakeTallybook(_Fake, Tallybook):
    """A `Tallybook` whose server is a `FakeServer` (`tb.fake`)."""

    def __init__(self, fake: FakeServer | None = None, **options: Any) -> None:
        super().__init__(URL, "tb_fake", **options)
        self.fake = fake or FakeServer()


class FakeAsyncTallybook(_Fake, AsyncTallybook):
    """An `AsyncTallybook` whose server is a `FakeServer` (`tb.fake`)."""

    def __init__(self, fake: FakeServer | None = None, **options: Any) -> None:
        super().__init__(URL, "tb_fake", **options)
        self.fake = fake or FakeServer()
