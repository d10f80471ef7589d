"""Login lockouts (django-axes counts the failures): their audit entries, and unlocking.

A lockout is about a user, not a project, but the audit log is kept per project: it is
recorded in each project the user is a member of (but one being deleted), whose admins are
the people who can unlock them there. A locked username that is no member of any project
(a guessed name) is in the admin's Access attempts only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt
from axes.utils import reset
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Sum
from django.http import HttpRequest
from django.utils import timezone

from durability import audit, site
from durability.inbound import storable_text
from durability.models import GONE_UNDER_A_WRITE, AuditAction, Membership, Project, project_gone

ACTOR = "system:login"


class LoginFailures(AxesDatabaseHandler):  # type: ignore[misc]  # axes is untyped
    """Axes' PostgreSQL handler with two limits where axes has one (AXES_FAILURE_LIMIT).

    The failures that count against a login are those of its username at its address;
    once the username's failures over every address reach LOGIN_USER_FAILURE_LIMIT, those.
    Axes locks when they reach AXES_FAILURE_LIMIT (never above the other limit), so one
    address is locked out after LOGIN_FAILURE_LIMIT guesses, and everyone only after a
    guess spread that wide.
    """

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        # In AXES_LOCKOUT_PARAMETERS' order: username and address, then username alone.
        here, everywhere = (
            int(attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0)
            for attempts in self.get_user_attempts(request, credentials)
        )
        return everywhere if everywhere >= settings.LOGIN_USER_FAILURE_LIMIT else here


def client_address(request: HttpRequest) -> str | None:
    """The address failures are counted for: the client's, as far as the trusted proxies
    tell (durability.site.client_address)."""
    return site.client_address(request)


def attempt_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str | None:
    """The username failures are counted for, as PostgreSQL can store it: cut to the longest
    a user's can be (Django's login form does not check the length before authenticating),
    and a NUL or a lone surrogate escaped (no user's name has one)."""
    raw = (credentials or {}).get("username", request.POST.get("username"))
    if raw is None:
        return None
    longest = User.username.field.max_length or 150
    name = str(raw)[:longest]
    try:
        return storable_text(name)
    except ValueError:
        return ascii(name)[1:-1][:longest]


def on_user_locked_out(
    sender: Any,
    *,
    request: HttpRequest,
    username: str | None,
    ip_address: str | None,
    **kwargs: Any,
) -> None:
    """Audit the failure that locked `username` out (axes' user_locked_out signal).

    Axes also sends the signal for each attempt refused during the lockout; those were not
    counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT is off), so carry no failures.
    """
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is None or not username:
        return
    memberships = (
        Membership.objects.live()
        .filter(user__username=username)
        .values_list("project_id", flat=True)
    )
    for project_id in memberships:
        try:
            with audit.trail(project_id, ACTOR) as trail:
                trail.add(
                    AuditAction.LOGIN_LOCKED_OUT,
                    username=username,
                    address=ip_address,
                    failures=failures,
                )
        except GONE_UNDER_A_WRITE:
            # Deleted since it was read (its chain head gone): nothing of it to audit in,
            # and the lockout stands, audited in the user's other projects.
            if not project_gone(project_id):
                raise


def locked_usernames(usernames: list[str]) -> set[str]:
    """Which of `usernames` are locked out now: at some address, or everywhere."""
    per_address = (
        AccessAttempt.objects.filter(
            username__in=usernames, attempt_time__gte=timezone.now() - _cool_off()
        )
        .values_list("username", "ip_address")
        .annotate(failures=Sum("failures_since_start"))
    )
    locked: set[str] = set()
    everywhere: dict[str, int] = {}
    for username, _, failures in per_address:
        if failures >= settings.AXES_FAILURE_LIMIT:
            locked.add(username)
        everywhere[username] = everywhere.get(username, 0) + failures
    return locked | {
        name for name, total in everywhere.items() if total >= settings.LOGIN_USER_FAILURE_LIMIT
    }


def login_unlock(*, project: Project, actor: str, username: str) -> int:
    """Forget the failed logins of `username` (a member of `project`), from every address;
    the number of attempt records removed. Audited in `project`."""
    with audit.trail(project.pk, actor) as trail:
        removed = reset(username=username)
        if removed:
            trail.add(AuditAction.LOGIN_UNLOCKED, username=username)
    return int(removed)


def _cool_off() -> timedelta:
    cool_off: timedelta = settings.AXES_COOLOFF_TIME
    return cool_off
