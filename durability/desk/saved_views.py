"""Saved views: named filters of the queue, a member's own or shared with the project.

Any member may save views for themselves; sharing one with the project takes a role that
writes to the desk (an operator's or an admin's). A view is deleted by its owner, or, when
shared, by a project admin too. Another member's personal views are never shown or found.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from durability.accounts.roles import Access, Perm
from durability.desk.queue import QueueQuery
from durability.models import Project, SavedView

# Who may share a view with the whole project.
SHARE_PERM = Perm.COMMENT


def views_for_anyone(user: User) -> QuerySet[SavedView]:
    """The views `user` may see, if a member of their project: their own, and shared ones
    (the project's membership is checked by the access helper)."""
    return SavedView.objects.filter(Q(owner=user) | Q(shared=True))


def views_for(project: Project, user: User) -> QuerySet[SavedView]:
    """The views `user` sees in `project`: their own and those shared with it, by name."""
    return (
        views_for_anyone(user)
        .filter(project=project)
        .select_related("owner")
        .order_by("name", "id")
    )


def view_save(
    *, access: Access, owner: User, name: str, query: QueueQuery, shared: bool
) -> SavedView:
    """Save the queue's filter `query` as the view `name` of `owner`; a view of theirs with
    that name already is given the new filter (and sharing) instead."""
    view, _ = SavedView.objects.update_or_create(
        project=access.project,
        owner=owner,
        name=name,
        defaults={"query": query.query_string(), "shared": shared},
    )
    return view


def may_delete(access: Access, user: User, view: SavedView) -> bool:
    return view.owner_id == user.pk or (view.shared and access.can(Perm.MANAGE))
