"""Validation schemas of the ingest API; the OpenAPI document is generated from them."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SkipValidation,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from durability.inbound import instant, unstorable_at
from durability.site import site_url

if TYPE_CHECKING:
    from durability.models import Attempt, Case, Effect, Grant, Receipt

HexTraceId = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{32}$"), Field(description="32 lowercase hex digits")
]
HexSpanId = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{16}$"), Field(description="16 lowercase hex digits")
]
Key = Annotated[
    str,
    StringConstraints(min_length=1, max_length=255),
    Field(description="The effect's stable idempotency key, unique per project."),
]
Name = Annotated[str, StringConstraints(min_length=1, max_length=100, strip_whitespace=True)]
Text = Annotated[str, StringConstraints(max_length=255)]
ReplayPolicy = Literal["never", "safe", "idempotent", "reconcile"]
DecisionName = Literal["proceed", "completed", "wait", "denied", "conflict"]
SeverityName = Literal["low", "medium", "high", "critical"]
StrengthName = Literal["agent_reported", "provider_confirmed", "operator_attested"]
GrantStatus = Literal["live", "expired", "revoked", "superseded"]


Money = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9]{1,14}(\.[0-9]{1,6})?$"),
    Field(description='A non-negative decimal as a string, e.g. "12.50".', examples=["12.50"]),
]
Currency = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Z]{3}$"),
    Field(description="ISO 4217 code, e.g. EUR", examples=["EUR"]),
]


def _not_all_zero(value: str) -> str:
    if set(value) == {"0"}:
        raise ValueError("an all-zero id is invalid")
    return value


# The document shows the rule too: a client's generator (or a fuzzer) reads it there.
NOT_ALL_ZERO: dict[str, Any] = {"not": {"pattern": "^0+$"}}
TraceId = Annotated[
    HexTraceId,
    AfterValidator(_not_all_zero),
    Field(description="32 lowercase hex digits, not all zero", json_schema_extra=NOT_ALL_ZERO),
]
SpanId = Annotated[
    HexSpanId,
    AfterValidator(_not_all_zero),
    Field(description="16 lowercase hex digits, not all zero", json_schema_extra=NOT_ALL_ZERO),
]


_DATETIME = TypeAdapter(datetime)


def _iso_time(value: Any) -> Any:
    """ISO 8601 text, parsed as strictly as in a JSON request whether the model is validated
    from JSON (the API) or from parsed objects (events), or a datetime (webhooks, probes).
    JSON has no datetime type: a number is refused, not read as Unix seconds."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("expected an ISO 8601 time as a string")
    try:
        return _DATETIME.validate_strings(value, strict=True)
    except ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"]) from None


# A time the world reported, ISO 8601, in UTC and in range (durability/inbound.py says which).
# The document states the range: the lower bound as a pattern too (a year from 2000 on, the
# first day left out for the offsets that put it in 1999); one day from now only in words.
Timestamp = Annotated[
    datetime,
    BeforeValidator(_iso_time),
    AfterValidator(instant),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "pattern": "^(?!2000-01-01)[2-9][0-9]{3}-",
            "description": "ISO 8601 with its offset; once converted to UTC, no earlier than "
            "2000-01-01 and no later than one day from now.",
        },
        mode="validation",
    ),
]


def _whole(value: Any) -> Any:
    """A whole float (30.0) as the int it is: JSON Schema's `integer`, which the document
    promises, includes it; pydantic's strict int would refuse it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# For an integer from JSON, after its bounds: refuses strings, booleans and fractions as
# strict mode does, and takes 30.0 as 30.
WHOLE = BeforeValidator(_whole)
# The widest attempt number the database column holds.
AttemptNumber = Annotated[int, Field(gt=0, le=2**31 - 1), WHOLE]


def _storable(value: Any) -> None:
    """Refuse what PostgreSQL cannot store: NUL characters, lone surrogates and non-finite
    numbers."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if (found := unstorable_at(value)) is not None:
        raise ValueError(found[2])
    if isinstance(value, float | dict | list):
        try:
            json.dumps(value, allow_nan=False, default=str)
        except ValueError:
            raise ValueError("numbers must be finite") from None


# The validation context of a document that `inbound.json_loads` read from text that
# escapes no NUL and no surrogate (`inbound.storable_strings`): none of its strings can hold
# what PostgreSQL cannot store and its numbers are finite, so its fields skip that check,
# the costliest of their validation (the API's front door passes it).
STORABLE: dict[str, Any] = {"storable": True}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _storable_values(cls, value: Any, info: ValidationInfo) -> Any:
        if info.context is not STORABLE:
            _storable(value)
        return value


class AmountIn(Strict):
    value: Money
    currency: Currency


