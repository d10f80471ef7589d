"""Roles: viewer, operator and admin are groups; a membership gives a user one per project."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from durability.accounts.roles import Perm, access_of
from durability.models import Membership, Project, Role


def _member(project: Project, name: str, role: Role) -> User:
    user = User.objects.create_user(name)
    Membership.objects.create(project=project, user=user, role=role)
    return user


def test_each_role_is_a_group_with_its_permissions(db):
    perms = {
        g.name: set(g.permissions.values_list("codename", flat=True)) for g in Group.objects.all()
    }
    assert perms["viewer"] == {"view_case", "view_effect", "view_auditentry"}
    assert perms["operator"] == perms["viewer"] | {"resolve_case", "assign_case", "comment_case"}
    assert perms["admin"] == perms["operator"] | {"manage_project"}


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        (Role.VIEWER, {Perm.VIEW, Perm.VIEW_AUDIT}),
        (Role.OPERATOR, {Perm.VIEW, Perm.VIEW_AUDIT, Perm.RESOLVE, Perm.ASSIGN, Perm.COMMENT}),
        (Role.ADMIN, set(Perm)),
    ],
)
def test_a_member_can_what_their_role_allows_in_that_project(project, role, allowed):
    access = access_of(_member(project, "u", role), project.pk)
    assert access is not None and access.role == role
    assert {p for p in Perm if access.can(p)} == allowed


def test_a_role_in_one_project_grants_nothing_in_another(project):
    other = Project.objects.create(name="beta")
    admin = _member(other, "boss", Role.ADMIN)
    assert access_of(admin, project.pk) is None
    Membership.objects.create(project=project, user=admin, role=Role.VIEWER)
    access = access_of(admin, project.pk)
    assert access is not None and not access.can(Perm.RESOLVE)


def test_global_groups_grant_nothing_without_a_membership(project):
    user = User.objects.create_user("global")
    user.groups.add(Group.objects.get(name="admin"))
    assert access_of(user, project.pk) is None
