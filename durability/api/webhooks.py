"""Signed provider webhooks: POST /hooks/<source>/ turns a verified delivery into
`provider_confirmed` receipts (docs/webhooks.md).

A delivery is checked before anything is read from it: the HMAC-SHA256 signature with
the source's secret, then (generic sources) the signed timestamp against the replay
window. A delivery already received, by its delivery id or by its signed bytes under
another id (a replay), is answered as a duplicate and changes nothing. Its body then
passes the checks every entrance makes (`durability.inbound`), and is mapped to receipts
all or nothing: one item that does not map refuses the whole delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from durability import inbound, redaction
from durability.api.commands import receipt_of
from durability.api.decorators import MiB, Refused, answer, body_within, error, field_errors
from durability.api.schemas import CaseOut, EffectOut, HookDeliveryOut, HookReceiptOut, ReceiptIn
from durability.ledger import evidence
from durability.ledger.commands import ReceiptEvidence
from durability.models import (
    GONE_UNDER_A_WRITE,
    Strength,
    WebhookDelivery,
    WebhookKind,
    WebhookSource,
    project_gone,
)

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
# What the API's Money holds: the bounds are checked before the sum is ever written out,
# since formatting 1e999999999 in full would take a gigabyte.
MAX_INTEGER_DIGITS, MAX_DECIMALS = 14, 6


class Rejected(Exception):
    """A delivery refused, with the status and the message its sender gets."""

    def __init__(self, status: int, message: str, fields: dict[str, str] | None = None) -> None:
        self.status, self.message, self.fields = status, message, fields
        super().__init__(message)


@dataclass(frozen=True)
class Verified:
    """A verified delivery: the id its headers give it (any secret in it replaced by its
    digest), and the digest of its signed bytes, which no header can change."""

    delivery: str
    digest: str


def _signed_bytes(body: bytes, timestamp: str | None) -> bytes:
    return body if timestamp is None else timestamp.encode() + b"." + body


def signature_of(secret: str, body: bytes, timestamp: str | None = None) -> str:
    """`sha256=<hex>` over the raw body, prefixed by `<timestamp>.` when there is one, so
    that a captured delivery cannot be replayed under a fresh timestamp."""
    signed = _signed_bytes(body, timestamp)
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify(source: WebhookSource, headers: Mapping[str, str], body: bytes, now: float) -> Verified:
    """Check the signature (and for generic sources the replay window)."""
    given = headers.get(SIGNATURE[WebhookKind(source.kind)], "")
    timestamp, signed_at = None, 0
    if source.kind == WebhookKind.GENERIC:
        timestamp = headers.get(TIMESTAMP, "")
        try:
            signed_at = inbound.decimal_digits(timestamp)
        except ValueError:
            raise Rejected(
                401, f"{TIMESTAMP} must be the Unix time the delivery was signed"
            ) from None
    if not hmac.compare_digest(
        given.encode(), signature_of(source.secret, body, timestamp).encode()
    ):
        raise Rejected(401, "Bad signature")
    # The header is whole seconds: so is the comparison, the window the same on both sides.
    if timestamp is not None and abs(int(now) - signed_at) > source.tolerance_s:
        raise Rejected(401, f"Timestamp outside the {source.tolerance_s} s replay window")
    header = DELIVERY[WebhookKind(source.kind)]
    delivery = headers.get(header, "")
    if len(delivery) > 255:
        raise Rejected(400, "Delivery id over 255 characters", {header: "Too long"})
    try:
        inbound.storable_text(delivery)
    except ValueError as exc:
        raise Rejected(400, "Delivery id cannot be stored", {header: str(exc)}) from None
    digest = hashlib.sha256(_signed_bytes(body, timestamp)).hexdigest()
    # Without a delivery id, identical bodies are one delivery. With one, a secret in it is
    # replaced by its digest before it is looked up, stored or answered, as in any identity.
    if delivery:
        delivery = redaction.distinct(delivery, redaction.extras_of(source.project))
    return Verified(delivery or hashlib.sha256(body).hexdigest(), digest)


def _amount(value: Any, currency: Any, exponent: int) -> dict[str, Any] | None:
    """The mapped amount as the API's {value, currency}; `exponent` scales minor units."""
    if value is None:
        return None
    try:
        number = Decimal(str(value))  # str(True) and str([1]) are not numbers either
    except InvalidOperation:
        raise ValueError(f"{value!r:.40} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"{value!r:.40} is not a number")
    if number.adjusted() - exponent >= MAX_INTEGER_DIGITS:
        raise ValueError(f"more than {MAX_INTEGER_DIGITS} digits before the decimal point")
    if int(number.as_tuple().exponent) - exponent < -MAX_DECIMALS:
        raise ValueError(f"more than {MAX_DECIMALS} decimals")
    return {
        "value": f"{number.scaleb(-exponent):f}",
        "currency": currency.upper() if isinstance(currency, str) else currency,
    }


def _text(value: Any) -> str | None:
    """Text from the payload that is stored as is, in a receipt's data."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("expected text")
    return inbound.storable_text(value)


def _receipt(fields: dict[str, Any], paths: Mapping[str, str]) -> ReceiptEvidence:
    """The receipt `fields` describe, or a 422 naming each bad field by its path in the
    payload (`paths`: receipt field -> payload path), which is what its sender knows."""
    try:
        return receipt_of(
            ReceiptIn.model_validate(
                {k: v for k, v in fields.items() if v is not None}, strict=False
            )
        )
    except ValidationError as exc:
        errors = {paths.get(loc, loc): message for loc, message in field_errors(exc).items()}
        raise Rejected(422, "The payload does not map to a receipt", errors) from exc


def _mapped[T](paths: Mapping[str, str], field: str, convert: Callable[..., T], *args: Any) -> T:
    """`convert(*args)`, or a 422 naming `field`'s path when it raises ValueError."""
    try:
        return convert(*args)
    except ValueError as exc:
        path = paths.get(field, field)
        raise Rejected(422, "The payload does not map to a receipt", {path: str(exc)}) from None


def _generic(source: WebhookSource, payload: Any, delivery: str) -> list[ReceiptEvidence]:
    mapping: dict[str, Any] = source.mapping
    paths = {name: mapping[name] for name in GENERIC_FIELDS if mapping.get(name)}
    found = {name: inbound.json_path(payload, path) for name, path in paths.items()}
    paths |= {
        "amount.value": paths.get("amount", "amount"),
        "amount.currency": paths.get("currency", "currency"),
    }
    external_id = found.get("external_id")
    if isinstance(external_id, int) and not isinstance(external_id, bool):
        external_id = str(external_id)  # a provider's numeric id, taken as text
    amount = _mapped(
        paths,
        "amount",
        _amount,
        found.get("amount"),
        found.get("currency"),
        mapping.get("exponent", 0),
    )
    fields = {
        "key": found.get("key"),
        "system": source.system,
        "external_id": external_id,
        "observed_at": _mapped(
            paths, "observed_at", inbound.provider_time, found.get("observed_at")
        ),
        "amount": amount,
        "target": found.get("target"),
        "data": {"source": source.name, "delivery": delivery},
    }
    return [_receipt(fields, paths)]


def _trailer(message: str, name: str) -> str | None:
    """The value of the first `Name: value` trailer line of a commit message.

    Line by line, not by a regular expression: one that backtracks over a long run of
    spaces costs the square of the line's length, and anyone who may push writes these.
    """
    for line in message.split("\n"):
        if line.startswith(name + ":"):
            value = line[len(name) + 1 :].lstrip(" \t").rstrip()
            if value and not value[0].isspace():
                return value
    return None


def _github(
    source: WebhookSource, payload: Any, headers: Mapping[str, str], delivery: str
) -> tuple[list[ReceiptEvidence], int]:
    """One receipt per pushed commit whose message names its effect in a trailer."""
    if headers.get(GITHUB_EVENT) != "push":
        return [], 0
    trailer = source.mapping.get("trailer", DEFAULT_TRAILER)
    receipts, ignored = [], 0
    commits = inbound.json_path(payload, "commits")
    for index, commit in enumerate(commits if isinstance(commits, list) else []):
        where = f"commits.{index}"
        if not isinstance(commit, dict):
            raise Rejected(
                422, "Every commit of a push must be an object", {where: "Expected an object"}
            )
        message = commit.get("message")
        key = _trailer(message, trailer) if isinstance(message, str) else None
        if key is None:
            ignored += 1
            continue
        paths = {
            "key": f"{where}.message",
            "external_id": f"{where}.id",
            "observed_at": f"{where}.timestamp",
            "target": "repository.full_name",
            "ref": "ref",
            "url": f"{where}.url",
        }
        receipts.append(
            _receipt(
                {
                    "key": key,
                    "system": source.system,
                    "external_id": commit.get("id"),
                    "observed_at": _mapped(
                        paths, "observed_at", inbound.provider_time, commit.get("timestamp")
                    ),
                    "target": inbound.json_path(payload, "repository.full_name"),
                    "data": {
                        "source": source.name,
                        "delivery": delivery,
                        "ref": _mapped(paths, "ref", _text, inbound.json_path(payload, "ref")),
                        "url": _mapped(paths, "url", _text, commit.get("url")),
                    },
                },
                paths,
            )
        )
    return receipts, ignored


@dataclass(frozen=True)
class DeliveryOutcome:
    outcomes: list[evidence.ReceiptOutcome]
    duplicate: bool
    ignored: int = 0


RECEIVED_ALREADY = DeliveryOutcome([], duplicate=True)


def webhook_receive(
    *, source: WebhookSource, verified: Verified, receipts: list[ReceiptEvidence], ignored: int
) -> DeliveryOutcome:
    """Record a verified delivery once and its receipts as provider-confirmed evidence.

    All in one transaction: a delivery is either stored with every receipt or not at
    all. Receipts are recorded in key order, so concurrent deliveries lock effects in
    the same order.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                WebhookDelivery.objects.create(
                    project_id=source.project_id,
                    source=source,
                    delivery_id=verified.delivery,
                    signed_digest=verified.digest,
                    receipts=len(receipts),
                    ignored=ignored,
                )
        except IntegrityError:
            # Received meanwhile by a concurrent request (its delivery id, or its signed
            # bytes under another id); the view asked first, for the usual case.
            return RECEIVED_ALREADY
        outcomes = [
            evidence.receipt_record(
                project=source.project,
                actor=f"webhook:{source.name}",
                receipt=receipt,
                strength=Strength.PROVIDER_CONFIRMED,
            )
            for receipt in sorted(receipts, key=lambda r: r.key)
        ]
    return DeliveryOutcome(outcomes, duplicate=False, ignored=ignored)


@csrf_exempt
@require_POST
def hook(request: HttpRequest, name: str) -> JsonResponse:
    source = WebhookSource.objects.select_related("project").filter(name=name, enabled=True).first()
    if source is None:
        return _unknown_source()
    try:
        body = body_within(request, MiB)
    except Refused as refused:
        return refused.response
    try:
        verified = verify(source, request.headers, body, time.time())
        if _received(source, verified):
            # Before the body is read: a replay is answered alike whatever headers it
            # carries (GitHub's event is not signed), even ones that would not map now.
            return _answer(verified, RECEIVED_ALREADY)
        try:
            payload = inbound.json_loads(body)
        except ValueError as exc:
            raise Rejected(400, "Malformed JSON", {"body": str(exc)}) from None
        if source.kind == WebhookKind.GITHUB:
            receipts, ignored = _github(source, payload, request.headers, verified.delivery)
        else:
            receipts, ignored = _generic(source, payload, verified.delivery), 0
    except Rejected as exc:
        return error(exc.message, exc.status, exc.fields)
    try:
        outcome = webhook_receive(
            source=source, verified=verified, receipts=receipts, ignored=ignored
        )
    except GONE_UNDER_A_WRITE:
        # The project was deleted under the delivery (its source found before it was turned
        # off): answered as its source is from now on, and nothing of it stored.
        if project_gone(source.project_id):
            return _unknown_source()
        raise
    return _answer(verified, outcome)


def _unknown_source() -> JsonResponse:
    return error("No such webhook source", 404)


def _received(source: WebhookSource, verified: Verified) -> bool:
    return WebhookDelivery.objects.filter(
        Q(delivery_id=verified.delivery) | Q(signed_digest=verified.digest),
        project_id=source.project_id,
        source=source,
    ).exists()


def _answer(verified: Verified, outcome: DeliveryOutcome) -> JsonResponse:
    return answer(
        HookDeliveryOut(
            delivery=verified.delivery,
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
            ignored=outcome.ignored,
        ),
        200 if outcome.duplicate else 201,
    )
