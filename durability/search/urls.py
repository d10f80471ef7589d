"""The search page."""

from __future__ import annotations

from django.urls import path

from durability.search import views

urlpatterns = [
    path("search/", views.search, name="search"),
]
