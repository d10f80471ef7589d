"""Cases, what the desk works on: why an effect or a receipt needs a person, how each was
closed (`Resolution`), the operators' comments, bulk actions and the queue's saved views."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from durability.models.effects import Effect, Receipt
from durability.models.links import row_path
from durability.models.projects import Project


class Reason(models.TextChoices):
    UNCERTAIN = "uncertain"
    LATE_SUCCESS = "late_success"
    DUPLICATE_EFFECT = "duplicate_effect"
    KEY_REUSE_CONFLICT = "key_reuse_conflict"
    ORPHAN_RECEIPT = "orphan_receipt"
    VERSION_DRIFT = "version_drift"
    APPROVAL_REQUIRED = "approval_required"
    AUTHORITY_DENIED = "authority_denied"
    UNAUTHORIZED_EFFECT = "unauthorized_effect"
    AUTHORITY_EXCEEDED = "authority_exceeded"


class Severity(models.IntegerChoices):
    LOW = 1, "low"
    MEDIUM = 2, "medium"
    HIGH = 3, "high"
    CRITICAL = 4, "critical"


class Case(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="cases",
        db_index=False,  # case_reason_opened_idx leads with it
    )
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        null=True,
        blank=True,
        related_name="cases",
        db_index=False,  # case_of_effect_idx has it after the project
        db_constraint=False,  # case_effect_same_project_fk (migration 0031)
    )
    receipt = models.ForeignKey(
        Receipt,
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="cases",
        db_index=False,  # case_of_receipt_idx has it after the project
        db_constraint=False,  # case_receipt_same_project_fk (migration 0031)
    )
    reason = models.CharField(max_length=32, choices=Reason.choices)
    severity = models.PositiveSmallIntegerField(choices=Severity.choices)
    # The effect's kind and target and who made its latest intent (Effect.case_names), kept
    # here so that the queue filters and counts its open cases without reading effects.
    kind = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=255, blank=True)
    agent = models.CharField(max_length=255, blank=True)
    workflow = models.CharField(max_length=255, blank=True)
    run_id = models.CharField(max_length=255, blank=True)
    # Its group of similar cases: a digest of what they share (ledger.cases.group_key_of),
    # taken when the case is opened; the grouped queue shows one row per key.
    group_key = models.CharField(max_length=32, blank=True)
    # One sentence a person can read: why the case was opened.
    summary = models.TextField()
    detail = models.JSONField(default=dict, blank=True)
    opened = models.DateTimeField(default=timezone.now)
    closed = models.DateTimeField(null=True, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="cases"
    )
    # Bumped by every change, for compare-and-swap between operators.
    version = models.PositiveIntegerField(default=1)
    # Snoozed (desk.case_actions.case_snooze): out of the default queue from `snoozed_at`
    # until `snoozed_until`, or, with no end, until a newer open case joins its group. Coming
    # back is read from these at query time (desk.queue.snoozed): no job wakes a case.
    snoozed_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "effect", "reason"],
                condition=Q(closed__isnull=True),
                name="case_one_open_per_effect_reason",
            ),
            # What its comments' and notices' foreign keys name (see effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="case_project_pk_uniq"),
        ]
        indexes = [
            # The queue: a project's open cases, oldest first.
            models.Index(
                fields=["project", "opened", "id"],
                name="case_queue_open_idx",
                condition=Q(closed__isnull=True),
            ),
            # The queue sorted by severity (keyset on severity, opened, id).
            models.Index(
                fields=["project", "-severity", "opened", "id"],
                name="case_queue_severity_idx",
                condition=Q(closed__isnull=True),
            ),
            # The queue filtered by reason, and its counts per reason.
            models.Index(
                fields=["project", "reason", "opened", "id"],
                name="case_queue_reason_idx",
                condition=Q(closed__isnull=True),
            ),
            # The grouped queue: a project's open cases per group (counted, first and last
            # seen, the trend), and the cases of one group.
            models.Index(
                fields=["project", "group_key", "opened", "id"],
                name="case_queue_group_idx",
                condition=Q(closed__isnull=True),
                include=["severity"],
            ),
            # The queue's Snoozed view and its count: a project's open cases ever snoozed (the
            # default queue walks case_queue_open_idx and leaves out those still snoozed).
            models.Index(
                fields=["project", "opened", "id"],
                name="case_snoozed_idx",
                condition=Q(closed__isnull=True, snoozed_at__isnull=False),
            ),
            # The overview's last day: cases of a reason opened since, open or closed.
            models.Index(fields=["project", "reason", "opened"], name="case_reason_opened_idx"),
            # The backlog's hours not tallied yet (tallies.case_hours): cases opened since,
            # and cases settled since.
            models.Index(fields=["project", "opened"], name="case_project_opened_idx"),
            models.Index(
                fields=["project", "closed"],
                name="case_project_closed_idx",
                condition=Q(closed__isnull=False),
            ),
            # An effect's cases, open or closed: the effect page, the ledger's open case of
            # a reason, retention's "no open case" test.
            models.Index(fields=["project", "effect", "opened"], name="case_of_effect_idx"),
            # The orphan-receipt case of a receipt, given its effect once an intent names
            # its key (ledger.evidence).
            models.Index(
                fields=["project", "receipt"],
                name="case_of_receipt_idx",
                condition=Q(receipt__isnull=False),
            ),
        ]
        # Granted to the roles' groups (durability.accounts.roles); checked per project membership.
        permissions = [
            ("resolve_case", "Can settle and acknowledge cases"),
            ("assign_case", "Can assign cases"),
            ("comment_case", "Can comment on cases"),
        ]

    def __str__(self) -> str:
        return f"{self.reason} #{self.pk}"

    def get_absolute_url(self) -> str:
        return row_path("case", self.pk)

    @property
    def is_open(self) -> bool:
        return self.closed is None


ACKNOWLEDGED = "acknowledged"
# Each way a case is closed (`Resolution.action`: a settling event, or what else closed
# it), in words a person says.
CLOSED_AS = {
    "attest_happened": "it happened",
    "probe_found": "it happened (the reconciler found it)",
    "attest_not_happened": "it did not happen",
    "probe_not_found": "it did not happen (the reconciler did not find it)",
    "compensate": "compensated",
    "abandon": "abandoned",
    "approved": "approved",
    "denied": "denied",
    "retried": "retried under its replay policy",
    "auto_resolved": "settled by the evidence that arrived",
}


def closed_status(action: str) -> str:
    """A case's status once closed by `action` (a `Resolution.action`), in words."""
    if action == ACKNOWLEDGED:
        return "Acknowledged"
    return f"Closed: {CLOSED_AS.get(action, action.replace('_', ' '))}"


