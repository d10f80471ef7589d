"""The ingest API, /api/v1/, and the webhook intake, /hooks/<source>/."""

from __future__ import annotations

from django.urls import path

from durability.api import views, webhooks

urlpatterns = [
    path("api/v1/intents", views.intents, name="api-intents"),
    path("api/v1/receipts", views.receipts, name="api-receipts"),
    path("api/v1/receipts/batch", views.receipts_batch, name="api-receipts-batch"),
    path("api/v1/failures", views.failures, name="api-failures"),
    path("api/v1/failures/batch", views.failures_batch, name="api-failures-batch"),
    path("api/v1/timeouts", views.timeouts, name="api-timeouts"),
    path("api/v1/effects", views.effects, name="api-effects"),
    path("api/v1/effects/<int:effect_id>", views.effect_detail, name="api-effect"),
    path("api/v1/grants", views.grants, name="api-grants"),
    path("api/v1/grants/<int:grant_id>", views.grant_detail, name="api-grant"),
    path("hooks/<slug:name>/", webhooks.hook, name="hook"),
]
