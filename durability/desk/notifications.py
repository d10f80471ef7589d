"""Who hears about a case by email: its assignee when it is given to them and when it goes
overdue, a member a comment mentions (`@name`). Each member chooses which of these they
receive (`Membership.notify_*`, on their notifications page); the email itself goes
through the outbox (durability.notices), after the commit. No one hears about a project
being deleted, which is no one's (durability.accounts.roles): a membership committed just
after its mark is left out with the rest.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef
from django.utils import timezone

from durability import notices
from durability.desk import alerts
from durability.models import (
    BulkAction,
    Case,
    Comment,
    Membership,
    Notice,
    NoticeKind,
    Project,
)

# `@name` where name is a Django username (letters, digits and @ . + - _), not inside an
# email address; a sentence's full stop after it is not part of it.
MENTION = re.compile(r"(?<![\w@.+-])@([\w.@+-]+)")


def _wants(project_id: int, user: User, preference: str) -> bool:
    """Whether `user`, a member of the project (not being deleted), chose to receive this
    kind of email."""
    return (
        Membership.objects.live()
        .filter(project_id=project_id, user=user, **{preference: True})
        .exists()
    )


def case_assigned(project: Project, case: Case, *, actor: str) -> Notice | None:
    """Tell the new assignee, unless they took the case themselves or chose not to hear."""
    assignee = case.assignee
    if assignee is None or actor == f"user:{assignee.get_username()}":
        return None
    if not _wants(case.project_id, assignee, "notify_assigned"):
        return None
    return notices.notice_add(
        project=project, user=assignee, kind=NoticeKind.ASSIGNED, actor=actor, case=case
    )


def bulk_assigned(bulk: BulkAction) -> Notice | None:
    """Tell the assignee of a finished bulk assignment once, for all its cases."""
    assignee = bulk.assignee
    if assignee is None or bulk.done == 0 or bulk.actor == f"user:{assignee.get_username()}":
        return None
    if not _wants(bulk.project_id, assignee, "notify_assigned"):
        return None
    return notices.notice_add(
        project=bulk.project,
        user=assignee,
        kind=NoticeKind.ASSIGNED_MANY,
        actor=bulk.actor,
        bulk=bulk,
    )


def mentions(body: str) -> set[str]:
    """The usernames `@name` in a comment."""
    return {name.rstrip(".") for name in MENTION.findall(body)}


def comment_posted(project: Project, case: Case, comment: Comment) -> list[Notice]:
    """Tell each member of the case's project the comment mentions (not its author, nor
    anyone outside the project) who chose to hear."""
    names = mentions(comment.body) - {comment.actor.removeprefix("user:")}
    if not names:
        return []
    users = User.objects.filter(
        username__in=names,
        is_active=True,
        membership__project_id=case.project_id,
        membership__project__deleting=None,
        membership__notify_mentioned=True,
    ).order_by("username")
    added = []
    for user in users:
        notice = notices.notice_add(
            project=project,
            user=user,
            kind=NoticeKind.MENTIONED,
            actor=comment.actor,
            case=case,
            comment=comment,
        )
        if notice is not None:
            added.append(notice)
    return added


def overdue_unannounced(*, now: datetime, limit: int = 100) -> list[int]:
    """Cases overdue as alerts count it (open past their reason's threshold, above low
    severity) whose assignee wants to hear and has not been told."""
    wants = Membership.objects.live().filter(
        project_id=OuterRef("project_id"), user_id=OuterRef("assignee_id"), notify_overdue=True
    )
    announced = Notice.objects.filter(
        project_id=OuterRef("project_id"), case_id=OuterRef("pk"), kind=NoticeKind.OVERDUE
    )
    due = (
        alerts.overdue(now)
        .filter(Exists(wants), assignee__is_active=True)
        .exclude(assignee__email="")
        .exclude(Exists(announced))
    )
    return list(due.order_by("opened", "id").values_list("pk", flat=True)[:limit])


def overdue_announce(*, now: datetime | None = None, limit: int = 100) -> int:
    """Tell each overdue case's assignee once; returns how many emails went out.

    The notice's unique constraint is the marker: two scans at once write it once, and
    the one that wrote it sends it.
    """
    now = now or timezone.now()
    due = overdue_unannounced(now=now, limit=limit)
    assignees = Case.objects.filter(pk__in=due).values_list("pk", "project_id", "assignee_id")
    Notice.objects.bulk_create(
        [
            Notice(case_id=case_id, project_id=project_id, user_id=user_id, kind=NoticeKind.OVERDUE)
            for case_id, project_id, user_id in assignees
        ],
        ignore_conflicts=True,
    )
    # ignore_conflicts gives no ids back: read the ones no run has tried yet.
    fresh = Notice.objects.filter(case_id__in=due, kind=NoticeKind.OVERDUE, sent=None, tries=0)
    return notices.notices_send(list(fresh.order_by("id").values_list("pk", flat=True)))
