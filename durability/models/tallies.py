"""The tallied hours the pages count instead of rows (written only by `durability.tallies`):
effects per hour and group, how far a project is tallied, cases opened and settled per hour."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from durability.models.cases import Reason
from durability.models.effects import State
from durability.models.projects import Project


class EffectHour(models.Model):
    """The effects created in one hour of a project, counted per state, kind, target, agent
    and grant: what the overview and the authority report count, so that their cost is the
    number of hours shown, not of effects. Written only by `tallies.hours_tally` (a job),
    which replaces an hour's rows whole; the pages count hours it has not reached live."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # effect_hour_uniq leads with it
    )
    hour = models.DateTimeField()
    state = models.CharField(max_length=20, choices=State.choices)
    kind = models.CharField(max_length=100)
    target = models.CharField(max_length=255)
    agent = models.CharField(max_length=255, blank=True)
    grant = models.ForeignKey(
        "Grant", models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    n = models.PositiveIntegerField()
    # Of those, the effects with any receipt, and with a receipt of each strength.
    evidenced = models.PositiveIntegerField()
    agent_reported = models.PositiveIntegerField()
    provider_confirmed = models.PositiveIntegerField()
    operator_attested = models.PositiveIntegerField()
    # Of those, the effects with a case of these reasons: the overview's "problems only"
    # shows them beside the failed states.
    late_success = models.PositiveIntegerField(default=0)
    duplicate_effect = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # One row per hour and group; also the pages' index: a project's hours in a range.
            models.UniqueConstraint(
                fields=["project", "hour", "state", "kind", "target", "agent", "grant"],
                name="effect_hour_uniq",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.state} {self.n}"


class EffectHourMark(models.Model):
    """How far a project's hours are tallied: every hour before `until`, as of the audit
    entries up to `audit_id` (the job looks again from `audit_from`, its previous mark, for
    effects of tallied hours that changed since)."""

    project = models.OneToOneField(Project, models.CASCADE, primary_key=True, related_name="+")
    until = models.DateTimeField()
    audit_id = models.BigIntegerField(default=0)
    audit_from = models.BigIntegerField(default=0)
    tallied = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.project_id} until {self.until:%Y-%m-%d %H}h"


class CaseHour(models.Model):
    """The cases of one hour of a project, per reason: how many opened in it, how many were
    settled (closed) in it and how long those took, counted in the buckets of
    `tallies.SETTLE_BOUNDS`. The overview's backlog reads these, so that its cost is the
    hours it shows, not the cases. Written only by `tallies.hours_tally`, an hour whole."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # case_hour_uniq leads with it
    )
    hour = models.DateTimeField()
    reason = models.CharField(max_length=32, choices=Reason.choices)
    opened = models.PositiveIntegerField()
    settled = models.PositiveIntegerField()
    # Of the settled: how many took at most each of tallies.SETTLE_BOUNDS, and more (last).
    took = models.JSONField(default=list)

    class Meta:
        constraints = [
            # One row per hour and reason; also the overview's index: a project's hours.
            models.UniqueConstraint(fields=["project", "hour", "reason"], name="case_hour_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.reason} +{self.opened} -{self.settled}"
