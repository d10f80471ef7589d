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
approvals are given with `tb.fake.approve(key)`. Tallybook's own tests run one
table of cases against this fake and the real server, so the two agree.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
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


@dataclass
class FakeEffect:
    id: int
    key: str
    kind: str
    target: str
    fingerprint: str
    claim: Json  # the first intent's kind, target, authority and amount (`_claim`)
    replay: str
    state: str
    attempt: int = 0
    worker: str | None = None
    run_id: str | None = None
    late: bool = False
    receipts: list[Json] = field(default_factory=list)
    cases: list[Json] = field(default_factory=list)  # open ones

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
            "url": f"{URL}/effects/{self.id}/",
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
            }.get(path)
            if method != "POST" or handler is None:
                return Response(404, {"error": f"the fake has no {method} {path}"})
            return handler(body)

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
        known = effect.receipts if effect else []
        same = next(
            (r for r in known if (r["system"], r["external_id"]) == (system, external_id)), None
        )
        if same is not None:
            return Response(200, {"receipt": same, "created": False})
        row = self._receipt(key, system, external_id, "agent_reported", receipt)
        if effect is None:
            return Response(201, {"receipt": row, "effect": None, "created": True})
        if effect.state == "pending":
            effect.state = "succeeded"
        elif effect.state in LATE_FROM:
            row["late"] = effect.late = True
            effect.state = "succeeded"
            self._close(effect, "uncertain")
            self._open(effect, "late_success")
        elif effect.state in ("succeeded", "compensated"):
            self._open(effect, "duplicate_effect", severity="critical")
        else:
            self._open(effect, "unauthorized_effect", severity="critical")
        effect.receipts.append(row)
        return Response(201, {"receipt": row, "effect": effect.to_json(), "created": True})

    def _failure(self, failure: Json) -> Response:
        effect = self.effects.get(failure["key"])
        if effect is None:
            return Response(404, {"error": f"no effect has the key {failure['key']!r}"})
        target = "failed" if failure.get("definitive") else "timed_out"
        if effect.state == target:
            return Response(200, {"effect": effect.to_json(), "changed": False})
        if effect.state != "pending":
            return Response(409, {"error": f"effect {effect.key!r} is {effect.state}"})
        effect.state = target
        if target == "timed_out":
            self._open(effect, "uncertain")
        return Response(200, {"effect": effect.to_json(), "changed": True})

    def _status(self, key: str) -> Response:
        effect = self.effects.get(key)
        if effect is None:
            return Response(404, {"error": f"no effect has the key {key!r}"})
        decision, _, _ = self._decide(effect)
        return Response(
            200,
            {
                "decision": decision,
                "reason": f"The fake's decision for a {effect.state} effect.",
                "effect": effect.to_json(),
                "receipts": effect.receipts,
                "cases": effect.cases,
            },
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

    def _open(
        self, effect: FakeEffect, reason: str, *, severity: str = "high", summary: str = ""
    ) -> Json:
        case = effect.case(reason)
        if case is None:
            case_id = self._next_id()
            case = {
                "id": case_id,
                "reason": reason,
                "severity": severity,
                "summary": summary or f"{reason.replace('_', ' ')}: {effect.key}",
                "opened": datetime.now(timezone.utc).isoformat(),
                "closed": None,
                "url": f"{URL}/cases/{case_id}/",
            }
            effect.cases.append(case)
        return case

    def _close(self, effect: FakeEffect, reason: str) -> None:
        if (case := effect.case(reason)) is not None:
            effect.cases.remove(case)
            case["closed"] = datetime.now(timezone.utc).isoformat()
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
            "late": False,
            "received": datetime.now(timezone.utc).isoformat(),
        }

    def _in(self, key: str, *states: str) -> FakeEffect:
        effect = self.effects[key]
        if effect.state not in states:
            raise ValueError(f"effect {key!r} is {effect.state}, not {' or '.join(states)}")
        return effect

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids


def _claim(intent: Json) -> Json:
    """What an intent claims besides its request, as the server compares it: "50" and
    "50.00" EUR are one amount."""
    amount = intent.get("amount")
    return {
        "kind": intent["kind"],
        "target": intent["target"],
        "authority": intent.get("authority"),
        "amount": f"{Decimal(amount['value']).normalize():f} {amount['currency']}"
        if amount
        else None,
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
