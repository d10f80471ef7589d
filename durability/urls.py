"""The root URLconf: each room's surface, the OpenAPI document, login and the admin."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from durability import openapi

urlpatterns = [
    path("", include("durability.api.urls")),
    path("api/v1/openapi.json", openapi.openapi, name="api-openapi"),
    path("", include("durability.authority.urls")),
    path("", include("durability.desk.urls")),
    path("", include("durability.search.urls")),
    path("", include("durability.accounts.urls")),
    path("", include("durability.reconcilers.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("trajectories.urls")),
]
