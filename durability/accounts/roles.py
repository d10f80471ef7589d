"""Who may do what: the roles are Django groups, and a membership gives a user one per project.

A user's rights in a project are the permissions of the group named by their
membership's role there; their global groups play no part, so being an admin of
one project grants nothing in another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Permission
from django.db.models import QuerySet

from durability.models import Membership, Project, Role


class Perm(StrEnum):
    """The permission codenames the desk checks (all in the durability app)."""

    VIEW = "view_case"
    VIEW_AUDIT = "view_auditentry"
    RESOLVE = "resolve_case"
    ASSIGN = "assign_case"
    COMMENT = "comment_case"
    MANAGE = "manage_project"


# (model, codename) pairs granted to each role's group; each role includes the one before.
_VIEWER = [
    ("effect", "view_effect"),
    ("case", Perm.VIEW.value),
    ("auditentry", Perm.VIEW_AUDIT.value),
]
_OPERATOR = [
    *_VIEWER,
    ("case", Perm.RESOLVE.value),
    ("case", Perm.ASSIGN.value),
    ("case", Perm.COMMENT.value),
]
ROLE_PERMISSIONS: dict[str, list[tuple[str, str]]] = {
    Role.VIEWER: _VIEWER,
    Role.OPERATOR: _OPERATOR,
    Role.ADMIN: [*_OPERATOR, ("project", Perm.MANAGE.value)],
}


def least_role_with(perm: Perm) -> str:
    """The first role (viewer, operator, admin) whose permissions include `perm`."""
    return next(
        role for role, grants in ROLE_PERMISSIONS.items() if (_model_of(perm), perm.value) in grants
    )


def _model_of(perm: Perm) -> str:
    return next(m for grants in ROLE_PERMISSIONS.values() for m, c in grants if c == perm.value)


def groups_sync(apps: Apps = global_apps, **signal_kwargs: Any) -> None:
    """Create the roles' groups and give each exactly its permissions.

    Runs from the data migration and after every migrate or flush (post_migrate),
    because Django creates permissions only after migrating and a test flush empties
    the groups table.
    """
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    content_type_model = apps.get_model("contenttypes", "ContentType")
    for role, grants in ROLE_PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=role)
        permissions = []
        for model, codename in grants:
            content_type, _ = content_type_model.objects.get_or_create(
                app_label="durability", model=model
            )
            permission, _ = permission_model.objects.get_or_create(
                content_type=content_type,
                codename=codename,
                defaults={"name": codename.replace("_", " ").capitalize()},
            )
            permissions.append(permission)
        group.permissions.set(permissions)


@dataclass(frozen=True)
class Access:
    """A user's role and permissions in one project."""

    project: Project
    role: str
    permissions: frozenset[str]

    def can(self, perm: Perm) -> bool:
        return perm.value in self.permissions


def _memberships(user: AbstractBaseUser) -> QuerySet[Membership]:
    """The user's memberships with their projects, but of a project being deleted: its
    members go when it is marked, and one added meanwhile (committed just after the mark)
    must not show it until the deletion's last pass."""
    return Membership.objects.live().select_related("project").filter(user_id=user.pk)


def access_of(user: AbstractBaseUser | AnonymousUser, project_id: int) -> Access | None:
    """The user's access to a project, or None for a stranger to it. Two queries."""
    if not user.is_authenticated:
        return None
    membership = _memberships(user).filter(project_id=project_id).first()
    return access_from(membership) if membership else None


def access_from(membership: Membership) -> Access:
    """The access a membership (with its project loaded) gives: its role's permissions."""
    codenames = Permission.objects.filter(
        group__name=membership.role, content_type__app_label="durability"
    ).values_list("codename", flat=True)
    return Access(membership.project, membership.role, frozenset(codenames))


def projects_of(user: AbstractBaseUser | AnonymousUser) -> list[Membership]:
    """The user's memberships with their projects, by project name."""
    if not user.is_authenticated:
        return []
    return list(_memberships(user).order_by("project__name"))
