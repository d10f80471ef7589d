"""What is sent about cases: a case's alert to the project's webhook, and the emails to people
(`Notice`, sent by `durability.notices`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from durability.models.cases import BulkAction, Case, Comment
from durability.models.projects import Project


class CaseAlert(models.Model):
    """A case that reached its reason's alert threshold; `sent` once the webhook took it."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # read by case only
    )
    case = models.OneToOneField(Case, models.CASCADE, related_name="alert")
    created = models.DateTimeField(default=timezone.now)
    sent = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"alert for case {self.case_id}"


class NoticeKind(models.TextChoices):
    ASSIGNED = "assigned", "assigned to you"
    ASSIGNED_MANY = "assigned_many", "assigned cases to you"
    MENTIONED = "mentioned", "mentioned you"
    OVERDUE = "overdue", "overdue"
    INVITED = "invited", "invited you"
    # An existing user asked to join a project: the email carries the link to accept.
    JOIN = "join", "invited you to join"


class Notice(models.Model):
    """An email to one person, written in the transaction of what caused it and sent by a
    job after the commit (durability.notices); `sent` once the mail server took it."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="notices",
        db_index=False,  # notice_of_case_idx leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=16, choices=NoticeKind.choices)
    case = models.ForeignKey(
        Case,
        models.CASCADE,
        null=True,
        blank=True,
        related_name="notices",
        db_index=False,  # notice_of_case_idx has it after the project
        db_constraint=False,  # notice_case_same_project_fk (migration 0031)
    )
    # Cases, comments and bulk actions go only with their project: nothing reads notices by
    # these.
    comment = models.ForeignKey(
        Comment, models.CASCADE, null=True, blank=True, related_name="notices", db_index=False
    )
    # The bulk assignment an `assigned_many` notice sums up, in one email for all its cases.
    bulk = models.ForeignKey(
        BulkAction, models.CASCADE, null=True, blank=True, related_name="notices", db_index=False
    )
    # Who caused it ("user:ada"); empty for the scheduler (overdue).
    actor = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(default=timezone.now)
    sent = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            # The overdue scan's marker: a case is announced overdue once, however often
            # (and however many schedulers at once) the scan runs.
            models.UniqueConstraint(
                fields=["project", "case"], condition=Q(kind="overdue"), name="notice_overdue_once"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["invited", "join"])
                | Q(kind="assigned_many", bulk__isnull=False)
                | Q(case__isnull=False),
                name="notice_case_named",
            ),
        ]
        indexes = [
            # The scheduled pass: emails not sent yet, oldest first.
            models.Index(fields=["created"], name="notice_unsent_idx", condition=Q(sent=None)),
            # A case's notices.
            models.Index(
                fields=["project", "case"],
                name="notice_of_case_idx",
                condition=Q(case__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.user_id}"
