"""The API's wire models mapped onto the ledger's commands (`durability/ledger/commands.py`):
one function per model, each a copy of values the schema has already checked."""

from __future__ import annotations

from decimal import Decimal

from durability.api.schemas import AmountIn, FailureIn, IntentIn, ReceiptIn, TimeoutIn
from durability.ledger.commands import Amount, Failure, Intent, ReceiptEvidence, Timeout


def amount_of_input(amount: AmountIn | None) -> Amount | None:
    return None if amount is None else Amount(Decimal(amount.value), amount.currency)


def intent_of(intent: IntentIn) -> Intent:
    return Intent(
        key=intent.key,
        kind=intent.kind,
        target=intent.target,
        request=intent.request,
        fingerprint=intent.fingerprint,
        replay=intent.replay,
        timeout_s=intent.timeout_s,
        run_id=intent.run_id,
        tool_call_id=intent.tool_call_id,
        trace_id=intent.trace_id,
        span_id=intent.span_id,
        worker=intent.worker,
        context=intent.context.model_dump(exclude_none=True) if intent.context else {},
        authority=intent.authority,
        amount=amount_of_input(intent.amount),
    )


def receipt_of(receipt: ReceiptIn) -> ReceiptEvidence:
    return ReceiptEvidence(
        key=receipt.key,
        system=receipt.system,
        external_id=receipt.external_id,
        observed_at=receipt.observed_at,
        data=receipt.data,
        amount=amount_of_input(receipt.amount),
        target=receipt.target,
        attempt=receipt.attempt,
        trace_id=receipt.trace_id,
        span_id=receipt.span_id,
    )


def failure_of(failure: FailureIn) -> Failure:
    return Failure(key=failure.key, error=failure.error, definitive=failure.definitive)


def timeout_of(timeout: TimeoutIn) -> Timeout:
    return Timeout(key=timeout.key, reason=timeout.reason)
