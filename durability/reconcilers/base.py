"""The reconciler plug-in interface: ask an external system whether an effect happened.

A reconciler is a class with a `kind` (its name in settings.TALLYBOOK_RECONCILERS), a
pydantic `Config` (what an admin stores in `ReconcilerConfig.config`, validated strictly)
and a `probe(effect)` method answering one of `Found`, `NotFound` or `Unknown`. It only
looks: settling the effect on its answer is the job of `durability.reconcilers.reconciling`.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from durability.models import Effect, reconciler_class


@dataclass(frozen=True)
class Found:
    """The external system holds the effect: this is the evidence, stored as a receipt."""

    system: str
    external_id: str
    observed_at: datetime | None = None
    data: dict[str, Any] = field(default_factory=dict)
    answer: ClassVar[str] = "found"

    @property
    def detail(self) -> str:
        return f"{self.system} holds {self.external_id}"


@dataclass(frozen=True)
class NotFound:
    """The external system answered, and it has no trace of the effect."""

    detail: str
    answer: ClassVar[str] = "not_found"


@dataclass(frozen=True)
class Unknown:
    """No answer worth trusting (unreachable, 5xx, a timeout, an unexpected reply)."""

    detail: str
    answer: ClassVar[str] = "unknown"


Answer = Found | NotFound | Unknown


class ProbeConfig(BaseModel):
    """Base of every reconciler's configuration: strict, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Reconciler[C: ProbeConfig](ABC):
    kind: ClassVar[str]
    Config: ClassVar[type[ProbeConfig]]

    def __init__(self, config: C) -> None:
        self.config = config

    @abstractmethod
    def probe(self, effect: Effect) -> Answer:
        """Look the effect up; never raise for a failure of the external system."""


def reconciler_for(kind: str, config: Mapping[str, Any]) -> Reconciler[Any]:
    """A ready reconciler; raises UnknownKind or pydantic.ValidationError for a bad config.

    The class is found by its dotted path in settings.TALLYBOOK_RECONCILERS and imported
    on first use (`reconciler_class`), so nothing loads the plug-ins before a probe needs one.
    """
    cls: type[Reconciler[Any]] = reconciler_class(kind)
    return cls(cls.Config.model_validate(dict(config)))


# -- templates -----------------------------------------------------------------------------

# What a template may name: effect fields, and the request's (nested) keys as request[a][b].
TEMPLATE_FIELDS = frozenset({"key", "kind", "target", "effect_id", "attempt", "request"})


class _Template(string.Formatter):
    def __init__(self, escape: bool) -> None:
        self.escape = escape

    def format_field(self, value: Any, format_spec: str) -> str:
        text = super().format_field(value, format_spec)
        return quote(text, safe="") if self.escape else text


def template_check(template: str) -> str:
    """Validate a template's fields at configuration time; returns it unchanged."""
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        root = name.split("[", 1)[0]
        if root not in TEMPLATE_FIELDS or "." in name:
            raise ValueError(
                f"{{{name}}} is not a template field; use {', '.join(sorted(TEMPLATE_FIELDS))} "
                "or request[field]"
            )
        if root != "request" and root != name:
            raise ValueError(f"{{{name}}}: only request takes [field]")
    return template


def template_fill(template: str, effect: Effect, *, escape: bool) -> str:
    """Fill a template from the effect; `escape` percent-encodes every value (for URLs).

    Raises KeyError or TypeError when a request field it names is missing.
    """
    values = {
        "key": effect.key,
        "kind": effect.kind,
        "target": effect.target,
        "effect_id": effect.pk,
        "attempt": effect.attempt_count,
        "request": effect.request if effect.request is not None else {},
    }
    return _Template(escape).vformat(template, (), values)
