"""Grants, webhook sources, approvals and the authority report."""

from __future__ import annotations

from django.urls import path

from durability.authority import views

urlpatterns = [
    path("authority/", views.authority, name="authority"),
    path("authority/grants/new/", views.grant_new, name="grant-new"),
    path("authority/grants/<int:grant_id>/", views.grant, name="grant"),
    path(
        "authority/grants/<int:grant_id>/supersede/", views.grant_supersede, name="grant-supersede"
    ),
    path("authority/grants/<int:grant_id>/revoke/", views.grant_revoke, name="grant-revoke"),
    path("authority/webhooks/", views.webhook_sources, name="webhook-sources"),
    path(
        "authority/webhooks/<int:source_id>/toggle/",
        views.webhook_source_toggle,
        name="webhook-source-toggle",
    ),
    path("authority/audit/", views.authority_report, name="authority-audit"),
    path("authority/audit.csv", views.authority_report_csv, name="authority-audit-csv"),
    path("approvals/", views.approvals_inbox, name="approvals"),
    path("approvals/<int:approval_id>/", views.approval, name="approval"),
    path("approvals/<int:approval_id>/sign/", views.approval_sign, name="approval-sign"),
]
