"""The ingest API, /api/v1/: parse, call the state machine, answer JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from durability import machine
from durability.decorators import ApiRequest, authorize, error, parse
from durability.grants import GrantQuery
from durability.models import Case, Decision, Effect, Grant, Receipt
from durability.openapi import openapi_document
from durability.schemas import FailureIn, IntentIn, ReceiptIn, TimeoutIn
from durability.site import site_url
from trajectories.jobs import effect_link_later
from trajectories.links import effect_trajectory

STATUS_OF_DECISION = {Decision.CONFLICT: 409}


def _case(case: Case | None) -> dict[str, Any] | None:
    return case.to_dict() if case else None


def _receipt(receipt: Receipt | None) -> dict[str, Any] | None:
    return receipt.to_dict() if receipt else None


@require_POST
@authorize()
def intents(request: ApiRequest) -> JsonResponse:
    intent = parse(request, IntentIn)
    if isinstance(intent, JsonResponse):
        return intent
    outcome = machine.intent_record(project=request.project, actor=request.actor, intent=intent)
    effect_link_later(outcome.effect)
    status = STATUS_OF_DECISION.get(outcome.decision, 201 if outcome.created else 200)
    return JsonResponse(
        {
            "decision": outcome.decision,
            "effect": outcome.effect.to_dict(),
            "receipt": _receipt(outcome.receipt),
            "case": _case(outcome.case),
            "reason": outcome.reason,
        },
        status=status,
    )


@require_POST
@authorize()
def receipts(request: ApiRequest) -> JsonResponse:
    receipt = parse(request, ReceiptIn)
    if isinstance(receipt, JsonResponse):
        return receipt
    outcome = machine.receipt_record(project=request.project, actor=request.actor, receipt=receipt)
    effect_link_later(outcome.effect, receipt=outcome.receipt)
    return JsonResponse(
        {
            "receipt": outcome.receipt.to_dict(),
            "effect": outcome.effect.to_dict() if outcome.effect else None,
            "case": _case(outcome.case),
            "created": outcome.created,
        },
        status=201 if outcome.created else 200,
    )


def _effect_change(record: Callable[[], machine.EffectOutcome]) -> JsonResponse:
    """Apply an agent's report on an effect: 404 for an unknown key, 409 where its state
    refuses the report."""
    try:
        outcome = record()
    except machine.UnknownEffect as exc:
        return error(str(exc), 404, {"key": "No effect has this key"})
    except machine.IllegalTransition as exc:
        return error(str(exc), 409)
    return JsonResponse(
        {
            "effect": outcome.effect.to_dict(),
            "case": _case(outcome.case),
            "changed": outcome.changed,
        }
    )


@require_POST
@authorize()
def failures(request: ApiRequest) -> JsonResponse:
    failure = parse(request, FailureIn)
    if isinstance(failure, JsonResponse):
        return failure
    return _effect_change(
        lambda: machine.failure_record(
            project=request.project, actor=request.actor, failure=failure
        )
    )


@require_POST
@authorize()
def timeouts(request: ApiRequest) -> JsonResponse:
    timeout = parse(request, TimeoutIn)
    if isinstance(timeout, JsonResponse):
        return timeout
    return _effect_change(
        lambda: machine.timeout_record(
            project=request.project, actor=request.actor, timeout=timeout
        )
    )


def _effect_detail(effect: Effect) -> dict[str, Any]:
    outcome = machine.decide(effect)
    return {
        "effect": effect.to_dict(),
        "request": effect.request,
        "authority": effect.authority,
        "attempts": [a.to_dict() for a in effect.attempts.all()],
        "receipts": [r.to_dict() for r in effect.receipts.all()],
        "cases": [c.to_dict() for c in effect.cases.filter(closed=None).order_by("opened")],
        "decision": outcome.decision,
        "reason": outcome.reason,
        **effect_trajectory(effect),
    }


@require_GET
@authorize()
def effect_detail(request: ApiRequest, effect_id: int) -> JsonResponse:
    effect = Effect.objects.filter(project=request.project, pk=effect_id).first()
    if effect is None:
        return error("No such effect in this project", 404)
    return JsonResponse(_effect_detail(effect))


@require_GET
@authorize()
def effects(request: ApiRequest) -> JsonResponse:
    key = request.GET.get("key")
    if not key:
        return error("Give the effect's key", 400, {"key": "This query parameter is required"})
    if len(key) > 255:
        return error("Invalid query", 400, {"key": "At most 255 characters"})
    if "\x00" in key:
        return error("Invalid query", 400, {"key": "NUL characters cannot be stored"})
    effect = Effect.objects.filter(project=request.project, key=key).first()
    if effect is None:
        return error("No effect has this key in this project", 404, {"key": "Unknown key"})
    return JsonResponse(_effect_detail(effect))


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(openapi_document())


GRANT_PAGE = 100


@require_GET
@authorize()
def grants(request: ApiRequest) -> JsonResponse:
    """The project's grants, every version, newest first; keyset on id (`?before=`)."""
    query = GrantQuery.parse(request.GET.dict())
    if isinstance(query, dict):
        return error("Invalid query", 400, query)
    rows = list(query.apply(Grant.objects.filter(project=request.project))[: GRANT_PAGE + 1])
    more = len(rows) > GRANT_PAGE
    rows = rows[:GRANT_PAGE]
    next_url = None
    if more:
        params = request.GET.copy()
        params["before"] = str(rows[-1].pk)
        next_url = f"{site_url()}{request.path}?{params.urlencode()}"
    return JsonResponse({"grants": [g.to_dict() for g in rows], "next": next_url})


@require_GET
@authorize()
def grant_detail(request: ApiRequest, grant_id: int) -> JsonResponse:
    grant = Grant.objects.filter(project=request.project, pk=grant_id).first()
    if grant is None:
        return error("No such grant in this project", 404)
    return JsonResponse(grant.to_dict())
