"""Who the signed-in user is in which project: the one access helper every page view asks."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

from durability.accounts.roles import Access, Perm, access_from, projects_of
from durability.models import Membership

SESSION_PROJECT = "tallybook_project"


class AuthedRequest(HttpRequest):
    """What the middleware adds to a request that `login_required` let through."""

    user: User
    htmx: HtmxDetails


def actor_of(request: AuthedRequest) -> str:
    return f"user:{request.user.get_username()}"


def current_membership(request: AuthedRequest) -> tuple[Membership | None, list[Membership]]:
    """The project the user works in (remembered in the session), and all of theirs."""
    memberships = projects_of(request.user)
    wanted = request.session.get(SESSION_PROJECT)
    current = next((m for m in memberships if m.project_id == wanted), None)
    return current or (memberships[0] if memberships else None), memberships


def current_access(request: AuthedRequest, perm: Perm) -> Access | None:
    """The user's access to their current project, if they have one and it allows `perm`."""
    membership, _ = current_membership(request)
    if membership is None:
        return None
    access = access_from(membership)
    require(access, perm)
    return access


def require(access: Access, perm: Perm) -> None:
    """Refuse (403) what the user's role in the project does not allow."""
    if not access.can(perm):
        raise PermissionDenied(
            f"Your role in {access.project} ({access.role}) does not allow this action."
        )


def no_project(request: AuthedRequest) -> HttpResponse:
    return render(request, "durability/accounts/no_project.html")
