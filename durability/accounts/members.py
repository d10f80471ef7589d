"""A project's members and API keys: who may work in it, and what may call its API.

Every change takes the project's row lock first, so two admins acting at once are
serialised and the rule "a project keeps at least one admin" cannot be raced past.
Each writes an audit entry (the project's chain) in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from durability import audit, notices, redaction
from durability.models import (
    ApiKey,
    AuditAction,
    AuthorityPolicy,
    Invitation,
    Membership,
    NoticeKind,
    Preference,
    Project,
    RetentionPolicy,
    Role,
)


class Refused(Exception):
    """A change the rules do not allow; `field` names the input it is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class NotFound(Exception):
    """The member or key is not in this project."""


def _lock(project: Project) -> None:
    Project.objects.select_for_update(no_key=True).only("pk").get(pk=project.pk)


def _membership(project: Project, membership_id: int) -> Membership:
    membership = (
        Membership.objects.select_related("user").filter(project=project, pk=membership_id).first()
    )
    if membership is None:
        raise NotFound(f"No member {membership_id} in {project}")
    return membership


def _keep_an_admin(project: Project, membership: Membership, field: str) -> None:
    """Refuse to take away the project's last admin."""
    if membership.role != Role.ADMIN:
        return
    others = Membership.objects.filter(project=project, role=Role.ADMIN).exclude(pk=membership.pk)
    if not others.exists():
        raise Refused(field, f"{membership.user} is the last admin of {project}; appoint another.")


@dataclass(frozen=True)
class Added:
    """What the inviting admin may be told of a `member_add`: nothing, as a rule (whether
    the name or address belongs to anyone, and to which projects, is not the admin's to
    learn). Only when no mail server would deliver the email, for a user created by this
    very invitation (so no other project's), the links it would carry: the one-time link to
    choose a password, and the invitation's, to accept it once logged in.
    """

    set_password_path: str = ""
    accept_path: str = ""


def member_add(
    *, project: Project, actor: str, username: str, role: Role, email: str = ""
) -> Added:
    """Add a user to the project with `role`, or invite them to it.

    Everyone is sent an invitation they accept from the email (`invitation_accept`), and
    becomes a member only then: a username and an email that nobody has make a new user,
    without a usable password, whose email (after the commit) also carries a one-time link
    to choose one; otherwise the user found by the username, or by the email when nobody
    has that username. So the members list, like the answer, tells nothing of who existed.
    A user who has not chosen a password yet is invited only through their own address, and
    their earlier set-password links stop working (whoever held one cannot take the account
    over once another project wants it). No such user, an inactive one, an invitation not
    sent: the same answer as one sent.
    """
    with audit.trail(project.pk, actor) as trail:
        _lock(project)
        user = User.objects.filter(username=username).first()
        if user is None and email:
            user = User.objects.filter(email__iexact=email).order_by("pk").first()
            if user is None:
                return _member_new(project, actor, trail, username, role, email)
        if user is not None and Membership.objects.filter(project=project, user=user).exists():
            raise Refused("username", f"{username} is already a member of {project}.")
        # The project's audit log says what its admin asked, as they typed it, whatever
        # came of it: its readers learn no more than the admin.
        trail.add(AuditAction.MEMBER_INVITED, username=username, role=role.value)
        if user is not None and _invitable(user, email):
            _invite(project, actor, user, role)
    return Added()


def _invitable(user: User, email: str) -> bool:
    """Whether `user` may be sent an invitation: active, with an address to send it to, and
    when they have chosen no password yet, named by that address."""
    if not user.is_active or not user.email:
        return False
    return user.has_usable_password() or email.lower() == user.email.lower()


def _invite(project: Project, actor: str, user: User, role: Role) -> None:
    if not user.has_usable_password():
        # New reset tokens: a set-password link shown to another project's admin dies here.
        user.set_unusable_password()
        user.save(update_fields=["password"])
    Invitation.objects.update_or_create(
        project=project,
        user=user,
        defaults={"role": role, "actor": actor, "created": timezone.now()},
    )
    notices.notice_add(project=project, user=user, kind=NoticeKind.JOIN, actor=actor)


def _member_new(
    project: Project, actor: str, trail: audit.Trail, username: str, role: Role, email: str
) -> Added:
    user = User.objects.create_user(username, email=email)  # no usable password
    trail.add(AuditAction.MEMBER_INVITED, username=username, role=role.value)
    invitation = Invitation.objects.create(
        project=project, user=user, role=role, actor=actor, created=timezone.now()
    )
    notices.notice_add(project=project, user=user, kind=NoticeKind.JOIN, actor=actor)
    if notices.mail_server_configured():
        return Added()
    # Made here, in this transaction: no other project holds or invited this user.
    return Added(notices.set_password_path(user), notices.invitation_path(invitation))


