"""The project settings page (/settings/): members and their roles (added, or invited with
a one-time set-password link), API keys, the policy, the project's own secret patterns;
and each member's own choice of emails (/settings/notifications/) and of the time zone
their pages show times in.

The project's settings are for admins only (the `manage_project` permission): other members
get 403, strangers to a project 404, a user in no project the landing page. Every member
sets their own notifications.
The page shows the user's current project; each action names its project in the URL,
so a project switched in another tab cannot redirect a change to the wrong project.
Services (durability.accounts.members) make the changes and audit them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import PasswordResetConfirmView
from django.forms import Form
from django.http import Http404, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from durability import inbound
from durability.accounts import lockouts, members
from durability.accounts.access import (
    NOT_YOURS,
    SESSION_PROJECT,
    AuthedRequest,
    actor_of,
    project_access,
)
from durability.accounts.forms import (
    ApiKeyForm,
    MemberAddForm,
    MemberRoleForm,
    NotificationsForm,
    PolicyForm,
    RedactionForm,
    RetentionForm,
    TimeZoneForm,
)
from durability.accounts.roles import Access, Perm
from durability.accounts.timezones import COOKIE, chosen_zone_remember
from durability.models import (
    ApiKey,
    AuthorityPolicy,
    Membership,
    Preference,
    Project,
    RetentionPolicy,
    Role,
    zone_named,
)
from durability.site import site_url


def _page(
    request: AuthedRequest,
    access: Access,
    *,
    status: int = 200,
    problem: str = "",
    new_key: str = "",
    invited: tuple[str, str, str] | None = None,
    **bound: Form,
) -> HttpResponse:
    project = access.project
    memberships = list(
        Membership.objects.filter(project=project).select_related("user").order_by("user__username")
    )
    context: dict[str, Any] = {
        "access": access,
        "members": memberships,
        "locked": lockouts.locked_usernames([m.user.username for m in memberships]),
        "keys": ApiKey.objects.filter(project=project).order_by("-created", "-id"),
        "roles": Role.choices,
        "problem": problem,
        "new_key": new_key,
        "invited": invited,
        "add_form": bound.get("add_form") or MemberAddForm(),
        "key_form": bound.get("key_form") or ApiKeyForm(),
        "policy_form": bound.get("policy_form")
        or PolicyForm(
            initial={
                "authority_policy": project.authority_policy,
                "effect_timeout_s": project.effect_timeout_s,
            }
        ),
        "retention_form": bound.get("retention_form") or _retention_form(project),
        "redaction_form": bound.get("redaction_form")
        or RedactionForm(
            initial={
                "patterns": "\n".join(project.redaction_patterns),
                "keys": "\n".join(project.redaction_keys),
            }
        ),
    }
    response = render(request, "durability/accounts/settings.html", context, status=status)
    if new_key or invited:
        # The raw key (or the one-time link) is in this response only: no cache may keep it.
        add_never_cache_headers(response)
    return response


def _retention_form(project: Project) -> RetentionForm:
    policy = RetentionPolicy.of(project)
    return RetentionForm(
        initial={
            "span_days": policy.span_days,
            "payload_days": policy.payload_days,
            "require_archive": policy.require_archive,
        }
    )


def _errors(form: Form) -> str:
    return " ".join(f"{name}: {' '.join(map(str, errs))}" for name, errs in form.errors.items())


@login_required
@require_GET
def project_settings(request: AuthedRequest) -> HttpResponse:
    access = project_access(request, Perm.MANAGE)
    return _page(request, access)


@login_required
@require_POST
def member_add(request: AuthedRequest, project_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            added = members.member_add(
                project=access.project,
                actor=actor_of(request),
                username=data["username"],
                role=Role(data["role"]),
                email=data["email"],
            )
        except members.Refused as exc:
            form.add_error(exc.field, str(exc))
        else:
            username = data["username"]
            if added.set_password_path:
                links = (site_url() + added.set_password_path, site_url() + added.accept_path)
                return _page(request, access, invited=(username, *links))
            messages.success(request, NEUTRAL.format(username=username, role=data["role"]))
            return redirect("settings")
    return _page(request, access, status=400, add_form=form)


# One answer whether the user was made by this invitation, exists, is another project's, has
# no address, or cannot be invited: an admin learns nothing about people outside their
# project (and a new user is no member until they accept, so the members list tells no more).
NEUTRAL = (
    "If {username} can be invited, an invitation to join as {role} is on its way to them: "
    "they become a member when they accept it. To invite someone new, give their email "
    "address."
)


@login_required
@require_http_methods(["GET", "POST"])
def invitation(request: AuthedRequest, invitation_id: int, token: str) -> HttpResponseBase:
    """An emailed invitation: the invited user, logged in as themselves, accepts it here."""
    try:
        if request.method == "POST":
            membership = members.invitation_accept(
                invitation_id=invitation_id, token=token, user=request.user
            )
            request.session[SESSION_PROJECT] = membership.project_id
            messages.success(request, f"You joined {membership.project} as {membership.role}.")
            return redirect("queue")
        found = members.invitation_find(invitation_id=invitation_id, token=token, user=request.user)
    except members.InvitationGone as exc:
        context = {"gone": str(exc)}
        return render(request, "durability/accounts/invitation.html", context, status=404)
    response = render(request, "durability/accounts/invitation.html", {"invitation": found})
    add_never_cache_headers(response)
    return response


@login_required
@require_POST
def member_role(request: AuthedRequest, project_id: int, membership_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        return _page(request, access, status=400, problem=_errors(form))
    role = Role(form.cleaned_data["role"])
    try:
        changed = members.member_role_change(
            project=access.project, actor=actor_of(request), membership_id=membership_id, role=role
        )
    except members.NotFound as exc:
        raise Http404(str(exc)) from None
    except members.Refused as exc:
        return _page(request, access, status=409, problem=str(exc))
    if changed:
        messages.success(request, f"Role changed to {role.value}.")
    return redirect("settings")


@login_required
@require_POST
def member_remove(request: AuthedRequest, project_id: int, membership_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    try:
        removed = members.member_remove(
            project=access.project, actor=actor_of(request), membership_id=membership_id
        )
    except members.NotFound as exc:
        raise Http404(str(exc)) from None
    except members.Refused as exc:
        return _page(request, access, status=409, problem=str(exc))
    messages.success(request, f"{removed.user} is no longer a member of {access.project}.")
    # Who removed themselves can no longer see this page.
    return redirect("index" if removed.user_id == request.user.pk else "settings")


@login_required
@require_POST
def member_unlock(request: AuthedRequest, project_id: int, membership_id: int) -> HttpResponse:
    """Let a member who locked themselves out (too many failed logins) log in again."""
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    membership = get_object_or_404(
        Membership.objects.select_related("user"), project=access.project, pk=membership_id
    )
    username = membership.user.get_username()
    if lockouts.login_unlock(project=access.project, actor=actor_of(request), username=username):
        messages.success(request, f"{username} can log in again.")
    return redirect("settings")


@login_required
@require_POST
def apikey_create(request: AuthedRequest, project_id: int) -> HttpResponse:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _page(request, access, status=400, key_form=form)
    _, raw = members.apikey_create(
        project=access.project, actor=actor_of(request), name=form.cleaned_data["name"]
    )
    return _page(request, access, new_key=raw)


@login_required
@require_POST
def apikey_revoke(request: AuthedRequest, project_id: int, key_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    try:
        revoked = members.apikey_revoke(
            project=access.project, actor=actor_of(request), key_id=key_id
        )
    except members.NotFound as exc:
        raise Http404(str(exc)) from None
    if revoked:
        messages.success(request, "Key revoked: it no longer authenticates.")
    return redirect("settings")


@login_required
@require_POST
def policy(request: AuthedRequest, project_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = PolicyForm(request.POST)
    if not form.is_valid():
        return _page(request, access, status=400, policy_form=form)
    new = AuthorityPolicy(form.cleaned_data["authority_policy"])
    timeout_s = form.cleaned_data["effect_timeout_s"]
    if members.project_policy_set(
        project=access.project, actor=actor_of(request), policy=new, timeout_s=timeout_s
    ):
        messages.success(
            request,
            f"Intents that name no grant now get: {new.label}; an attempt declaring no "
            f"timeout times out after {access.project.effect_timeout_s} s.",
        )
    return redirect("settings")


@login_required
@require_POST
def retention(request: AuthedRequest, project_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = RetentionForm(request.POST)
    if not form.is_valid():
        return _page(request, access, status=400, retention_form=form)
    data = form.cleaned_data
    if members.project_retention_set(
        project=access.project,
        actor=actor_of(request),
        span_days=data["span_days"],
        payload_days=data["payload_days"],
        require_archive=data["require_archive"],
    ):
        messages.success(request, "Retention saved: the next hourly pass applies it.")
    return redirect("settings")


@login_required
@require_POST
def redaction(request: AuthedRequest, project_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.MANAGE, project_id=project_id)
    form = RedactionForm(request.POST)
    if form.is_valid():
        try:
            changed = members.project_redaction_set(
                project=access.project,
                actor=actor_of(request),
                patterns=form.cleaned_data["patterns"],
                keys=form.cleaned_data["keys"],
            )
        except members.Refused as exc:
            form.add_error(exc.field, str(exc))
        else:
            if changed:
                messages.success(request, "Redaction saved: it applies from now on.")
            return redirect("settings")
    return _page(request, access, status=400, redaction_form=form)


@login_required
@require_GET
def notifications(request: AuthedRequest) -> HttpResponse:
    """The member's own choice of emails about their current project's cases."""
    access = project_access(request, Perm.VIEW)
    return _notifications_page(request, access)


@login_required
@require_POST
def notifications_set(request: AuthedRequest, project_id: int) -> HttpResponseBase:
    access = project_access(request, Perm.VIEW, project_id=project_id)
    form = NotificationsForm(request.POST)
    if not form.is_valid():
        return _notifications_page(request, access, form=form, status=400)
    if members.member_notifications_set(
        project=access.project,
        actor=actor_of(request),
        user=request.user,
        choices=form.cleaned_data,
    ):
        messages.success(request, f"Your emails about {access.project} are saved.")
    return redirect("settings-notifications")


@login_required
@require_POST
def time_zone_set(request: AuthedRequest) -> HttpResponseBase:
    access = project_access(request, Perm.VIEW)
    form = TimeZoneForm(request.POST)
    if not form.is_valid():
        return _notifications_page(request, access, zone_form=form, status=400)
    chosen = form.cleaned_data["time_zone"]
    changed = members.preference_time_zone_set(user=request.user, time_zone=chosen)
    chosen_zone_remember(request, request.user)
    if changed:
        messages.success(request, f"Times are shown in {chosen or 'your browser’s time zone'}.")
    return redirect("settings-notifications")


def _notifications_page(
    request: AuthedRequest,
    access: Access,
    *,
    form: Form | None = None,
    zone_form: Form | None = None,
    status: int = 200,
) -> HttpResponse:
    if form is None:
        membership = Membership.objects.get(project=access.project, user=request.user)
        form = NotificationsForm(
            initial={name: getattr(membership, name) for name in members.NOTIFY_FIELDS}
        )
    if zone_form is None:
        chosen = Preference.objects.filter(user=request.user).values_list("time_zone", flat=True)
        zone_form = TimeZoneForm(initial={"time_zone": chosen.first() or ""})
    context = {
        "access": access,
        "form": form,
        "zone_form": zone_form,
        "browser_zone": zone_named(request.COOKIES.get(COOKIE)),
        "email": request.user.email,
    }
    return render(request, "durability/accounts/notifications.html", context, status=status)


class SetPassword(PasswordResetConfirmView):
    """The one-time link of an invitation: the new user chooses a password, once; then
    they are logged in. Django's reset token no longer matches once a password is set."""

    template_name = "durability/accounts/set_password.html"
    post_reset_login = True
    post_reset_login_backend = "django.contrib.auth.backends.ModelBackend"
    success_url = reverse_lazy("index")

    def get_success_url(self) -> str:
        """The invitation that made them, to accept; the index when there is none."""
        waiting = members.invitation_waiting(self.user) if self.user is not None else ""
        return waiting or super().get_success_url()


@login_required
@require_POST
def project_switch(request: AuthedRequest) -> HttpResponse:
    """Make another of the user's projects the current one."""
    chosen = inbound.number_param(request.POST.get("project"))
    if chosen is None:
        raise Http404(NOT_YOURS)
    access = project_access(request, Perm.VIEW, project_id=chosen)
    request.session[SESSION_PROJECT] = access.project.pk
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = reverse("queue")
    return redirect(target)
