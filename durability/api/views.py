"""The ingest API, /api/v1/: parse, call the state machine, answer JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from django.http import JsonResponse
from django.views.decorators.http import require_GET, require_POST
from pydantic import BaseModel

from durability import inbound, redaction
from durability.api import schemas, signals
from durability.api.commands import failure_of, intent_of, receipt_of, timeout_of
from durability.api.decorators import (
    ApiRequest,
    ItemRefused,
    PayloadRequest,
    answer,
    authorize,
    error,
    validated,
)
from durability.api.schemas import (
    AttemptOut,
    CaseOut,
    DecisionName,
    DecisionOut,
    EffectDetailOut,
    EffectOut,
    EffectResultOut,
    ErrorOut,
    FailureBatchIn,
    FailureBatchOut,
    FailureIn,
    FailureItemOut,
    GrantLimitsOut,
    GrantListOut,
    GrantOut,
    IntentIn,
    ReceiptBatchIn,
    ReceiptBatchOut,
    ReceiptIn,
    ReceiptItemOut,
    ReceiptOut,
    ReceiptResultOut,
    TimeoutIn,
    amount_of,
)
from durability.authority.grants import GrantQuery
from durability.ledger import decisions, evidence, machine
from durability.ledger.intents import intent_record
from durability.models import Case, Decision, Effect, Grant, Receipt
from durability.paging import Page
from durability.site import site_url

STATUS_OF_DECISION = {Decision.CONFLICT: 409}
# An effect's detail shows its grant's limits.
DETAIL = Effect.objects.select_related("grant")


def _case(case: Case | None) -> CaseOut | None:
    return CaseOut.of(case) if case else None


def _receipt(receipt: Receipt | None) -> ReceiptOut | None:
    return ReceiptOut.of(receipt) if receipt else None


@require_POST
@authorize(schema=IntentIn, keys_ahead=True)
def intents(request: PayloadRequest[IntentIn]) -> JsonResponse:
    outcome = intent_record(
        project=request.project, actor=request.actor, intent=intent_of(request.payload)
    )
    return answer(
        DecisionOut(
            decision=cast(DecisionName, outcome.decision),
            effect=EffectOut.of(outcome.effect),
            receipt=_receipt(outcome.receipt),
            case=_case(outcome.case),
            reason=outcome.reason,
        ),
        STATUS_OF_DECISION.get(outcome.decision, 201 if outcome.created else 200),
    )


def _receipt_recorded(request: ApiRequest, receipt: ReceiptIn) -> tuple[ReceiptResultOut, int]:
    """Record one receipt (its own transaction); the answer and its status."""
    outcome = evidence.receipt_record(
        project=request.project, actor=request.actor, receipt=receipt_of(receipt)
    )
    return (
        ReceiptResultOut(
            receipt=ReceiptOut.of(outcome.receipt),
            effect=EffectOut.of(outcome.effect) if outcome.effect else None,
            case=_case(outcome.case),
            created=outcome.created,
        ),
        201 if outcome.created else 200,
    )


@require_POST
@authorize(schema=ReceiptIn, keys_ahead=True)
def receipts(request: PayloadRequest[ReceiptIn]) -> JsonResponse:
    return answer(*_receipt_recorded(request, request.payload))


@require_POST
@authorize(schema=ReceiptBatchIn, max_body=schemas.BATCH_MAX_BODY)
def receipts_batch(request: PayloadRequest[ReceiptBatchIn]) -> JsonResponse:
    """Each receipt recorded in its own transaction, or refused alone: what /receipts would
    answer for it, in order. A receipt answered 2xx here is committed."""
    return _batch(
        request,
        request.payload.receipts,
        ReceiptIn,
        _receipt_recorded,
        (ReceiptItemOut, ReceiptBatchOut),
    )


def _batch[In: BaseModel, Item: BaseModel](
    request: ApiRequest,
    items: list[Any],
    schema: type[In],
    record: Callable[[ApiRequest, In], tuple[BaseModel, int]],
    answers: tuple[type[Item], Callable[..., BaseModel]],
) -> JsonResponse:
    """A batch endpoint's answer, 207: each item validated by the single endpoint's `schema`
    and applied by its `record` (in its own transaction), or refused alone with its
    field-level errors. `answers` are the models of an item's answer (its index, and the
    status and body the single endpoint would answer) and of the batch's (the items', in
    order)."""
    item_out, batch_out = answers
    results: list[Item] = []
    for index, item in enumerate(items):
        body: BaseModel
        try:
            body, status = record(request, validated(schema, item, request.body))
        except ItemRefused as refused:
            body, status = refused.body, refused.status
        results.append(item_out(index=index, status=status, body=body))
    return answer(batch_out(results=results), 207)


def _effect_change(
    record: Callable[[], evidence.EffectOutcome],
) -> tuple[EffectResultOut | ErrorOut, int]:
    """Apply an agent's report on an effect: 404 for an unknown key, 409 where its state
    refuses the report."""
    try:
        outcome = record()
    except machine.UnknownEffect as exc:
        return ErrorOut(error=str(exc), fields={"key": "No effect has this key"}), 404
    except machine.IllegalTransition as exc:
        return ErrorOut(error=str(exc)), 409
    return (
        EffectResultOut(
            effect=EffectOut.of(outcome.effect), case=_case(outcome.case), changed=outcome.changed
        ),
        200,
    )


def _changed(body: EffectResultOut | ErrorOut, status: int) -> JsonResponse:
    return answer(body, status, exclude_none=isinstance(body, ErrorOut))


def _failure(request: ApiRequest, failure: FailureIn) -> tuple[EffectResultOut | ErrorOut, int]:
    return _effect_change(
        lambda: evidence.failure_record(
            project=request.project, actor=request.actor, failure=failure_of(failure)
        )
    )


@require_POST
@authorize(schema=FailureIn, keys_ahead=True)
def failures(request: PayloadRequest[FailureIn]) -> JsonResponse:
    return _changed(*_failure(request, request.payload))


@require_POST
@authorize(schema=FailureBatchIn, max_body=schemas.BATCH_MAX_BODY)
def failures_batch(request: PayloadRequest[FailureBatchIn]) -> JsonResponse:
    """Each failure applied in its own transaction, or refused alone: what /failures would
    answer for it, in order."""
    return _batch(
        request, request.payload.failures, FailureIn, _failure, (FailureItemOut, FailureBatchOut)
    )


@require_POST
@authorize(schema=TimeoutIn, keys_ahead=True)
def timeouts(request: PayloadRequest[TimeoutIn]) -> JsonResponse:
    return _changed(
        *_effect_change(
            lambda: evidence.timeout_record(
                project=request.project, actor=request.actor, timeout=timeout_of(request.payload)
            )
        )
    )


def _effect_detail(effect: Effect) -> JsonResponse:
    outcome = decisions.decide(effect)
    # Each receiver adds its own fields (trajectories: run_id, tool_span_id, model_span_id).
    sections: dict[str, Any] = {}
    for _, section in signals.effect_detail.send(sender=Effect, effect=effect):
        sections.update(cast(dict[str, Any], section))
    return answer(
        EffectDetailOut(
            effect=EffectOut.of(effect),
            request=effect.request,
            payload_pruned=effect.payload_pruned.isoformat() if effect.payload_pruned else None,
            authority=effect.authority,
            amount=amount_of(effect.amount, effect.currency),
            grant=GrantLimitsOut.of(effect.grant) if effect.grant else None,
            attempts=[AttemptOut.of(a) for a in effect.attempts.filter(project=effect.project_id)],
            receipts=[ReceiptOut.of(r) for r in effect.receipts.filter(project=effect.project_id)],
            cases=[
                CaseOut.of(c)
                for c in effect.cases.filter(project=effect.project_id, closed=None).order_by(
                    "opened"
                )
            ],
            decision=cast(DecisionName, outcome.decision),
            reason=outcome.reason,
            **sections,
        )
    )


@require_GET
@authorize()
def effect_detail(request: ApiRequest, effect_id: int) -> JsonResponse:
    effect = DETAIL.filter(project=request.project, pk=effect_id).first()
    if effect is None:
        return error("No such effect in this project", 404)
    return _effect_detail(effect)


@require_GET
@authorize()
def effects(request: ApiRequest) -> JsonResponse:
    key = request.GET.get("key")
    if not key:
        return error("Give the effect's key", 400, {"key": "This query parameter is required"})
    if len(key) > 255:
        return error("Invalid query", 400, {"key": "At most 255 characters"})
    try:
        inbound.storable_text(key)
    except ValueError as exc:
        return error("Invalid query", 400, {"key": str(exc)})
    # Keys are stored with any secret in them replaced, as the ledger recorded them.
    stored = redaction.distinct(key, redaction.extras_of(request.project))
    try:  # unique on (project, key): `.get()`, not `.first()` and its ORDER BY id
        effect = DETAIL.get(project=request.project, key=stored)
    except Effect.DoesNotExist:
        return error("No effect has this key in this project", 404, {"key": "Unknown key"})
    return _effect_detail(effect)


GRANT_PAGE = 100


@require_GET
@authorize()
def grants(request: ApiRequest) -> JsonResponse:
    """The project's grants, every version, newest first; keyset on id (`?before=`)."""
    query = GrantQuery.parse(request.GET.dict())
    if isinstance(query, dict):
        return error("Invalid query", 400, query)
    page = Page.of(query.apply(Grant.objects.filter(project=request.project)), GRANT_PAGE)

    def following(grant: Grant) -> str:
        """The link to the page after `grant`: this request's, with `before` its id."""
        params = request.GET.copy()
        params["before"] = str(grant.pk)
        return f"{site_url()}{request.path}?{params.urlencode()}"

    return answer(
        GrantListOut(grants=[GrantOut.of(g) for g in page.rows], next=page.next(following))
    )


@require_GET
@authorize()
def grant_detail(request: ApiRequest, grant_id: int) -> JsonResponse:
    grant = Grant.objects.filter(project=request.project, pk=grant_id).first()
    if grant is None:
        return error("No such grant in this project", 404)
    return answer(GrantOut.of(grant))