def _grant_id(authority: dict[str, Any]) -> dict[str, Any]:
    grant = authority.get("grant")
    if grant is not None and (type(grant) is not int or grant < 1):
        raise ValueError("`grant` must be a grant's id, a positive integer")
    return authority


Authority = Annotated[
    dict[str, Any],
    AfterValidator(_grant_id),
    Field(
        description='The authority the intent claims: `{"grant": <id>}` names a grant, which '
        "the ledger checks (scope, limits, expiry, approval); other keys are stored as given. "
        "Without a grant the project's policy applies: `audit` proceeds (the authority "
        "report lists the effect), `audit_cases` proceeds and opens an `unauthorized_effect` "
        "case, `enforce` denies.",
        examples=[{"grant": 12}],
    ),
]


class Context(BaseModel):
    """What the agent ran under; free extra keys are kept."""

    model_config = ConfigDict(extra="allow", strict=True)

    workflow: Text | None = None
    workflow_version: Text | None = None
    model: Text | None = None
    code_version: Text | None = None
    tools: dict[str, str] | list[str] | None = None
    memory_digest: Text | None = None
    policy_version: Text | None = None


class IntentIn(Strict):
    key: Key
    kind: Name
    target: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    request: Any = Field(default=None, description="The effect's arguments, fingerprinted.")
    fingerprint: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = Field(
        default=None, description="The client's own request fingerprint; else SHA-256 of request."
    )
    replay: ReplayPolicy = "never"
    timeout_s: Annotated[int, Field(gt=0, le=7 * 24 * 3600), WHOLE] | None = Field(
        default=None, description="Seconds before a pending attempt is given up as timed out."
    )
    run_id: Text | None = None
    tool_call_id: Text | None = None
    trace_id: TraceId | None = None
    span_id: SpanId | None = None
    worker: Text | None = Field(
        default=None,
        description="Identity of the process making the attempt. A pending effect asked for "
        "again by the same worker is the same attempt (a retried request); by another worker "
        "of the same run, it is an interrupted attempt.",
    )
    context: Context | None = None
    authority: Authority | None = None
    amount: AmountIn | None = Field(
        default=None, description="What the effect moves, for the grant's amount limits."
    )


class ReceiptIn(Strict):
    key: Key
    system: Name
    external_id: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    observed_at: Timestamp | None = Field(
        default=None, description="The external system's own timestamp (ISO 8601)."
    )
    data: Any = None
    amount: AmountIn | None = Field(
        default=None, description="What the evidence says was moved, compared with the grant."
    )
    target: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(
        default=None,
        description="Where the evidence says the effect landed, when it may differ from the "
        "intent's target; compared with the grant.",
    )
    attempt: AttemptNumber | None = None
    trace_id: TraceId | None = None
    span_id: SpanId | None = None


class FailureIn(Strict):
    key: Key
    error: Annotated[str, StringConstraints(min_length=1, max_length=4000)]
    definitive: bool = Field(
        default=False,
        description="True when the provider said nothing happened (state failed); false when "
        "the outcome is unknown (state timed_out).",
    )


# The most reports one batch request carries (POST /api/v1/receipts/batch, /failures/batch).
MAX_BATCH = 100
# Their bodies' bound: a single report's (1 MiB) times 4, Django's DATA_UPLOAD_MAX_MEMORY_SIZE.
BATCH_MAX_BODY = 4 * 1024 * 1024


class ReceiptBatchIn(Strict):
    """The envelope only: each receipt is validated on its own, so one bad receipt fails alone."""

    receipts: Annotated[
        list[SkipValidation[ReceiptIn]], Field(min_length=1, max_length=MAX_BATCH)
    ] = Field(description="Receipts, each recorded in its own transaction, as by /receipts.")


class FailureBatchIn(Strict):
    """The envelope only: each failure is validated on its own, so one bad failure fails alone."""

    failures: Annotated[
        list[SkipValidation[FailureIn]], Field(min_length=1, max_length=MAX_BATCH)
    ] = Field(description="Failures, each recorded in its own transaction, as by /failures.")


class TimeoutIn(Strict):
    key: Key
    reason: Annotated[str, StringConstraints(min_length=1, max_length=4000)]


# -- Answers ------------------------------------------------------------------------------
# Each answer is declared once, here; `of(row)` builds it from its model, reading only the
# row's own columns (no query), and `durability.api.decorators.answer` sends its dump. The
# casts name the literals that a choices column holds; validation checks them all the same.


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _decimal(value: Decimal | None) -> str | None:
    return None if value is None else format(value.normalize(), "f")


def _url(row: Effect | Case | Grant) -> str:
    return site_url() + row.get_absolute_url()


