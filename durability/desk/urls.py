"""The overview, the queue, cases, effects and the audit log."""

from __future__ import annotations

from django.urls import path

from durability.desk import overview, views

urlpatterns = [
    path("", overview.index, name="index"),
    path("effects/", views.effects, name="effects"),
    path("effects/<int:effect_id>/", views.effect, name="effect"),
    path("queue/", views.queue, name="queue"),
    path("queue/pulse/", views.queue_pulse, name="queue-pulse"),
    path("queue/bulk/preview/", views.bulk_preview, name="bulk-preview"),
    path("queue/bulk/", views.bulk_start, name="bulk-start"),
    path("queue/bulk/<int:bulk_id>/", views.bulk_progress, name="bulk-progress"),
    path("queue/views/", views.view_save, name="view-save"),
    path("queue/views/<int:view_id>/delete/", views.view_delete, name="view-delete"),
    path("cases/<int:case_id>/", views.case, name="case"),
    path("cases/<int:case_id>/next/", views.case_next, name="case-next"),
    path("cases/<int:case_id>/resolve/", views.case_resolve, name="case-resolve"),
    path("cases/<int:case_id>/assign/", views.case_assign, name="case-assign"),
    path("cases/<int:case_id>/snooze/", views.case_snooze, name="case-snooze"),
    path("cases/<int:case_id>/comment/", views.case_comment, name="case-comment"),
    path("audit/", views.audit, name="audit"),
]
