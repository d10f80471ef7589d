"""Who the signed-in user is in which project: the one access helper every page view asks.

The rules, for every page: a user in no project gets the landing page that says so; an
object of a project the user is not in is a 404 (never "forbidden": a stranger is not
told it exists); a member whose role lacks the permission gets a 403. A project being
deleted is no one's (`roles`), and a write its deletion refused after the access was
granted is a 404 too, as the next request would be.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.defaults import page_not_found
from django_htmx.middleware import HtmxDetails

from durability.accounts.roles import (
    Access,
    Perm,
    access_from,
    access_of,
    least_role_with,
    projects_of,
)
from durability.models import GONE_UNDER_A_WRITE, Membership, Role, project_gone

SESSION_PROJECT = "tallybook_project"
NOT_YOURS = "No such project among yours"


class AuthedRequest(HttpRequest):
    """What the middleware adds to a request that `login_required` let through."""

    user: User
    htmx: HtmxDetails
    # The project the access helper let the page act in (NoProjectMiddleware reads it).
    acting_in: int


class NoProject(Exception):
    """The user is a member of no project; NoProjectMiddleware answers with the landing page."""


def actor_of(request: AuthedRequest) -> str:
    return f"user:{request.user.get_username()}"


def current_membership(request: AuthedRequest) -> tuple[Membership | None, list[Membership]]:
    """The project the user works in (remembered in the session), and all of theirs."""
    memberships = projects_of(request.user)
    wanted = request.session.get(SESSION_PROJECT)
    current = next((m for m in memberships if m.project_id == wanted), None)
    return current or (memberships[0] if memberships else None), memberships


def _access(request: AuthedRequest, project_id: int | None) -> Access | None:
    """The user's access to project `project_id` (their current one if None), if a member."""
    if project_id is not None:
        return access_of(request.user, project_id)
    membership, _ = current_membership(request)
    return access_from(membership) if membership else None


def project_access(request: AuthedRequest, perm: Perm, *, project_id: int | None = None) -> Access:
    """The user's access to their current project, or to `project_id` (a project the URL
    names), which must allow `perm`.

    No project at all: NoProject (the landing page). Not a member of `project_id`: 404.
    A role without `perm`: 403. Two or three queries.
    """
    access = _access(request, project_id)
    if access is None:
        if project_id is None:
            raise NoProject
        raise Http404(NOT_YOURS)
    require(access, perm)
    request.acting_in = access.project.pk
    return access


def object_access[M: Model](
    request: AuthedRequest, perm: Perm, objects: QuerySet[M], pk: int, *, current: bool = False
) -> tuple[M, Access]:
    """The object `pk` of `objects` and the user's access to its project, which must allow
    `perm`; with `current`, only an object of the user's current project is found.

    An object of a project the user is not in (or is not working in, with `current`), or
    no project at all: 404. A role without `perm`: 403. Three queries.
    """
    found = objects.filter(pk=pk).first()
    access = None
    if found is not None:
        # Every object a page shows belongs to a project; this is its foreign key's value.
        project_id: int = found.serializable_value("project")
        access = _access(request, None if current else project_id)
        if access is not None and access.project.pk != project_id:
            access = None
    if found is None or access is None:
        raise Http404(f"No such {objects.model._meta.verbose_name} in your projects")
    require(access, perm)
    request.acting_in = access.project.pk
    return found, access


class Refused(PermissionDenied):
    """A member's role lacks a permission: answered by a page in the desk's layout that
    says which role is needed and who can grant it (NoProjectMiddleware)."""

    def __init__(self, access: Access, perm: Perm) -> None:
        self.access, self.perm = access, perm
        super().__init__(
            f"Your role in {access.project} ({access.role}) does not allow this action."
        )


def require(access: Access, perm: Perm) -> None:
    """Refuse (403) what the user's role in the project does not allow."""
    if not access.can(perm):
        raise Refused(access, perm)


def refused_page(request: HttpRequest, refused: Refused) -> HttpResponse:
    """The 403 page: what was refused, the role it needs, and the project's admins to ask."""
    admins = (
        Membership.objects.live()
        .filter(project=refused.access.project, role=Role.ADMIN)
        .select_related("user")
        .order_by("user__username")
    )
    context = {
        "refused": refused,
        "needed": least_role_with(refused.perm),
        "admins": [m.user for m in admins],
    }
    return render(request, "durability/accounts/forbidden.html", context, status=403)


class NoProjectMiddleware:
    """Answers a page asked by a user in no project with the landing page that says so; and
    a page whose write failed because its project was deleted meanwhile (after the access
    helper let it in, before it committed) with the 404 the next request gets, its
    transaction rolled back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, NoProject):
            return render(request, "durability/accounts/no_project.html")
        if isinstance(exception, Refused):
            return refused_page(request, exception)
        project_id = getattr(request, "acting_in", None)
        if (
            isinstance(exception, GONE_UNDER_A_WRITE)
            and project_id is not None
            and project_gone(project_id)
        ):
            return page_not_found(request, Http404(NOT_YOURS))
        return None