def invitation_waiting(user: User) -> str:
    """The accept link of the user's newest invitation still open ("" if none): where a
    new user goes once they have chosen their password."""
    fresh = timezone.now() - timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT)
    invitation = (
        Invitation.objects.filter(user=user, created__gte=fresh, project__deleting=None)
        .order_by("-created", "-pk")
        .first()
    )
    return notices.invitation_path(invitation) if invitation else ""


class InvitationGone(Exception):
    """The invitation was accepted, withdrawn or expired, or is not this user's."""


def invitation_find(*, invitation_id: int, token: str, user: User) -> Invitation:
    """The user's pending invitation named by an emailed link; raises InvitationGone."""
    invitation = (
        Invitation.objects.select_related("project")
        .filter(pk=invitation_id, user=user, project__deleting=None)
        .first()
    )
    if invitation is None or not constant_time_compare(token, notices.invitation_token(invitation)):
        raise InvitationGone("This invitation no longer works.")
    if invitation.created < timezone.now() - timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT):
        raise InvitationGone("This invitation has expired: ask for another.")
    return invitation


def invitation_accept(*, invitation_id: int, token: str, user: User) -> Membership:
    """Make the invited user a member with the invitation's role; raises InvitationGone."""
    invitation = invitation_find(invitation_id=invitation_id, token=token, user=user)
    project = invitation.project
    with audit.trail(project.pk, f"user:{user.get_username()}") as trail:
        _lock(project)
        taken = Invitation.objects.filter(pk=invitation.pk).delete()[0]
        if not taken:  # accepted in another tab meanwhile
            raise InvitationGone("This invitation no longer works.")
        membership, created = Membership.objects.get_or_create(
            project=project, user=user, defaults={"role": invitation.role}
        )
        if created:
            trail.add(
                AuditAction.MEMBER_ADDED,
                username=user.get_username(),
                role=invitation.role,
                invited_by=invitation.actor,
            )
    return membership


NOTIFY_FIELDS = ("notify_assigned", "notify_mentioned", "notify_overdue")


def member_notifications_set(
    *, project: Project, actor: str, user: User, choices: dict[str, bool]
) -> bool:
    """Set which emails about this project's cases `user` receives (NOTIFY_FIELDS); True
    when it changed. Audited in the project's chain, as every change of a membership."""
    if set(choices) != set(NOTIFY_FIELDS):
        raise ValueError(f"choices must name exactly {NOTIFY_FIELDS}")
    with audit.trail(project.pk, actor) as trail:
        membership = (
            Membership.objects.select_for_update().filter(project=project, user=user).first()
        )
        if membership is None:
            raise NotFound(f"{user} is not a member of {project}")
        was = {name: getattr(membership, name) for name in NOTIFY_FIELDS}
        if was == choices:
            return False
        Membership.objects.filter(pk=membership.pk).update(**choices)
        trail.add(
            AuditAction.NOTIFICATIONS_SET,
            username=user.get_username(),
            was=[name.removeprefix("notify_") for name in NOTIFY_FIELDS if was[name]],
            now=[name.removeprefix("notify_") for name in NOTIFY_FIELDS if choices[name]],
        )
    return True


def preference_time_zone_set(*, user: User, time_zone: str) -> bool:
    """The zone `user`'s pages show moments in ("" for their browser's); True when it
    changed. A personal setting of no project, so in no project's audit chain."""
    was = Preference.objects.filter(user=user).values_list("time_zone", flat=True).first()
    if (was or "") == time_zone:
        return False
    Preference.objects.update_or_create(user=user, defaults={"time_zone": time_zone})
    return True


def member_role_change(*, project: Project, actor: str, membership_id: int, role: Role) -> bool:
    """Give a member another role; True when it changed."""
    with audit.trail(project.pk, actor) as trail:
        _lock(project)
        membership = _membership(project, membership_id)
        if membership.role == role:
            return False
        _keep_an_admin(project, membership, "role")
        was = membership.role
        Membership.objects.filter(pk=membership.pk).update(role=role)
        trail.add(
            AuditAction.MEMBER_ROLE_CHANGED, username=membership.user.username, was=was, role=role
        )
    return True


def member_remove(*, project: Project, actor: str, membership_id: int) -> Membership:
    """Take a member out of the project; the removed membership is returned."""
    with audit.trail(project.pk, actor) as trail:
        _lock(project)
        membership = _membership(project, membership_id)
        _keep_an_admin(project, membership, "member")
        Membership.objects.filter(pk=membership.pk).delete()
        trail.add(
            AuditAction.MEMBER_REMOVED, username=membership.user.username, role=membership.role
        )
    return membership