def actor_named(actor: str, key_names: Mapping[str, str] | None = None) -> str:
    """Who an actor (`user:alice`, `reconciler:http`, `api:tb_1a2b`) is, for a person: an
    API key by its name when `key_names` (`ApiKey.names`) has it."""
    kind, _, name = actor.partition(":")
    if kind == "user":
        return name
    if kind == "reconciler":
        return f"the {name} reconciler"
    if kind == "api":
        named = (key_names or {}).get(name)
        return f"{named} (key {name}…)" if named else f"an agent (key {name})"
    if kind == "webhook":
        return f"the webhook {name}"
    if kind == "system":
        return f"Tallybook ({name})"
    return actor


class Resolution(models.Model):
    """How a case was closed. Immutable."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # read by case only
    )
    case = models.OneToOneField(Case, models.CASCADE, related_name="resolution")
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32)
    note = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.status} by {actor_named(self.actor)}"

    @property
    def status(self) -> str:
        """How the case was closed, in words ("Acknowledged", "Closed: it did not happen")."""
        return closed_status(self.action)


class Comment(models.Model):
    """An operator's note on a case. Immutable, like the rest of the story."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # comment_of_case_idx leads with it
    )
    case = models.ForeignKey(
        Case,
        models.CASCADE,
        related_name="comments",
        db_index=False,  # comment_of_case_idx has it after the project
        db_constraint=False,  # comment_case_same_project_fk (migration 0031)
    )
    actor = models.CharField(max_length=150)
    body = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "id"]
        indexes = [
            # A case's comments, in order.
            models.Index(fields=["project", "case", "created", "id"], name="comment_of_case_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} on {self.case}"


class BulkVerb(models.TextChoices):
    ASSIGN = "assign", "assign"
    NOT_HAPPENED = "not_happened", "resolve as did not happen"
    ACKNOWLEDGE = "acknowledge", "acknowledge"


class BulkAction(models.Model):
    """One action over many cases; its counters are the progress a person watches."""

    project = models.ForeignKey(Project, models.CASCADE, related_name="bulk_actions")
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=16, choices=BulkVerb.choices)
    note = models.TextField(blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The cases the preview counted, fixed when the action was confirmed.
    case_ids = models.JSONField(default=list)
    total = models.PositiveIntegerField()
    done = models.PositiveIntegerField(default=0)
    # Cases already closed, changed or not eligible when their turn came.
    skipped = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.verb} × {self.total} by {self.actor}"


class SavedView(models.Model):
    """A named filter of the queue: its owner's own, or shared with the project's members."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="saved_views",
        db_index=False,  # savedview_one_name_per_owner leads with it
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    name = models.CharField(max_length=80)
    # The queue's filter as QueueQuery.query_string() writes it: only the filter's own fields,
    # validated, so that the view's link leads to the queue and nowhere else.
    query = models.CharField(max_length=1000)
    shared = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "owner", "name"], name="savedview_one_name_per_owner"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return f"{reverse('queue')}?{self.query}"
