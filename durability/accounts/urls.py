"""Switching projects, the project settings page (members, API keys, the policy), each
member's notifications, the one-time link of an invitation, and accepting one."""

from __future__ import annotations

from django.urls import path

from durability.accounts import views

urlpatterns = [
    path("projects/switch/", views.project_switch, name="project-switch"),
    path("settings/", views.project_settings, name="settings"),
    path("settings/notifications/", views.notifications, name="settings-notifications"),
    path("settings/time-zone/", views.time_zone_set, name="settings-time-zone"),
    path(
        "settings/<int:project_id>/notifications/",
        views.notifications_set,
        name="settings-notifications-set",
    ),
    path("welcome/<uidb64>/<token>/", views.SetPassword.as_view(), name="set-password"),
    path("invitations/<int:invitation_id>/<token>/", views.invitation, name="invitation"),
    path("settings/<int:project_id>/members/", views.member_add, name="settings-member-add"),
    path(
        "settings/<int:project_id>/members/<int:membership_id>/role/",
        views.member_role,
        name="settings-member-role",
    ),
    path(
        "settings/<int:project_id>/members/<int:membership_id>/remove/",
        views.member_remove,
        name="settings-member-remove",
    ),
    path(
        "settings/<int:project_id>/members/<int:membership_id>/unlock/",
        views.member_unlock,
        name="settings-member-unlock",
    ),
    path("settings/<int:project_id>/keys/", views.apikey_create, name="settings-key-create"),
    path(
        "settings/<int:project_id>/keys/<int:key_id>/revoke/",
        views.apikey_revoke,
        name="settings-key-revoke",
    ),
    path("settings/<int:project_id>/policy/", views.policy, name="settings-policy"),
    path("settings/<int:project_id>/redaction/", views.redaction, name="settings-redaction"),
    path("settings/<int:project_id>/retention/", views.retention, name="settings-retention"),
]
