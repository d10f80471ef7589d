"""The probe panel of an effect: its probes, and asking again."""

from __future__ import annotations

from django.urls import path

from durability.reconcilers import views

urlpatterns = [
    path("effects/<int:effect_id>/probes/", views.probes, name="effect-probes"),
    path("effects/<int:effect_id>/probe/", views.probe_now, name="effect-probe"),
]
