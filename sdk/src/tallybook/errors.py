"""The exceptions an agent author handles: interruption reports and transport failures."""

from __future__ import annotations

from typing import Any

from tallybook.records import Case, Json


class TallybookError(Exception):
    """Base of every exception the SDK raises."""


class ServerUnavailable(TallybookError):
    """The server could not be reached, or kept answering 429/5xx, after every retry."""


class RequestRejected(TallybookError):
    """The server refused a request (4xx): a bug in the caller, not worth a retry."""

    def __init__(self, status: int, error: str, fields: dict[str, str] | None = None) -> None:
        self.status, self.error, self.fields = status, error, fields or {}
        self._args = (status, error, fields)
        detail = "; ".join(f"{name}: {message}" for name, message in self.fields.items())
        super().__init__(f"HTTP {status}: {error}" + (f" ({detail})" if detail else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._args


class ReceiptConflict(TallybookError):
    """A block that has its outcome was given a different one: nothing was sent.

    One block is one effect. A provider that really did it twice is reported with
    `tb.receipt(key, ...)`, which the server records as a duplicate effect.
    """


class EffectUnsettled(TallybookError):
    """An effect block was left with neither a receipt nor a failure: a bug in the agent."""


class EffectInterrupted(TallybookError):
    """Do not perform the effect now: the base of every such outcome, and its report.

    Carries the decision, the one-sentence reason, the case an operator settles (if one
    is open) and its URL.
    """

    def __init__(
        self, key: str, decision: str, reason: str, effect: Json | None, case: Case | None
    ) -> None:
        self.key, self.decision, self.reason = key, decision, reason
        self.effect: Json | None = effect
        self.case: Case | None = case
        self.case_url: str | None = case.url if case else None
        report = f"{key}: {decision}. {reason}"
        if case is not None:
            report += f" Case #{case.id} ({case.reason}): {case.url}"
        super().__init__(report)

    def __reduce__(self) -> tuple[Any, ...]:
        # Durable engines (DBOS, Temporal) and process pools pickle the exceptions they re-raise.
        return type(self), (self.key, self.decision, self.reason, self.effect, self.case)

    @classmethod
    def answered(cls, key: str, answer: Json) -> EffectInterrupted:
        """The exception for the server's answer to an intent."""
        case = Case.from_json(answer.get("case"))
        return cls(key, answer["decision"], answer["reason"], answer["effect"], case)


class IntentNotRecorded(EffectInterrupted):
    """The intent could not be recorded, so the effect was not performed (fail closed)."""

    def __init__(self, key: str, cause: ServerUnavailable | RequestRejected) -> None:
        self.cause = cause
        self.status = cause.status if isinstance(cause, RequestRejected) else None
        super().__init__(
            key,
            "unrecorded",
            f"The intent could not be recorded, so the effect was not performed: {cause}",
            None,
            None,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.key, self.cause)


class EffectInDoubt(EffectInterrupted):
    """`wait`: the effect may have happened, or awaits a person; do not repeat it now."""


class EffectDenied(EffectInterrupted):
    """`denied`: authority was refused, or an operator closed the effect."""


class EffectConflict(EffectInterrupted):
    """`conflict`: the key was used before for a different request or claim (kind, target,
    authority, amount)."""


INTERRUPTIONS: dict[str, type[EffectInterrupted]] = {
    "wait": EffectInDoubt,
    "denied": EffectDenied,
    "conflict": EffectConflict,
}
