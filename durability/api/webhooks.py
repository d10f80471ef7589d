"""Signed provider webhooks: POST /hooks/<source>/ turns a verified delivery into
`provider_confirmed` receipts (docs/webhooks.md).

A delivery is checked before anything is read from it: the HMAC-SHA256 signature with
the source's secret, then (generic sources) the signed timestamp against the replay
window. A delivery id already seen is answered as a duplicate and changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from durability.api.decorators import MiB, Refused, answer, body_within, error, field_errors
from durability.api.schemas import CaseOut, EffectOut, HookDeliveryOut, HookReceiptOut, ReceiptIn
from durability.ledger import evidence
from durability.models import Strength, WebhookDelivery, WebhookKind, WebhookSource

SIGNATURE = {
    WebhookKind.GENERIC: "X-Tallybook-Signature",
    WebhookKind.GITHUB: "X-Hub-Signature-256",
}
DELIVERY = {WebhookKind.GENERIC: "X-Tallybook-Delivery", WebhookKind.GITHUB: "X-GitHub-Delivery"}
TIMESTAMP = "X-Tallybook-Timestamp"
GITHUB_EVENT = "X-GitHub-Event"
DEFAULT_TRAILER = "Tallybook-Key"
# Fields a generic source's mapping may name, each a dotted path into the payload.
GENERIC_FIELDS = ("key", "external_id", "observed_at", "amount", "currency", "target")


class Rejected(Exception):
    """A delivery refused, with the status and the message its sender gets."""

    def __init__(self, status: int, message: str, fields: dict[str, str] | None = None) -> None:
        self.status, self.message, self.fields = status, message, fields
        super().__init__(message)


def signature_of(secret: str, body: bytes, timestamp: str | None = None) -> str:
    """`sha256=<hex>` over the raw body, prefixed by `<timestamp>.` when there is one, so
    that a captured delivery cannot be replayed under a fresh timestamp."""
    signed = body if timestamp is None else timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify(source: WebhookSource, headers: Mapping[str, str], body: bytes, now: float) -> str:
    """Check the signature (and for generic sources the replay window); the delivery id."""
    given = headers.get(SIGNATURE[WebhookKind(source.kind)], "")
    timestamp = None
    if source.kind == WebhookKind.GENERIC:
        timestamp = headers.get(TIMESTAMP, "")
        if not timestamp.isdigit():
            raise Rejected(401, f"{TIMESTAMP} must be the Unix time the delivery was signed")
    if not hmac.compare_digest(
        given.encode(), signature_of(source.secret, body, timestamp).encode()
    ):
        raise Rejected(401, "Bad signature")
    # The header is whole seconds: so is the comparison, the window the same on both sides.
    if timestamp is not None and abs(int(now) - int(timestamp)) > source.tolerance_s:
        raise Rejected(401, f"Timestamp outside the {source.tolerance_s} s replay window")
    header = DELIVERY[WebhookKind(source.kind)]
    delivery = headers.get(header, "")
    if len(delivery) > 255:
        raise Rejected(400, "Delivery id over 255 characters", {header: "Too long"})
    # Without a delivery id, identical bodies are one delivery.
    return delivery or hashlib.sha256(body).hexdigest()


def _at(payload: Any, path: str) -> Any:
    """The value at a dotted path (`data.items.0.id`), or None."""
    value = payload
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    raise ValueError("expected ISO 8601 or Unix seconds")


def _amount(value: Any, currency: Any, exponent: int) -> dict[str, str] | None:
    """The mapped amount as the API's {value, currency}; `exponent` scales minor units."""
    if value is None:
        return None
    try:
        scaled = Decimal(str(value)).scaleb(-exponent)
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a number") from exc
    return {"value": f"{scaled:f}", "currency": str(currency or "").upper()}


def _receipt(fields: dict[str, Any]) -> ReceiptIn:
    try:
        return ReceiptIn.model_validate(fields, strict=False)
    except ValidationError as exc:
        raise Rejected(422, "The payload does not map to a receipt", field_errors(exc)) from exc


def _generic(source: WebhookSource, payload: Any, delivery: str) -> list[ReceiptIn]:
    mapping: dict[str, Any] = source.mapping
    found = {name: _at(payload, mapping[name]) for name in GENERIC_FIELDS if mapping.get(name)}
    try:
        observed_at = _time(found.get("observed_at"))
        amount = _amount(found.get("amount"), found.get("currency"), mapping.get("exponent", 0))
    except ValueError as exc:
        raise Rejected(422, f"The payload does not map to a receipt: {exc}") from exc
    fields = {
        "key": found.get("key"),
        "system": source.system,
        "external_id": None if found.get("external_id") is None else str(found["external_id"]),
        "observed_at": observed_at,
        "amount": amount,
        "target": found.get("target"),
        "data": {"source": source.name, "delivery": delivery},
    }
    return [_receipt({k: v for k, v in fields.items() if v is not None})]


