"""The audit trail: what an entry records (`AuditAction`), and the append-only, hash-chained
entries themselves (written by `durability.audit`)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from durability.models.cases import Case
from durability.models.effects import Effect
from durability.models.projects import Project


class AuditAction(models.TextChoices):
    """What an audit entry records: a state machine event, or an audited change of anything else.

    The label is how a case's story names the moment.
    """

    # The state machine's events (durability.ledger.machine.Event), one entry per transition.
    INTENT = "intent", "Intent recorded"
    REQUIRE_APPROVAL = "require_approval", "Require approval"
    REFUSE = "refuse", "Refuse"
    APPROVE = "approve", "Approve"
    DENY = "deny", "Deny"
    RETRY = "retry", "New attempt"
    RECEIPT = "receipt", "Receipt"
    FAILURE = "failure", "Failed: nothing happened"
    TIMEOUT = "timeout", "Timed out"
    DEADLINE = "deadline", "Deadline passed"
    INTERRUPTION = "interruption", "Interrupted"
    PROBE_FOUND = "probe_found", "Reconciler found it"
    PROBE_NOT_FOUND = "probe_not_found", "Reconciler: not found, trusted"
    ATTEST_HAPPENED = "attest_happened", "Operator: it happened"
    ATTEST_NOT_HAPPENED = "attest_not_happened", "Operator: it did not happen"
    COMPENSATE = "compensate", "Compensated"
    ABANDON = "abandon", "Abandoned"
    # The ledger, without a transition.
    ATTEMPT = "attempt", "Attempt"
    RECEIPT_CONFIRMED = "receipt_confirmed", "Receipt confirmed"
    CASE_OPENED = "case_opened", "Case opened"
    CASE_REPEATED = "case_repeated", "Case seen again"
    CASE_CLOSED = "case_closed", "Case closed"
    # The desk.
    CASE_ASSIGNED = "case_assigned", "Assigned"
    CASE_COMMENTED = "case_commented", "Comment"
    CASE_SNOOZED = "case_snoozed", "Snoozed"
    CASE_UNSNOOZED = "case_unsnoozed", "Snooze ended"
    BULK_STARTED = "bulk_started", "Bulk started"
    PROBE = "probe", "Probe"
    # Authority.
    GRANT_CREATED = "grant_created", "Grant created"
    GRANT_SUPERSEDED = "grant_superseded", "Grant superseded"
    GRANT_REVOKED = "grant_revoked", "Grant revoked"
    APPROVAL_SIGNED = "approval_signed", "Approval signed"
    WEBHOOK_SOURCE_CREATED = "webhook_source_created", "Webhook source created"
    WEBHOOK_SOURCE_ENABLED = "webhook_source_enabled", "Webhook source enabled"
    WEBHOOK_SOURCE_DISABLED = "webhook_source_disabled", "Webhook source disabled"
    # Accounts.
    MEMBER_ADDED = "member_added", "Member added"
    MEMBER_ROLE_CHANGED = "member_role_changed", "Member role changed"
    MEMBER_REMOVED = "member_removed", "Member removed"
    MEMBER_INVITED = "member_invited", "Member invited"
    NOTIFICATIONS_SET = "notifications_set", "Notifications set"
    APIKEY_CREATED = "apikey_created", "Apikey created"
    APIKEY_REVOKED = "apikey_revoked", "Apikey revoked"
    AUTHORITY_POLICY_SET = "authority_policy_set", "Authority policy set"
    EFFECT_TIMEOUT_SET = "effect_timeout_set", "Effect timeout set"
    REDACTION_SET = "redaction_set", "Redaction set"
    # Retention (durability.retention).
    RETENTION_SET = "retention_set", "Retention set"
    PAYLOADS_PRUNED = "payloads_pruned", "Payloads pruned"
    ARCHIVE_WRITTEN = "archive_written", "Archive written"
    # Logins (durability.accounts.lockouts): in every project the user is a member of.
    LOGIN_LOCKED_OUT = "login_locked_out", "Login locked out"
    LOGIN_UNLOCKED = "login_unlocked", "Login unlocked"


def action_label(action: str) -> str:
    """An audit action in words; one no longer among the choices still reads as words."""
    if action in AuditAction.values:
        return str(AuditAction(action).label)
    return action.replace("_", " ").capitalize()


class AuditEntry(models.Model):
    """Append-only and hash-chained: each entry hashes the one before it in its chain.

    Entries about an effect chain per effect (appended under the effect's row lock, which
    every state change holds anyway, so projects do not serialise on one chain head);
    entries about no effect chain per project.
    """

    project = models.ForeignKey(
        Project,
        models.PROTECT,
        related_name="audit_entries",
        db_index=False,  # audit_project_recent_idx leads with it
    )
    seq = models.PositiveBigIntegerField()
    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=AuditAction.choices)
    effect = models.ForeignKey(
        Effect,
        models.DO_NOTHING,
        null=True,
        blank=True,
        db_constraint=False,
        related_name="+",
        db_index=False,  # audit_of_effect_uniq has it after the project
    )
    case = models.ForeignKey(
        Case,
        models.DO_NOTHING,
        null=True,
        blank=True,
        db_constraint=False,
        related_name="+",
        db_index=False,  # audit_of_case_recent_idx has it after the project
    )
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    data = models.JSONField(default=dict, blank=True)
    # SHA-256 of `data`'s canonical JSON, which the hash covers in place of `data` itself, so
    # that retention may empty `data` and the chain still verifies (durability.audit).
    # Empty for an entry hashed over its whole data, before digests: it cannot be pruned.
    data_digest = models.CharField(max_length=64, blank=True, default="", editable=False)
    # When retention emptied `data` through the one path the database lets through
    # (durability_audit_prune, migration 0023); its digest still stands for it.
    pruned = models.DateTimeField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["id"]
        constraints = [
            # An effect's chain: one entry per seq; also the index of its entries in order
            # (the effect page's story, verifyaudit, retention's chain head).
            models.UniqueConstraint(
                fields=["project", "effect", "seq"],
                condition=Q(effect__isnull=False),
                name="audit_of_effect_uniq",
            ),
            models.UniqueConstraint(
                fields=["project", "seq"],
                condition=Q(effect__isnull=True),
                name="audit_project_seq_uniq",
            ),
        ]
        indexes = [
            # The audit log page: newest first, keyset on id (seq counts within one chain).
            models.Index(fields=["project", "-id"], name="audit_project_recent_idx"),
            # The audit log page filtered by user, newest first.
            models.Index(fields=["project", "actor", "-id"], name="audit_project_actor_idx"),
            # The audit log page filtered by action, newest first.
            models.Index(fields=["project", "action", "-id"], name="audit_project_action_idx"),
            # A case's latest entry (the case page's "closed by").
            models.Index(
                fields=["project", "case", "-id"],
                name="audit_of_case_recent_idx",
                condition=Q(case__isnull=False),
            ),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.project} #{self.pk} {self.action}"
