"""Read-mostly admin: the ledger changes only through the state machine."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from durability.models import (
    ApiKey,
    Approval,
    Attempt,
    AuditEntry,
    BulkAction,
    Case,
    CaseAlert,
    Comment,
    Effect,
    Grant,
    Membership,
    Notice,
    Probe,
    Project,
    Receipt,
    ReconcilerConfig,
    Resolution,
    Signoff,
    WebhookDelivery,
    WebhookSource,
)


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "created"]
    # Redaction is set on the settings page, which checks the patterns and audits the change.
    readonly_fields = ["audit_seq", "audit_head", "redaction_patterns", "redaction_keys"]
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["prefix", "name", "project", "created", "last_used_at", "revoked_at"]
    readonly_fields = ["project", "prefix", "digest", "created", "last_used_at"]
    fields = ["project", "name", "prefix", "digest", "created", "last_used_at", "revoked_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are issued by `manage.py createapikey`, which shows the key once


@admin.register(Effect)
class EffectAdmin(ReadOnly):
    list_display = ["key", "project", "kind", "target", "state", "late", "attempt_count", "created"]
    list_filter = ["state", "replay", "late"]
    search_fields = ["key"]
    list_select_related = ["project"]


@admin.register(Attempt)
class AttemptAdmin(ReadOnly):
    list_display = ["effect", "number", "started", "deadline", "worker"]
    list_select_related = ["effect"]


@admin.register(Receipt)
class ReceiptAdmin(ReadOnly):
    list_display = ["key", "system", "external_id", "strength", "late", "received"]
    list_filter = ["strength", "late"]
    search_fields = ["key", "external_id"]


@admin.register(Case)
class CaseAdmin(ReadOnly):
    list_display = ["id", "reason", "severity", "effect", "opened", "closed"]
    list_filter = ["reason", "severity"]
    list_select_related = ["effect"]


@admin.register(Resolution)
class ResolutionAdmin(ReadOnly):
    list_display = ["case", "action", "actor", "created"]


@admin.register(Comment)
class CommentAdmin(ReadOnly):
    list_display = ["case", "actor", "created"]


@admin.register(BulkAction)
class BulkActionAdmin(ReadOnly):
    list_display = ["verb", "project", "actor", "total", "done", "skipped", "created", "finished"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnly):
    list_display = ["project", "seq", "at", "actor", "action", "from_state", "to_state"]
    list_filter = ["action"]
    list_select_related = ["project"]


@admin.register(ReconcilerConfig)
class ReconcilerConfigAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Reconcilers are configured here; `clean()` validates the config against its kind."""

    list_display = ["target", "kind", "project", "enabled", "grace_s", "interval_s", "updated"]
    list_filter = ["kind", "enabled"]
    list_select_related = ["project"]
    search_fields = ["target"]


@admin.register(Probe)
class ProbeAdmin(ReadOnly):
    list_display = ["effect", "attempt", "kind", "answer", "settled", "requested_by", "started"]
    list_filter = ["answer", "kind"]
    list_select_related = ["effect"]


@admin.register(CaseAlert)
class CaseAlertAdmin(ReadOnly):
    list_display = ["case", "created", "sent", "tries", "error"]


@admin.register(Notice)
class NoticeAdmin(ReadOnly):
    list_display = ["kind", "user", "case", "created", "sent", "tries", "error"]
    list_filter = ["kind", "project"]


# Grants, approvals and webhook sources change through the authority pages, audited.
@admin.register(Grant)
class GrantAdmin(ReadOnly):
    list_display = ["name", "id", "version", "project", "principal", "granted_by", "created"]
    list_filter = ["requires_approval"]
    list_select_related = ["project"]


@admin.register(Approval)
class ApprovalAdmin(ReadOnly):
    list_display = ["effect", "grant", "needed", "status", "created", "decided"]
    list_filter = ["status"]
    list_select_related = ["effect", "grant"]


@admin.register(Signoff)
class SignoffAdmin(ReadOnly):
    list_display = ["approval", "user", "verdict", "created"]


@admin.register(WebhookSource)
class WebhookSourceAdmin(ReadOnly):
    list_display = ["name", "project", "kind", "system", "enabled", "created"]
    exclude = ["secret"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    list_display = ["source", "delivery_id", "received", "receipts", "ignored"]
    list_select_related = ["source"]