class AmountOut(BaseModel):
    value: str = Field(description="A decimal, as a string (no rounding).")
    currency: str


def amount_of(value: Decimal | None, currency: str) -> AmountOut | None:
    if value is None:
        return None
    return AmountOut(value=format(value.normalize(), "f"), currency=currency)


class GrantLimitsOut(BaseModel):
    """What the effect's grant (the version the intent was checked under) allows: the
    figures an `authority_exceeded` case compares a receipt with."""

    id: int
    name: str
    version: int
    currency: str
    max_amount: str | None = Field(description="The most one effect may move.")
    max_daily_amount: str | None = Field(description="Over the last 24 hours, rolling.")
    targets: list[str] = Field(description="Target system patterns (fnmatch).")
    url: str

    @classmethod
    def of(cls, grant: Grant) -> Self:
        return cls(
            id=grant.pk,
            name=grant.name,
            version=grant.version,
            currency=grant.currency,
            max_amount=_decimal(grant.max_amount),
            max_daily_amount=_decimal(grant.max_daily_amount),
            targets=grant.targets,
            url=_url(grant),
        )


class EffectOut(BaseModel):
    id: int
    key: str
    kind: str
    target: str
    state: str
    late: bool
    replay: ReplayPolicy
    fingerprint: str
    attempt: int
    deadline: str | None
    created: str
    updated: str
    url: str

    @classmethod
    def of(cls, effect: Effect) -> Self:
        return cls(
            id=effect.pk,
            key=effect.key,
            kind=effect.kind,
            target=effect.target,
            state=effect.state,
            late=effect.late,
            replay=cast(ReplayPolicy, effect.replay),
            fingerprint=effect.fingerprint,
            attempt=effect.attempt_count,
            deadline=_iso(effect.deadline),
            created=effect.created.isoformat(),
            updated=effect.updated.isoformat(),
            url=_url(effect),
        )


class CaseOut(BaseModel):
    id: int
    reason: str
    severity: SeverityName
    summary: str
    opened: str
    closed: str | None
    url: str

    @classmethod
    def of(cls, case: Case) -> Self:
        return cls(
            id=case.pk,
            reason=case.reason,
            severity=cast(SeverityName, case.get_severity_display()),
            summary=case.summary,
            opened=case.opened.isoformat(),
            closed=_iso(case.closed),
            url=_url(case),
        )


class ReceiptOut(BaseModel):
    id: int
    key: str
    system: str
    external_id: str
    observed_at: str | None
    data: Any
    strength: StrengthName
    attempt: int | None
    trace_id: str
    span_id: str
    late: bool
    received: str
    amount: AmountOut | None = Field(
        default=None, description="What the evidence says was moved, as the receipt gave it."
    )
    target: str | None = Field(
        default=None, description="Where the evidence says the effect landed, if it said."
    )

    @classmethod
    def of(cls, receipt: Receipt) -> Self:
        return cls(
            id=receipt.pk,
            key=receipt.key,
            system=receipt.system,
            external_id=receipt.external_id,
            observed_at=_iso(receipt.observed_at),
            data=receipt.data,
            strength=cast(StrengthName, receipt.strength),
            attempt=receipt.attempt,
            trace_id=receipt.trace_id,
            span_id=receipt.span_id,
            late=receipt.late,
            received=receipt.received.isoformat(),
            amount=amount_of(receipt.amount, receipt.currency),
            target=receipt.target or None,
        )


class AttemptOut(BaseModel):
    number: int
    started: str
    deadline: str | None
    context: dict[str, Any]
    run_id: str
    worker: str
    trace_id: str
    span_id: str

    @classmethod
    def of(cls, attempt: Attempt) -> Self:
        return cls(
            number=attempt.number,
            started=attempt.started.isoformat(),
            deadline=_iso(attempt.deadline),
            context=attempt.context,
            run_id=attempt.run_id,
            worker=attempt.worker,
            trace_id=attempt.trace_id,
            span_id=attempt.span_id,
        )


class DecisionOut(BaseModel):
    decision: DecisionName
    effect: EffectOut
    receipt: ReceiptOut | None
    case: CaseOut | None
    reason: str


class ReceiptResultOut(BaseModel):
    receipt: ReceiptOut
    effect: EffectOut | None
    case: CaseOut | None
    created: bool


class EffectResultOut(BaseModel):
    effect: EffectOut
    case: CaseOut | None
    changed: bool


class ReceiptItemOut(BaseModel):
    index: int = Field(description="The receipt's place in the request, from 0.")
    status: Literal[200, 201, 400] = Field(
        description="What POST /api/v1/receipts would have answered for it alone: 201 "
        "recorded, 200 recorded before (nothing changed), 400 refused (the body says why)."
    )
    body: ReceiptResultOut | ErrorOut


