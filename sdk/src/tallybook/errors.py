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


class IntentNotRecorded(TallybookError):
    """The intent could not be recorded, so the effect was not performed (fail closed)."""

    def __init__(self, key: str, cause: ServerUnavailable | RequestRejected) -> None:
        self.key, self.cause = key, cause
        self.status = cause.status if isinstance(cause, RequestRejected) else None
        super().__init__(
            f"The intent for {key!r} could not be recorded, so the effect was not performed: "
            f"{cause}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.key, self.cause)


class EffectUnsettled(TallybookError):
    """An effect block was left with neither a receipt nor a failure: a bug in the agent."""


class EffectInterrupted(TallybookError):
    """The server's answer forbids performing the effect now: the interruption report.

    Carries the decision, the server's one-sentence reason, the case an operator
    settles (if one is open) and its URL.
    """

    def __init__(self, key: str, answer: Json) -> None:
        self.key, self._answer = key, answer
        self.decision: str = answer["decision"]
        self.reason: str = answer["reason"]
        self.effect: dict[str, Any] = answer["effect"]
        self.case: Case | None = Case.from_json(answer.get("case"))
        self.case_url: str | None = self.case.url if self.case else None
        report = f"{key}: {self.decision}. {self.reason}"
        if self.case is not None:
            report += f" Case #{self.case.id} ({self.case.reason}): {self.case.url}"
        super().__init__(report)

    def __reduce__(self) -> tuple[Any, ...]:
        # Durable engines (DBOS, Temporal) and process pools pickle the exceptions they re-raise.
        return type(self), (self.key, self._answer)


class EffectInDoubt(EffectInterrupted):
    """`wait`: the effect may have happened, or awaits a person; do not repeat it now."""


class EffectDenied(EffectInterrupted):
    """`denied`: authority was refused, or an operator closed the effect."""


class EffectConflict(EffectInterrupted):
    """`conflict`: the key was used before for a different request."""


INTERRUPTIONS: dict[str, type[EffectInterrupted]] = {
    "wait": EffectInDoubt,
    "denied": EffectDenied,
    "conflict": EffectConflict,
}
