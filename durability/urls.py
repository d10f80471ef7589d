from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from durability.accounts import views as settings_views
from durability.api import views as api
from durability.api import webhooks
from durability.authority import views as authority_views
from durability.desk import overview, views
from durability.desk import views as desk
from durability.reconcilers import views as probe_views

api_v1 = [
    path("api/v1/intents", api.intents, name="api-intents"),
    path("api/v1/receipts", api.receipts, name="api-receipts"),
    path("api/v1/failures", api.failures, name="api-failures"),
    path("api/v1/timeouts", api.timeouts, name="api-timeouts"),
    path("api/v1/effects", api.effects, name="api-effects"),
    path("api/v1/effects/<int:effect_id>", api.effect_detail, name="api-effect"),
    path("api/v1/openapi.json", api.openapi, name="api-openapi"),
    path("api/v1/grants", api.grants, name="api-grants"),
    path("api/v1/grants/<int:grant_id>", api.grant_detail, name="api-grant"),
]

authority = [
    path("hooks/<slug:name>/", webhooks.hook, name="hook"),
    path("authority/", authority_views.authority, name="authority"),
    path("authority/grants/new/", authority_views.grant_new, name="grant-new"),
    path("authority/grants/<int:grant_id>/", authority_views.grant, name="grant"),
    path(
        "authority/grants/<int:grant_id>/supersede/",
        authority_views.grant_supersede,
        name="grant-supersede",
    ),
    path(
        "authority/grants/<int:grant_id>/revoke/",
        authority_views.grant_revoke,
        name="grant-revoke",
    ),
    path("authority/webhooks/", authority_views.webhook_sources, name="webhook-sources"),
    path(
        "authority/webhooks/<int:source_id>/toggle/",
        authority_views.webhook_source_toggle,
        name="webhook-source-toggle",
    ),
    path("authority/audit/", authority_views.authority_audit_page, name="authority-audit"),
    path("authority/audit.csv", authority_views.authority_audit_csv, name="authority-audit-csv"),
    path("approvals/", authority_views.approvals_inbox, name="approvals"),
    path("approvals/<int:approval_id>/", authority_views.approval, name="approval"),
    path("approvals/<int:approval_id>/sign/", authority_views.approval_sign, name="approval-sign"),
]


urlpatterns = [
    *api_v1,
    *authority,
    path("", overview.index, name="index"),
    path("effects/", views.effects, name="effects"),
    path("effects/<int:effect_id>/", views.effect, name="effect"),
    path("queue/", desk.queue, name="queue"),
    path("queue/pulse/", desk.queue_pulse, name="queue-pulse"),
    path("queue/bulk/preview/", desk.bulk_preview, name="bulk-preview"),
    path("queue/bulk/", desk.bulk_start, name="bulk-start"),
    path("queue/bulk/<int:bulk_id>/", desk.bulk_progress, name="bulk-progress"),
    path("cases/<int:case_id>/", desk.case, name="case"),
    path("cases/<int:case_id>/resolve/", desk.case_resolve, name="case-resolve"),
    path("cases/<int:case_id>/assign/", desk.case_assign, name="case-assign"),
    path("cases/<int:case_id>/comment/", desk.case_comment, name="case-comment"),
    path("audit/", desk.audit, name="audit"),
    path("projects/switch/", settings_views.project_switch, name="project-switch"),
    path("settings/", settings_views.project_settings, name="settings"),
    path(
        "settings/<int:project_id>/members/", settings_views.member_add, name="settings-member-add"
    ),
    path(
        "settings/<int:project_id>/members/<int:membership_id>/role/",
        settings_views.member_role,
        name="settings-member-role",
    ),
    path(
        "settings/<int:project_id>/members/<int:membership_id>/remove/",
        settings_views.member_remove,
        name="settings-member-remove",
    ),
    path(
        "settings/<int:project_id>/keys/", settings_views.apikey_create, name="settings-key-create"
    ),
    path(
        "settings/<int:project_id>/keys/<int:key_id>/revoke/",
        settings_views.apikey_revoke,
        name="settings-key-revoke",
    ),
    path("settings/<int:project_id>/policy/", settings_views.policy, name="settings-policy"),
    path("effects/<int:effect_id>/probes/", probe_views.probes, name="effect-probes"),
    path("effects/<int:effect_id>/probe/", probe_views.probe_now, name="effect-probe"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("trajectories.urls")),
]
