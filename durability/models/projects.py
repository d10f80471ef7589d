"""Projects and the people in them: the project and its policies, memberships and their roles,
invitations, and a user's own preferences (their time zone)."""

from __future__ import annotations

import functools
import zoneinfo
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import IntegrityError, connection, models
from django.db.models import Q
from django.utils import timezone


class AuthorityPolicy(models.TextChoices):
    """What an intent that names no grant gets (durability.ledger.grant_check).

    Under either audit policy the effect proceeds with no grant, which the authority report
    and the effect page show; only `audit_cases` also opens a case for each such effect.
    """

    AUDIT = "audit", "audit (proceed; the authority report lists each one)"
    AUDIT_CASES = "audit_cases", "audit with cases (proceed, and open a low-severity case for each)"
    ENFORCE = "enforce", "enforce (deny)"


# An hour: longer than any tool call should take, short enough that a crash is in the
# desk the same day. A project sets its own (accounts.members.project_policy_set).
DEFAULT_EFFECT_TIMEOUT_S = 3600
MAX_EFFECT_TIMEOUT_S = 7 * 24 * 3600


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(default=timezone.now)
    # Head of the hash chain of the project's audit entries that name no effect.
    audit_seq = models.PositiveBigIntegerField(default=0, editable=False)
    audit_head = models.CharField(max_length=64, default="0" * 64, editable=False)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    # What an intent that names no grant gets (durability.ledger.grant_check).
    authority_policy = models.CharField(
        max_length=16, choices=AuthorityPolicy.choices, default=AuthorityPolicy.AUDIT
    )
    # The timeout of an effect whose intent declares none: no attempt stays pending without
    # a deadline (the sweep times it out, durability.ledger.evidence.deadlines_sweep).
    effect_timeout_s = models.PositiveIntegerField(default=DEFAULT_EFFECT_TIMEOUT_S)
    # The project's own secrets, redacted on top of the built-in ones (durability.redaction):
    # regular expressions, checked when saved, and field or attribute names.
    redaction_patterns = models.JSONField(default=list, blank=True)
    redaction_keys = models.JSONField(default=list, blank=True)
    # When an operator asked for the project to be deleted (durability.retention.projects):
    # its keys are revoked and its members gone at that moment, and a job deletes its rows.
    deleting = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        permissions = [("manage_project", "Can manage the project's keys, settings and members")]

    def __str__(self) -> str:
        return self.name


# What a write meets when its project's rows are deleted under it (after its key, webhook
# source or membership let it in): a foreign key refused at its commit, or a row it locks
# (a project's or an effect's audit chain head) not found.
GONE_UNDER_A_WRITE = (IntegrityError, ObjectDoesNotExist)


def project_gone(project_id: int) -> bool:
    """Whether the project is deleted or being deleted (durability.retention.projects).
    Asked once a write failed with one of GONE_UNDER_A_WRITE, never before it: the requests
    of a live project pay nothing for it. Not in a transaction that failed without a
    savepoint, which can run no query: there, False."""
    if connection.needs_rollback:
        return False
    return not Project.objects.filter(pk=project_id, deleting=None).exists()


class Role(models.TextChoices):
    """A member's role in one project; each is the Django group holding its permissions."""

    VIEWER = "viewer", "viewer (read)"
    OPERATOR = "operator", "operator (resolve, assign, comment)"
    ADMIN = "admin", "admin (keys, settings, members)"


class MembershipQuerySet(models.QuerySet["Membership"]):
    def live(self) -> MembershipQuerySet:
        """The memberships of projects not being deleted: a project being deleted is no
        one's (durability.retention.projects), whoever was made a member after its mark."""
        return self.filter(project__deleting=None)


class Membership(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        db_index=False,  # membership_uniq leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created = models.DateTimeField(default=timezone.now)
    # Which emails about this project's cases the member receives (durability.notices).
    notify_assigned = models.BooleanField("a case is assigned to me", default=True)
    notify_mentioned = models.BooleanField("a comment mentions me (@name)", default=True)
    notify_overdue = models.BooleanField("a case of mine goes overdue", default=True)

    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_uniq"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Invitation(models.Model):
    """An existing user asked to join a project: they become a member when they accept it,
    through the link emailed to them (durability.accounts.members); until then the project
    holds nothing of theirs and its admins learn nothing about them."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        db_index=False,  # invitation_uniq leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    # Who invited ("user:ada"), for the email and the audit entry of its acceptance.
    actor = models.CharField(max_length=150)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="invitation_uniq"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="invitation_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.project} ({self.role})"


class Preference(models.Model):
    """A user's own settings, the same in every project of theirs."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True, related_name="preference"
    )
    # The zone pages show moments in: a name of the zoneinfo database; blank for the
    # browser's (durability.accounts.timezones).
    time_zone = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.user}'s preferences"

    @staticmethod
    def zone_name_of(user: Any) -> str:
        """The zone name of the user's Preference; blank when they chose none. One query."""
        chosen = Preference.objects.filter(user=user).values_list("time_zone", flat=True)
        return chosen.first() or ""


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone the zoneinfo database knows (read from disk once per process)."""
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str | None) -> zoneinfo.ZoneInfo | None:
    """The zone of that name; None for a blank name or one zoneinfo does not know."""
    return zoneinfo.ZoneInfo(name) if name and name in zone_names() else None