class ReceiptBatchOut(BaseModel):
    results: list[ReceiptItemOut]


class FailureItemOut(BaseModel):
    index: int = Field(description="The failure's place in the request, from 0.")
    status: Literal[200, 400, 404, 409] = Field(
        description="What POST /api/v1/failures would have answered for it alone: 200 "
        "applied (or applied before), 400 refused, 404 no effect has the key, 409 the "
        "effect's state refuses it."
    )
    body: EffectResultOut | ErrorOut


class FailureBatchOut(BaseModel):
    results: list[FailureItemOut]


class EffectDetailOut(BaseModel):
    effect: EffectOut
    request: Any
    payload_pruned: str | None = Field(
        default=None,
        description="When retention removed the request and the receipts' data (null then);"
        " the fingerprint and the receipts' external ids stay.",
    )
    authority: dict[str, Any] | None
    amount: AmountOut | None = Field(
        description="What the intent asked to move (its `amount`), checked against the grant."
    )
    grant: GrantLimitsOut | None = Field(
        description="The grant the intent was checked under, with its limits; null without "
        "one. Each receipt's `amount` and `target` are compared with these and the intent's "
        "amount (an `authority_exceeded` case)."
    )
    attempts: list[AttemptOut]
    receipts: list[ReceiptOut]
    cases: list[CaseOut]
    decision: DecisionName
    reason: str
    run_id: str | None = Field(description="The client id of the run the effect belongs to.")
    tool_span_id: str | None = Field(
        description="The tool call's span (16 hex digits) in which the effect was recorded."
    )
    model_span_id: str | None = Field(
        description="The model span (16 hex digits) whose output asked for that tool call."
    )


class ErrorOut(BaseModel):
    error: str
    fields: dict[str, str] | None = None


class GrantOut(BaseModel):
    id: int
    lineage: str = Field(description="Shared by every version of one grant.")
    version: int
    supersedes: int | None = Field(description="The version this one replaced.")
    name: str
    principal: str = Field(description="Agent or workflow pattern (fnmatch).")
    kinds: list[str] = Field(description="Effect kind patterns (fnmatch).")
    targets: list[str] = Field(description="Target system patterns (fnmatch).")
    currency: str
    max_amount: str | None
    max_daily_amount: str | None = Field(description="Over the last 24 hours, rolling.")
    max_count: int | None
    count_period_s: int | None
    requires_approval: bool
    second_approval_above: str | None = Field(
        description="Amounts above this need a second, different approver."
    )
    expires: str | None
    note: str
    granted_by: str
    created: str
    superseded_at: str | None
    revoked: str | None
    revoked_by: str
    status: GrantStatus
    url: str

    @classmethod
    def of(cls, grant: Grant) -> Self:
        return cls(
            id=grant.pk,
            lineage=str(grant.lineage),
            version=grant.version,
            supersedes=grant.supersedes_id,
            name=grant.name,
            principal=grant.principal,
            kinds=grant.kinds,
            targets=grant.targets,
            currency=grant.currency,
            max_amount=_decimal(grant.max_amount),
            max_daily_amount=_decimal(grant.max_daily_amount),
            max_count=grant.max_count,
            count_period_s=grant.count_period_s,
            requires_approval=grant.requires_approval,
            second_approval_above=_decimal(grant.second_approval_above),
            expires=_iso(grant.expires),
            note=grant.note,
            granted_by=grant.granted_by,
            created=grant.created.isoformat(),
            superseded_at=_iso(grant.superseded_at),
            revoked=_iso(grant.revoked),
            revoked_by=grant.revoked_by,
            status=cast(GrantStatus, grant.status()),
            url=_url(grant),
        )


class GrantListOut(BaseModel):
    grants: list[GrantOut]
    next: str | None = Field(description="The URL of the next page, or null on the last.")


class HookReceiptOut(BaseModel):
    key: str
    external_id: str
    created: bool = Field(
        description="False when the same receipt (key, system, external id) was recorded "
        "before, by the agent say: it is now provider_confirmed."
    )
    effect: EffectOut | None = Field(description="The effect of the key; null for an orphan.")
    case: CaseOut | None = Field(description="The case the evidence opened, if any.")


class HookDeliveryOut(BaseModel):
    """The webhook intake's answer to a verified delivery (/hooks/<name>/): 201 stored,
    200 received before (`duplicate`)."""

    delivery: str = Field(
        description="The delivery id its header gave, else the SHA-256 of the body (hex)."
    )
    duplicate: bool = Field(description="Received before: nothing changed.")
    receipts: list[HookReceiptOut]
    ignored: int = Field(description="Commits of a GitHub push without the key's trailer.")
