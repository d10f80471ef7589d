"""Authority and inbound evidence: grants (versioned, never edited in place), the approvals an
effect waits for and their sign-offs, and the webhook sources that post signed receipts with
their deliveries."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from durability.models.effects import Effect
from durability.models.links import row_path
from durability.models.projects import Project


class Grant(models.Model):
    """Authority: which agents or workflows may perform which effects where, within which
    limits, until when, and whether a person must approve each one first.

    Never edited in place: a change is a new version that supersedes this one. Every
    version of a grant shares its `lineage`, and the limits count effects across versions.
    """

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="grants",
        db_index=False,  # grant_project_pk_uniq leads with it
    )
    lineage = models.UUIDField(default=uuid.uuid4, editable=False)
    version = models.PositiveIntegerField(default=1)
    supersedes = models.OneToOneField(
        "self", models.PROTECT, null=True, blank=True, related_name="superseded_by"
    )
    name = models.CharField(max_length=100)
    # fnmatch patterns, matched case-sensitively.
    principal = models.CharField(
        max_length=255,
        default="*",
        help_text="The agent or workflow allowed (context.agent or context.workflow), a pattern.",
    )
    kinds = models.JSONField(default=list, help_text="Effect kinds allowed, as patterns.")
    targets = models.JSONField(default=list, help_text="Target systems allowed, as patterns.")
    currency = models.CharField(max_length=3, blank=True)
    max_amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    # Over the last 24 hours, a rolling window: no reset at midnight to race.
    max_daily_amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    max_count = models.PositiveIntegerField(null=True, blank=True)
    count_period_s = models.PositiveIntegerField(null=True, blank=True)
    requires_approval = models.BooleanField(default=False)
    # Amounts above this need a second approver, a different person from the first.
    second_approval_above = models.DecimalField(
        max_digits=20, decimal_places=6, null=True, blank=True
    )
    expires = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    granted_by = models.CharField(max_length=150)
    created = models.DateTimeField(default=timezone.now)
    superseded_at = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            # What its effects' foreign key names (see Effect's effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="grant_project_pk_uniq"),
            # Also the look-up of a lineage's versions.
            models.UniqueConstraint(
                fields=["lineage", "version"], name="grant_lineage_version_uniq"
            ),
            # An intent naming any version is checked against the one current version.
            models.UniqueConstraint(
                fields=["lineage"],
                condition=Q(superseded_at__isnull=True),
                name="grant_one_current_per_lineage",
            ),
            models.CheckConstraint(
                condition=Q(
                    max_amount__isnull=True,
                    max_daily_amount__isnull=True,
                    second_approval_above__isnull=True,
                )
                | ~Q(currency=""),
                name="grant_amounts_have_currency",
            ),
            models.CheckConstraint(
                condition=Q(max_count__isnull=True, count_period_s__isnull=True)
                | Q(max_count__isnull=False, count_period_s__isnull=False),
                name="grant_count_has_period",
            ),
            models.CheckConstraint(
                condition=Q(second_approval_above__isnull=True) | Q(requires_approval=True),
                name="grant_second_approval_needs_approval",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (grant {self.pk} v{self.version})"

    def get_absolute_url(self) -> str:
        return row_path("grant", self.pk)

    def status(self, now: datetime | None = None) -> str:
        if self.revoked:
            return "revoked"
        if self.superseded_at:
            return "superseded"
        if self.expires and self.expires <= (now or timezone.now()):
            return "expired"
        return "live"


class ApprovalStatus(models.TextChoices):
    OPEN = "open"
    APPROVED = "approved"
    DENIED = "denied"
    # The effect stopped awaiting it without a signature (decided through the state machine
    # directly): nothing left to sign.
    CLOSED = "closed"


class Approval(models.Model):
    """The go-ahead an effect waits for: one person's, or two people's above the grant's
    threshold."""

    project = models.ForeignKey(Project, models.CASCADE, related_name="approvals")
    effect = models.OneToOneField(Effect, models.CASCADE, related_name="approval")
    grant = models.ForeignKey(Grant, models.PROTECT, related_name="approvals")
    needed = models.PositiveSmallIntegerField(default=1)
    # The asking intent's context: no attempt exists until the effect is approved.
    context = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=8, choices=ApprovalStatus.choices, default=ApprovalStatus.OPEN
    )
    created = models.DateTimeField(default=timezone.now)
    decided = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(needed__in=[1, 2]), name="approval_needed_1_or_2"),
            models.CheckConstraint(
                condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"
            ),
        ]
        indexes = [
            # The approvals inbox: a project's open approvals, oldest first.
            models.Index(
                fields=["project", "created", "id"],
                name="approval_inbox_idx",
                condition=Q(status="open"),
            ),
            # The inbox's "recently decided" list.
            models.Index(
                fields=["project", "-decided"],
                name="approval_decided_idx",
                condition=~Q(status="open"),
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} of {self.effect_id} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("approval", args=[self.pk])

    @property
    def closed_why(self) -> str:
        """Why a closed approval takes no signature, in the words its pages and 409 use."""
        return f"the effect was settled without it (it is now {self.effect.state})"


class SignoffVerdict(models.TextChoices):
    APPROVE = "approve"
    DENY = "deny"


class Signoff(models.Model):
    """One person's verdict on an approval. Immutable; one per person per approval."""

    approval = models.ForeignKey(
        Approval,
        models.CASCADE,
        related_name="signoffs",
        db_index=False,  # signoff_one_per_person leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=8, choices=SignoffVerdict.choices)
    reason = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "id"]
        constraints = [
            # Two approvals must come from two people.
            models.UniqueConstraint(fields=["approval", "user"], name="signoff_one_per_person"),
            models.CheckConstraint(
                condition=Q(verdict__in=SignoffVerdict.values), name="signoff_verdict_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.user_id}"


class WebhookKind(models.TextChoices):
    GENERIC = "generic", "generic JSON"
    GITHUB = "github", "GitHub push"


class WebhookSource(models.Model):
    """A provider that posts signed evidence to /hooks/<name>/ (docs/webhooks.md)."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="webhook_sources",
        db_index=False,  # webhooksource_project_pk_uniq leads with it
    )
    # Unique over all projects: the URL names the source, and the source its project.
    name = models.SlugField(max_length=50, unique=True)
    kind = models.CharField(max_length=8, choices=WebhookKind.choices)
    system = models.CharField(max_length=100, help_text="The system its receipts come from.")
    # Kept as given: verifying an HMAC needs the key itself, not a digest of it.
    secret = models.CharField(max_length=200)
    mapping = models.JSONField(
        default=dict, blank=True, help_text="Where the payload holds each field."
    )
    tolerance_s = models.PositiveIntegerField(
        default=300, help_text="How far the signed timestamp may be from now, in seconds."
    )
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # What its deliveries' foreign key names (see Effect's effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="webhooksource_project_pk_uniq"),
            models.CheckConstraint(
                condition=Q(kind__in=WebhookKind.values), name="webhook_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class WebhookDelivery(models.Model):
    """A verified delivery, recorded once: the same delivery id, or the same signed bytes
    under another id, again changes nothing."""

    # The source's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # webhook_delivery_once_uniq leads with it
    )
    source = models.ForeignKey(
        WebhookSource,
        models.CASCADE,
        related_name="deliveries",
        db_index=False,  # webhook_delivery_once_uniq has it after the project
        db_constraint=False,  # webhookdelivery_source_same_project_fk (migration 0031)
    )
    delivery_id = models.CharField(max_length=255)
    # SHA-256 of the bytes the signature covers. The delivery id is not signed: a captured
    # delivery sent again under a new id is known by this. Deliveries received before it
    # was kept have "".
    signed_digest = models.CharField(max_length=64, default="", editable=False)
    received = models.DateTimeField(default=timezone.now)
    receipts = models.PositiveIntegerField(default=0)
    # Items of the payload that named no effect key (e.g. commits without the trailer).
    ignored = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "source", "delivery_id"], name="webhook_delivery_once_uniq"
            ),
            models.UniqueConstraint(
                fields=["project", "source", "signed_digest"],
                condition=~Q(signed_digest=""),
                name="webhook_delivery_signed_once_uniq",
            ),
        ]
        indexes = [
            # The source page: its latest deliveries.
            models.Index(
                fields=["project", "source", "-received"], name="webhook_delivery_recent_idx"
            ),
        ]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.source_id}:{self.delivery_id}"
