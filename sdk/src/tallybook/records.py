"""What the server answers, as small immutable records, and the ISO 8601 time the API speaks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

Json = dict[str, Any]


# What the API takes as a timestamp, checked here so that a typo fails before it is sent.
ISO8601 = re.compile(
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|z|[+-]\d{2}(:?\d{2})?)?"
)


def iso8601(value: datetime | float | str | None) -> str | None:
    """A datetime (naive means UTC) or epoch seconds as ISO 8601; a string is checked."""
    if value is None:
        return None
    if isinstance(value, str):
        if not ISO8601.fullmatch(value):
            raise ValueError(f"observed_at must be an ISO 8601 time, not {value!r}")
        return value
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat()
    if isinstance(value, bool):
        raise TypeError("observed_at must be a datetime, epoch seconds or an ISO 8601 string")
    return datetime.fromtimestamp(value, tz=timezone.utc).isoformat()


@dataclass(frozen=True)
class Receipt:
    """Evidence that an effect happened.

    A tool function decorated with `Tallybook.tool` returns one with `system` and
    `external_id`; the ones the server has on record carry the rest.
    """

    system: str
    external_id: str
    observed_at: datetime | float | str | None = None
    data: Any = None
    id: int | None = None
    key: str | None = None
    strength: str | None = None
    attempt: int | None = None
    late: bool = False
    received: str | None = None

    @classmethod
    def from_json(cls, data: Json) -> Receipt:
        return cls(
            system=data["system"],
            external_id=data["external_id"],
            observed_at=data.get("observed_at"),
            data=data.get("data"),
            id=data.get("id"),
            key=data.get("key"),
            strength=data.get("strength"),
            attempt=data.get("attempt"),
            late=bool(data.get("late")),
            received=data.get("received"),
        )


@dataclass(frozen=True)
class Case:
    """An entry in the reconciliation queue: what an operator settles."""

    id: int
    reason: str
    severity: str
    summary: str
    url: str

    @classmethod
    def from_json(cls, data: Json | None) -> Case | None:
        if not data:
            return None
        return cls(data["id"], data["reason"], data["severity"], data["summary"], data["url"])


@dataclass(frozen=True)
class EffectStatus:
    """An effect as the server sees it now, and the decision an intent would get."""

    decision: str
    reason: str
    state: str
    effect: Json
    receipts: list[Receipt] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Json) -> EffectStatus:
        return cls(
            decision=data["decision"],
            reason=data["reason"],
            state=data["effect"]["state"],
            effect=data["effect"],
            receipts=[Receipt.from_json(r) for r in data.get("receipts", [])],
            cases=[c for c in map(Case.from_json, data.get("cases", [])) if c is not None],
        )
