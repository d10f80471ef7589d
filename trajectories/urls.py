"""Trajectories' URLs, included at the root by durability/urls.py."""

from __future__ import annotations

from django.urls import path

from trajectories import api, views

urlpatterns = [
    path("api/v1/events", api.events, name="api-events"),
    path("v1/traces", api.traces, name="otlp-traces"),
    path("runs/", views.runs, name="runs"),
    path("runs/<int:run_pk>/", views.run, name="run"),
    path("runs/<int:run_pk>/spans/<int:span_pk>/", views.run, name="run-span"),
]
