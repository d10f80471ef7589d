"""Asking an external system whether an effect happened: a project's reconciler for one target,
the probes put to it and their answers, and the look-up of a plug-in by its kind (the
plug-ins themselves live in `durability.reconcilers`, which imports these models)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string
from pydantic import ValidationError as PydanticValidationError

from durability.models.effects import Effect, Receipt
from durability.models.projects import Project


class UnknownKind(LookupError):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        known = ", ".join(sorted(settings.TALLYBOOK_RECONCILERS))
        super().__init__(f"no reconciler of kind {kind!r}; known: {known}")


def reconciler_class(kind: str) -> type[Any]:
    """The plug-in of that kind (a `durability.reconcilers.base.Reconciler`); raises
    UnknownKind. Found by its dotted path in settings.TALLYBOOK_RECONCILERS and imported on
    first use: nothing loads the plug-ins before a configuration is checked or a probe
    needs one, and the models import none of them."""
    path = settings.TALLYBOOK_RECONCILERS.get(kind)
    if path is None:
        raise UnknownKind(kind)
    cls: type[Any] = import_string(path)
    return cls


class ReconcilerConfig(models.Model):
    """How to ask one target system whether an effect happened (docs/reconcilers.md)."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="reconcilers",
        db_index=False,  # reconciler_project_target_uniq leads with it
    )
    target = models.CharField(
        max_length=255, help_text="The target system of the effects this reconciler answers for."
    )
    kind = models.CharField(max_length=50, help_text="A registered reconciler: http or git.")
    config = models.JSONField(
        default=dict, blank=True, help_text="The reconciler's settings (docs/reconcilers.md)."
    )
    grace_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Trust not_found once this many seconds have passed since the attempt's "
        "deadline or timeout; empty: never, absence is only evidence for an operator.",
    )
    interval_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(10)],
        help_text="Least time between two scheduled probes of one effect.",
    )
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # One reconciler per target; its index serves the look-up of a target's reconciler.
            models.UniqueConstraint(
                fields=["project", "target"], name="reconciler_project_target_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} reconciler for {self.target}"

    def clean(self) -> None:
        """The kind must name a plug-in, and the config be valid for that plug-in's Config
        (durability.reconcilers.base.reconciler_for builds the reconciler from them)."""
        try:
            reconciler_class(self.kind).Config.model_validate(dict(self.config))
        except UnknownKind as exc:
            raise ValidationError({"kind": str(exc)}) from exc
        except PydanticValidationError as exc:
            messages = [
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            ]
            raise ValidationError({"config": messages}) from exc


class ProbeAnswer(models.TextChoices):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"


class Probe(models.Model):
    """One question put to an external system about one attempt at an effect, and its answer."""

    # The effect's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # probe_of_effect_recent_idx leads with it
    )
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        related_name="probes",
        db_index=False,  # probe_of_effect_recent_idx has it after the project
        db_constraint=False,  # probe_effect_same_project_fk (migration 0031)
    )
    config = models.ForeignKey(
        ReconcilerConfig, models.SET_NULL, null=True, blank=True, related_name="probes"
    )
    kind = models.CharField(max_length=50)
    # The effect's attempt the probe asked about; a later attempt is a new question.
    attempt = models.PositiveIntegerField()
    # "system:scan" for the schedule, "user:<username>" for an operator's "probe now".
    requested_by = models.CharField(max_length=150)
    started = models.DateTimeField()
    finished = models.DateTimeField()
    answer = models.CharField(max_length=16, choices=ProbeAnswer.choices)
    # One sentence: what was asked and what came back.
    detail = models.TextField(blank=True)
    # For `found`: the system, external id, observed_at and data it was shown.
    evidence = models.JSONField(null=True, blank=True)
    # The event the answer applied to the effect, or blank when it only informs.
    settled = models.CharField(max_length=32, blank=True)
    receipt = models.ForeignKey(
        Receipt,
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="probes",
        db_index=False,  # read from the probe; a receipt goes only with its project
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(answer__in=ProbeAnswer.values), name="probe_answer_valid"
            ),
        ]
        indexes = [
            # The case page's probe history, and the scan's "probed lately?" check.
            models.Index(
                fields=["project", "effect", "-started"], name="probe_of_effect_recent_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} probe of {self.effect_id}: {self.answer}"

    @property
    def took_s(self) -> float:
        return (self.finished - self.started).total_seconds()

    @property
    def observed_at(self) -> datetime | None:
        """When the system says the effect happened: the evidence's ISO 8601 text as an aware
        moment; None when absent or unreadable, so that no stored value fails a page."""
        evidence = self.evidence if isinstance(self.evidence, dict) else {}
        value = evidence.get("observed_at")
        if not isinstance(value, str):
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
