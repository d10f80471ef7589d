from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from durability import api, desk, overview, views
from durability.reconcilers import views as probe_views

api_v1 = [
    path("api/v1/intents", api.intents, name="api-intents"),
    path("api/v1/receipts", api.receipts, name="api-receipts"),
    path("api/v1/failures", api.failures, name="api-failures"),
    path("api/v1/timeouts", api.timeouts, name="api-timeouts"),
    path("api/v1/effects", api.effects, name="api-effects"),
    path("api/v1/effects/<int:effect_id>", api.effect_detail, name="api-effect"),
    path("api/v1/openapi.json", api.openapi, name="api-openapi"),
]

urlpatterns = [
    *api_v1,
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
    path("projects/switch/", desk.project_switch, name="project-switch"),
    path("effects/<int:effect_id>/probes/", probe_views.probes, name="effect-probes"),
    path("effects/<int:effect_id>/probe/", probe_views.probe_now, name="effect-probe"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("trajectories.urls")),
]
