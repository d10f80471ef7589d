"""Email to people: the outbox every room writes to, and the job that sends it.

A room writes a `Notice` in the transaction of what caused it (`notice_add`) and the email
goes out from `notice_deliver`, a job enqueued after the commit: the operator's action never
waits for a mail server, nor fails with it. A send that fails keeps its error, is logged
by the job system (the job raises) and is tried again by the scheduled pass
(`notices_retry`) up to TALLYBOOK_NOTICE_TRIES times in all. Each notice is sent while
holding its row lock (others skip it), so a job delivered twice and the pass never send one
twice; only a crash between the send and the commit can.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from durability.jobs import enqueue
from durability.models import (
    BulkAction,
    Case,
    Comment,
    Invitation,
    Notice,
    NoticeKind,
    Preference,
    Project,
    zone_named,
)
from durability.site import site_url

logger = logging.getLogger(__name__)

# The scheduled pass leaves a fresh notice to the job enqueued for it.
RETRY_AFTER = timedelta(minutes=1)


class NoticeFailed(Exception):
    """The mail server refused or could not be reached: raised so the job system logs it."""


def set_password_path(user: User) -> str:
    """The one-time link that lets `user` choose a password (Django's reset tokens): it
    stops working once a password is set, or after PASSWORD_RESET_TIMEOUT."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    return reverse("set-password", args=[uid, default_token_generator.make_token(user)])


def invitation_token(invitation: Invitation) -> str:
    """The secret of an invitation's link, keyed by SECRET_KEY: only its email carries it."""
    made = f"{invitation.pk}:{invitation.user_id}:{invitation.project_id}:{invitation.created}"
    return salted_hmac("tallybook.invitation", made, algorithm="sha256").hexdigest()[:32]


def invitation_path(invitation: Invitation) -> str:
    """The link that lets the invited user accept, once logged in as themselves."""
    return reverse("invitation", args=[invitation.pk, invitation_token(invitation)])


def mail_server_configured() -> bool:
    """Whether emails leave the server: not the console's or the dummy backend (the demo's,
    a development start), which only print or drop them."""
    backend = str(settings.MAILERS["default"]["BACKEND"])
    return backend.rsplit(".", 2)[-2] not in ("console", "dummy")


def notice_add(
    *,
    project: Project,
    user: User,
    kind: NoticeKind,
    actor: str = "",
    case: Case | None = None,
    comment: Comment | None = None,
    bulk: BulkAction | None = None,
) -> Notice | None:
    """Write an email to `user` and send it after the commit; None if they have no address."""
    if not user.email:
        return None
    notice = Notice.objects.create(
        project=project, user=user, kind=kind, actor=actor, case=case, comment=comment, bulk=bulk
    )
    enqueue(notice_deliver, notice.pk)
    return notice


def _who(actor: str) -> str:
    return actor.removeprefix("user:") or "Tallybook"


def message(notice: Notice) -> EmailMessage:
    """The email of a notice: what happened, to which case and effect, and the link. Its
    times are in the recipient's zone (their Preference; UTC without one), as the pages
    write them ({% when %}), with the zone's name: a mail has no hover title."""
    zone = zone_named(Preference.zone_name_of(notice.user)) or UTC
    base = site_url()
    case = notice.case
    invitation = (
        Invitation.objects.filter(project_id=notice.project_id, user_id=notice.user_id).first()
        if notice.kind == NoticeKind.JOIN
        else None
    )
    context = {
        "notice": notice,
        "project": notice.project,
        "user": notice.user,
        "who": _who(notice.actor),
        "case": case,
        "effect": case.effect if case else None,
        "comment": notice.comment,
        "case_url": base + case.get_absolute_url() if case else "",
        "zone": str(zone),
        "preferences_url": base + reverse("settings-notifications"),
        "set_password_url": (
            base + set_password_path(notice.user)
            if notice.kind in (NoticeKind.INVITED, NoticeKind.JOIN)
            and not notice.user.has_usable_password()
            else ""
        ),
        "invitation": invitation,
        "accept_url": base + invitation_path(invitation) if invitation else "",
        "login_url": base + reverse("login"),
        "queue_url": base + reverse("queue") + "?assignee=me",
        "cases": _bulk_cases(notice, base),
        "link_days": settings.PASSWORD_RESET_TIMEOUT // (24 * 60 * 60),
    }
    with timezone.override(zone):
        subject = render_to_string("durability/notices/subject.txt", context)
        body = render_to_string(f"durability/notices/{notice.kind}.txt", context)
    return EmailMessage(
        subject=" ".join(subject.split()), body=body.strip() + "\n", to=[notice.user.email]
    )


# An email summing up a bulk assignment lists at most this many of its cases.
BULK_LISTED = 20


def _bulk_cases(notice: Notice, base: str) -> list[tuple[Case, str]]:
    """The cases of a bulk assignment still with its assignee, oldest first, with links."""
    if notice.bulk is None:
        return []
    cases = Case.objects.filter(
        project_id=notice.project_id, pk__in=notice.bulk.case_ids, assignee=notice.user
    )
    listed = cases.select_related("effect").order_by("opened", "id")[:BULK_LISTED]
    return [(case, base + case.get_absolute_url()) for case in listed]


def notice_deliver(notice_id: int) -> bool:
    """Send one notice unless it was sent (or another run holds it); True if this sent it.

    Raises NoticeFailed after recording the error, so the failure is logged as a job's.
    """
    with transaction.atomic():
        notice = (
            Notice.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("project", "user", "case__effect", "comment", "bulk")
            .filter(pk=notice_id, sent=None)
            .first()
        )
        if notice is None:
            return False
        notice.tries += 1
        try:
            message(notice).send()
        except OSError as exc:  # smtplib's errors are OSErrors too
            notice.error = f"{type(exc).__name__}: {exc}"[:1000]
            notice.save(update_fields=["tries", "error"])
            failure: OSError = exc
        else:
            notice.sent, notice.error = timezone.now(), ""
            notice.save(update_fields=["tries", "error", "sent"])
            return True
    raise NoticeFailed(
        f"{notice.kind} email to {notice.user.get_username()} not sent "
        f"(try {notice.tries} of {settings.TALLYBOOK_NOTICE_TRIES}): {notice.error}"
    ) from failure


def notices_unsent(*, now: datetime | None = None, limit: int = 100) -> list[int]:
    """Unsent notices the scheduled pass should try: past their first job, tries left."""
    since = (now or timezone.now()) - RETRY_AFTER
    unsent = Notice.objects.filter(
        sent=None, created__lte=since, tries__lt=settings.TALLYBOOK_NOTICE_TRIES
    )
    return list(unsent.order_by("created", "id").values_list("pk", flat=True)[:limit])


def notices_send(notice_ids: list[int]) -> int:
    """Send these notices in turn, stopping at the first failure (the mail server is likely
    down: the next pass tries again); returns how many were sent."""
    sent = 0
    for notice_id in notice_ids:
        try:
            sent += notice_deliver(notice_id)
        except NoticeFailed as exc:
            logger.warning("%s; the next pass tries again", exc)
            break
    return sent


def notices_retry() -> int:
    """The scheduled pass: try the notices not sent yet again; returns how many went out."""
    return notices_send(notices_unsent())
