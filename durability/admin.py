"""Read-mostly admin: the ledger changes only through the state machine."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from durability import jobs
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
    Invitation,
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
from durability.retention import jobs as retention_jobs
from durability.retention import projects


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


class InvitationInline(admin.TabularInline):  # type: ignore[type-arg]
    """Invitations not accepted yet: staff see them, and withdraw one by deleting it."""

    model = Invitation
    extra = 0
    readonly_fields = ["user", "role", "actor", "created"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # an admin of the project invites, from its settings page


class DeleteProjectForm(forms.Form):
    name = forms.CharField(label="Type the project's name to confirm", max_length=100)

    def __init__(self, *args: Any, project: Project, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project = project

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if name != self.project.name:
            raise forms.ValidationError(f"This is not the project's name ({self.project.name}).")
        return name


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "created", "deleting"]
    # Redaction is set on the settings page, which checks the patterns and audits the change.
    readonly_fields = [
        "audit_seq",
        "audit_head",
        "redaction_patterns",
        "redaction_keys",
        "deleting",
    ]
    inlines = [MembershipInline, InvitationInline]
    actions = ["delete_in_background"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Django's cascading delete would gather every row of the project in memory and
        # delete them in one request, racing with ingest: `delete_in_background` instead.
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.deleting is not None:
            return False
        return super().has_change_permission(request, obj)

    def get_urls(self) -> list[URLPattern]:
        own = path(
            "<int:project_id>/delete-in-background/",
            self.admin_site.admin_view(self.delete_in_background_view),
            name="durability_project_delete_in_background",
        )
        return [own, *super().get_urls()]

    @admin.action(description="Delete project (in the background)")
    def delete_in_background(
        self, request: HttpRequest, queryset: QuerySet[Project]
    ) -> HttpResponse | None:
        chosen = list(queryset.values_list("pk", flat=True)[:2])
        if len(chosen) != 1:
            self.message_user(request, "Choose one project to delete.", messages.ERROR)
            return None
        return HttpResponseRedirect(
            reverse("admin:durability_project_delete_in_background", args=[chosen[0]])
        )

    def delete_in_background_view(self, request: HttpRequest, project_id: int) -> HttpResponse:
        """Ask for the project's name; then revoke its keys, mark it, enqueue the deletion."""
        if not request.user.has_perm("durability.delete_project"):
            raise PermissionDenied
        project = get_object_or_404(Project, pk=project_id)
        changelist = reverse("admin:durability_project_changelist")
        if project.deleting is not None:
            self.message_user(request, f"{project} is already being deleted.", messages.WARNING)
            return HttpResponseRedirect(changelist)
        form = DeleteProjectForm(request.POST or None, project=project)
        if request.method == "POST" and form.is_valid():
            if projects.project_delete_begin(project=project, actor=f"admin:{request.user}"):
                jobs.enqueue(retention_jobs.project_delete, project.pk)
                self.log_change(request, project, "Marked for deletion; its rows are deleted.")
            self.message_user(
                request,
                f"{project}: its keys are revoked and its members removed; its rows are being"
                " deleted in the background.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(changelist)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Delete {project} in the background",
            "project": project,
            "form": form,
            "keys": project.api_keys.filter(revoked_at=None).count(),
        }
        status = 400 if request.method == "POST" else 200
        return TemplateResponse(
            request, "admin/durability/project/delete_in_background.html", context, status=status
        )


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