def apikey_create(*, project: Project, actor: str, name: str) -> tuple[ApiKey, str]:
    """Issue a key; the raw key is returned once and only its digest is stored."""
    with audit.trail(project.pk, actor) as trail:
        key, raw = ApiKey.issue(project, name=name)
        trail.add(AuditAction.APIKEY_CREATED, key=key.pk, prefix=key.prefix, name=name)
    return key, raw


def apikey_revoke(*, project: Project, actor: str, key_id: int) -> bool:
    """Revoke a key of the project, effective for the next request; True when it was live."""
    with audit.trail(project.pk, actor) as trail:
        key = ApiKey.objects.select_for_update().filter(project=project, pk=key_id).first()
        if key is None:
            raise NotFound(f"No key {key_id} in {project}")
        if key.revoked_at is not None:
            return False
        key.revoke()
        trail.add(AuditAction.APIKEY_REVOKED, key=key.pk, prefix=key.prefix, name=key.name)
    return True


def project_policy_set(
    *, project: Project, actor: str, policy: AuthorityPolicy, timeout_s: int | None = None
) -> bool:
    """Set what intents naming no grant get, and the timeout of effects whose intent
    declares none (unchanged when None); True when either changed."""
    with audit.trail(project.pk, actor) as trail:
        was = Project.objects.select_for_update().values_list(
            "authority_policy", "effect_timeout_s"
        )
        before, timeout_before = was.get(pk=project.pk)
        timeout_s = timeout_s or timeout_before
        if (before, timeout_before) == (policy, timeout_s):
            return False
        Project.objects.filter(pk=project.pk).update(
            authority_policy=policy, effect_timeout_s=timeout_s
        )
        project.authority_policy, project.effect_timeout_s = policy, timeout_s
        if before != policy:
            trail.add(AuditAction.AUTHORITY_POLICY_SET, was=before, policy=policy.value)
        if timeout_before != timeout_s:
            trail.add(AuditAction.EFFECT_TIMEOUT_SET, was=timeout_before, timeout_s=timeout_s)
    return True


def project_retention_set(
    *,
    project: Project,
    actor: str,
    span_days: int,
    payload_days: int | None,
    require_archive: bool,
) -> bool:
    """Set how long the project keeps spans and payloads (durability.retention); True when
    it changed. The audit entry names the old policy and the new one."""
    with audit.trail(project.pk, actor) as trail:
        _lock(project)
        policy = RetentionPolicy.of(project)
        was = {
            "span_days": policy.span_days,
            "payload_days": policy.payload_days,
            "require_archive": policy.require_archive,
        }
        now = {
            "span_days": span_days,
            "payload_days": payload_days,
            "require_archive": require_archive,
        }
        if was == now and not policy._state.adding:
            return False
        RetentionPolicy.objects.update_or_create(
            project=project, defaults={**now, "updated": timezone.now()}
        )
        trail.add(
            AuditAction.RETENTION_SET,
            was=was,
            span_days=span_days,
            payload_days=payload_days,
            require_archive=require_archive,
        )
    return True


def project_redaction_set(
    *, project: Project, actor: str, patterns: list[str], keys: list[str]
) -> bool:
    """Set the project's own secret patterns and key names; True when they changed.

    Each pattern must pass `redaction.pattern_check`; the audit entry names the patterns
    and keys themselves (they describe secrets, they are not secrets).
    """
    for index, pattern in enumerate(patterns):
        try:
            redaction.pattern_check(pattern)
        except redaction.BadPattern as exc:
            raise Refused("patterns", f"Pattern {index + 1} ({pattern[:40]!r}): {exc}.") from exc
    if len(patterns) > redaction.MAX_PATTERNS:
        raise Refused("patterns", f"At most {redaction.MAX_PATTERNS} patterns.")
    if len(keys) > redaction.MAX_KEY_NAMES:
        raise Refused("keys", f"At most {redaction.MAX_KEY_NAMES} key names.")
    if any(len(key) > redaction.MAX_KEY_NAME_LENGTH for key in keys):
        raise Refused("keys", f"Key names are at most {redaction.MAX_KEY_NAME_LENGTH} characters.")
    with audit.trail(project.pk, actor) as trail:
        before = Project.objects.select_for_update().values("redaction_patterns", "redaction_keys")
        was = before.get(pk=project.pk)
        if was == {"redaction_patterns": patterns, "redaction_keys": keys}:
            return False
        Project.objects.filter(pk=project.pk).update(
            redaction_patterns=patterns, redaction_keys=keys
        )
        project.redaction_patterns, project.redaction_keys = patterns, keys
        trail.add(
            AuditAction.REDACTION_SET,
            was_patterns=was["redaction_patterns"],
            was_keys=was["redaction_keys"],
            patterns=patterns,
            keys=keys,
        )
    return True