def _trailer(message: str, name: str) -> str | None:
    """The value of a `Name: value` trailer line of a commit message."""
    match = re.search(rf"^{re.escape(name)}:[ \t]*(\S.*?)\s*$", message, re.MULTILINE)
    return match.group(1) if match else None


def _github(
    source: WebhookSource, payload: Any, headers: Mapping[str, str], delivery: str
) -> tuple[list[ReceiptIn], int]:
    """One receipt per pushed commit whose message names its effect in a trailer."""
    if headers.get(GITHUB_EVENT) != "push":
        return [], 0
    trailer = source.mapping.get("trailer", DEFAULT_TRAILER)
    repository = _at(payload, "repository.full_name")
    receipts, ignored = [], 0
    commits = _at(payload, "commits")
    for commit in commits if isinstance(commits, list) else []:
        if not isinstance(commit, dict):
            raise Rejected(422, "Every commit of a push must be an object")
        key = _trailer(str(commit.get("message", "")), trailer)
        if key is None:
            ignored += 1
            continue
        try:
            observed_at = _time(commit.get("timestamp"))
        except ValueError as exc:
            raise Rejected(422, f"Commit {commit.get('id')}: bad timestamp: {exc}") from exc
        receipts.append(
            _receipt(
                {
                    "key": key,
                    "system": source.system,
                    "external_id": commit.get("id"),
                    "observed_at": observed_at,
                    "target": repository,
                    "data": {
                        "source": source.name,
                        "delivery": delivery,
                        "ref": payload.get("ref"),
                        "url": commit.get("url"),
                    },
                }
            )
        )
    return receipts, ignored


@dataclass
class DeliveryOutcome:
    delivery: WebhookDelivery
    outcomes: list[evidence.ReceiptOutcome]
    duplicate: bool


def webhook_receive(
    *, source: WebhookSource, delivery_id: str, receipts: list[ReceiptIn], ignored: int
) -> DeliveryOutcome:
    """Record a verified delivery once and its receipts as provider-confirmed evidence.

    All in one transaction: a delivery is either stored with every receipt or not at
    all. Receipts are recorded in key order, so concurrent deliveries lock effects in
    the same order.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                delivery = WebhookDelivery.objects.create(
                    source=source,
                    delivery_id=delivery_id,
                    receipts=len(receipts),
                    ignored=ignored,
                )
        except IntegrityError:
            seen = WebhookDelivery.objects.get(source=source, delivery_id=delivery_id)
            return DeliveryOutcome(seen, [], duplicate=True)
        outcomes = [
            evidence.receipt_record(
                project=source.project,
                actor=f"webhook:{source.name}",
                receipt=receipt,
                strength=Strength.PROVIDER_CONFIRMED,
            )
            for receipt in sorted(receipts, key=lambda r: r.key)
        ]
    return DeliveryOutcome(delivery, outcomes, duplicate=False)


@csrf_exempt
@require_POST
def hook(request: HttpRequest, name: str) -> JsonResponse:
    source = WebhookSource.objects.select_related("project").filter(name=name, enabled=True).first()
    if source is None:
        return error("No such webhook source", 404)
    try:
        body = body_within(request, MiB)
    except Refused as refused:
        return refused.response
    try:
        delivery_id = verify(source, request.headers, body, time.time())
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Rejected(400, "Malformed JSON", {"body": str(exc)}) from exc
        if source.kind == WebhookKind.GITHUB:
            receipts, ignored = _github(source, payload, request.headers, delivery_id)
        else:
            receipts, ignored = _generic(source, payload, delivery_id), 0
    except Rejected as exc:
        return error(exc.message, exc.status, exc.fields)
    outcome = webhook_receive(
        source=source, delivery_id=delivery_id, receipts=receipts, ignored=ignored
    )
    return answer(
        HookDeliveryOut(
            delivery=delivery_id,
            duplicate=outcome.duplicate,
            receipts=[
                HookReceiptOut(
                    key=o.receipt.key,
                    external_id=o.receipt.external_id,
                    created=o.created,
                    effect=EffectOut.of(o.effect) if o.effect else None,
                    case=CaseOut.of(o.case) if o.case else None,
                )
                for o in outcome.outcomes
            ],
            ignored=ignored,
        ),
        200 if outcome.duplicate else 201,
    )
