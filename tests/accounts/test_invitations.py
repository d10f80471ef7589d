"""Inviting people from the settings page: everyone is emailed an invitation and joins on
accepting it; a new user's email also carries a one-time link to choose a password (both
links shown once to the admin only when no mail server would deliver them). Projects do
not trust each other: an admin learns nothing about people outside their project, and cannot
take over an account another project invited."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core import mail
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from durability.models import AuditEntry, Invitation, Membership, Notice, NoticeKind, Project, Role
from tests.desk.support import logged_in

LINK = r"http://[^/\s]+(/welcome/[\w-]+/[\w-]+/)"
ACCEPT = r"http://[^/\s]+(/invitations/\d+/\w+/)"
CONSOLE = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}


@pytest.fixture(autouse=True)
def inline(settings):
    settings.REDIS_URL = ""


def _invite(client, project, username="nina", email="nina@example.com", role="operator"):
    return client.post(
        f"/settings/{project.pk}/members/", {"username": username, "email": email, "role": role}
    )


def test_an_invitation_creates_the_user_and_emails_a_one_time_link_and_the_invitation(
    project, admin, django_capture_on_commit_callbacks
):
    client = logged_in(admin)
    with django_capture_on_commit_callbacks(execute=True):
        r = _invite(client, project)
    assert r.status_code == 302
    nina = User.objects.get(username="nina")
    assert nina.email == "nina@example.com" and not nina.has_usable_password()
    # No member before accepting: the members list shows nothing the answer would not.
    assert not Membership.objects.filter(project=project, user=nina).exists()
    assert Invitation.objects.get(project=project, user=nina).role == Role.OPERATOR
    entry = AuditEntry.objects.filter(project=project).latest("id")
    assert entry.action == "member_invited" and entry.actor == "user:ada"
    assert entry.data == {"username": "nina", "role": "operator"}
    # A mail server delivers the link: the admin never sees it.
    page = client.get(r["Location"]).content.decode()
    assert "If nina can be invited" in page and "/welcome/" not in page
    assert ">nina<" not in page
    (email,) = mail.outbox
    assert email.to == ["nina@example.com"]
    assert "ada invited you" in email.subject
    assert "Your username: nina" in email.body and re.search(ACCEPT, email.body)
    # The link is a reset token made when it is written: it lets nina in, until used.
    sent = re.search(LINK, email.body)
    assert sent
    uid, token = sent.group(1).strip("/").split("/")[1:]
    assert uid == urlsafe_base64_encode(force_bytes(nina.pk))
    assert default_token_generator.check_token(nina, token)
    assert Notice.objects.get().kind == NoticeKind.JOIN


def test_without_a_mail_server_the_admin_is_shown_the_links_once(project, admin, settings):
    settings.MAILERS = CONSOLE
    r = _invite(logged_in(admin), project)
    assert r.status_code == 200
    assert re.search(ACCEPT, r.content.decode())
    shown = re.search(LINK, r.content.decode())
    assert shown and "no-store" in r["Cache-Control"]
    assert "No mail server is configured" in r.content.decode()
    uid, token = shown.group(1).strip("/").split("/")[1:]
    assert default_token_generator.check_token(User.objects.get(username="nina"), token)


def test_the_link_sets_a_password_once_and_is_refused_after(
    project, admin, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        _invite(logged_in(admin), project)
    path = re.search(LINK, mail.outbox[0].body).group(1)
    browser = Client()
    form = browser.get(path, follow=True)
    assert form.status_code == 200 and b"Choose your password" in form.content
    done = browser.post(
        form.redirect_chain[-1][0],
        {"new_password1": "a long passphrase", "new_password2": "a long passphrase"},
    )
    # Logged in, and taken to the invitation: a member once they accept it.
    accept = re.search(ACCEPT, mail.outbox[0].body).group(1)
    assert done.status_code == 302 and done["Location"] == accept
    assert browser.post(accept).status_code == 302
    assert browser.get("/queue/").status_code == 200  # in the project
    nina = User.objects.get(username="nina")
    assert Membership.objects.get(project=project, user=nina).role == Role.OPERATOR
    assert nina.check_password("a long passphrase")

    again = Client().get(path, follow=True)
    assert b"This link no longer works" in again.content
    assert b"new_password1" not in again.content
    nina.refresh_from_db()
    assert nina.check_password("a long passphrase")


def test_an_existing_user_is_invited_and_joins_on_accepting(
    project, admin, newbie_mail, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = _invite(logged_in(admin), project, username="newbie", email="")
    assert r.status_code == 302
    assert not Membership.objects.filter(project=project, user=newbie_mail).exists()
    entry = AuditEntry.objects.filter(project=project).latest("id")
    assert (entry.action, entry.data) == (
        "member_invited",
        {"username": "newbie", "role": "operator"},
    )
    (email,) = mail.outbox
    assert email.to == ["newbie@example.com"] and "/welcome/" not in email.body
    assert "ada invited you to join alpha on Tallybook as operator" in email.body
    path = re.search(ACCEPT, email.body).group(1)
    # Only newbie, logged in, accepts: another user (or a forged token) is told it is gone.
    assert logged_in(admin).post(path).status_code == 404
    assert (
        logged_in(newbie_mail).get(path.replace(path.split("/")[-2], "0" * 32)).status_code == 404
    )
    newbie = logged_in(newbie_mail)
    assert b"Accept and join" in newbie.get(path).content
    accepted = newbie.post(path)
    assert accepted.status_code == 302 and accepted["Location"] == "/queue/"
    assert Membership.objects.get(project=project, user=newbie_mail).role == Role.OPERATOR
    joined = AuditEntry.objects.filter(project=project).latest("id")
    assert (joined.action, joined.actor) == ("member_added", "user:newbie")
    assert joined.data == {"username": "newbie", "role": "operator", "invited_by": "user:ada"}
    assert newbie.get("/queue/").status_code == 200
    assert newbie.post(path).status_code == 404  # once


@pytest.fixture
def newbie_mail(db):
    return User.objects.create_user("newbie", email="newbie@example.com", password="pw")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"username": "nina", "email": "not-an-address"}, "email", "Enter a valid email"),
        ({"username": "no spaces", "email": "x@example.com"}, "username", "Enter a valid"),
    ],
)
def test_an_invitation_says_what_is_wrong_with_which_field(
    project, admin, newbie_mail, data, field, message
):
    users = User.objects.count()
    r = logged_in(admin).post(f"/settings/{project.pk}/members/", {**data, "role": "viewer"})
    assert r.status_code == 400
    assert message in " ".join(r.context["add_form"].errors[field])
    assert User.objects.count() == users and not Notice.objects.exists()


@pytest.mark.parametrize(
    ("persona", "status"), [("alice", 403), ("viewer", 403), ("outsider", 404)]
)
def test_only_the_projects_admins_invite(request, project, persona, status):
    r = _invite(logged_in(request.getfixturevalue(persona)), project)
    assert r.status_code == status
    assert not User.objects.filter(username="nina").exists() and mail.outbox == []


def _said(response) -> str:
    """The message the admin is shown after adding someone."""
    return " ".join(str(m) for m in response.context["messages"])


@pytest.fixture
def beta(db):
    """Another project, and its admin."""
    project = Project.objects.create(name="beta")
    b_admin = User.objects.create_user("b_admin")
    Membership.objects.create(project=project, user=b_admin, role=Role.ADMIN)
    return project, b_admin


def test_an_admin_learns_nothing_about_people_outside_their_project(project, admin, beta):
    b, b_admin = beta
    User.objects.create_user("zed", email="zed@example.com", password="pw")  # only in beta
    Membership.objects.create(project=b, user=User.objects.get(username="zed"), role="viewer")
    User.objects.create_user("quiet", password="pw")  # no address to invite
    client = logged_in(admin)
    answers = {}
    for username, email in [
        ("ghost", ""),  # nobody
        ("zed", ""),  # another project's member: invited
        ("quiet", ""),  # a user who cannot be invited
        ("ghost", "zed@example.com"),  # someone's address under a free name
    ]:
        r = client.post(
            f"/settings/{project.pk}/members/",
            {"username": username, "email": email, "role": "viewer"},
            follow=True,
        )
        answers[username, email] = (r.status_code, _said(r).replace(username, "X"))
    assert len(set(answers.values())) == 1, answers
    assert "If X can be invited" in next(iter(answers.values()))[1]
    assert not Membership.objects.filter(project=project).exclude(user=admin).exists()
    # Nor does the project's audit log, which its members read: it says what was asked.
    entries = AuditEntry.objects.filter(project=project).order_by("seq")
    assert [(e.action, e.data["username"]) for e in entries] == [
        ("member_invited", username) for username, _ in answers
    ]


def test_adding_a_new_name_and_address_answers_as_adding_an_existing_one(project, admin):
    # The attack: a new username and email answered "nina is invited: an email with a
    # link…" and nina was a member at once; an existing user got the neutral answer.
    User.objects.create_user("zed", email="zed@example.com", password="pw")
    client = logged_in(admin)
    answers, listed = set(), set()
    for username, email in [("nina", "nina@example.com"), ("zed", "zed@example.com")]:
        r = _invite(client, project, username=username, email=email)
        assert r.status_code == 302
        page = client.get(r["Location"])
        answers.add(_said(page).replace(username, "X"))
        listed.add(tuple(m.user.username for m in page.context["members"]))
    assert len(answers) == 1 and "If X can be invited" in answers.pop()
    assert listed == {("ada",)}
    assert set(Invitation.objects.values_list("user__username", flat=True)) == {"nina", "zed"}


def test_an_account_invited_by_one_project_cannot_be_taken_over_from_another(
    project, admin, beta, settings, django_capture_on_commit_callbacks
):
    # The attack: a_admin invites inv_x and is shown the set-password link (no mail server);
    # b_admin adds inv_x to beta; a_admin sets the password and reads beta's cases.
    settings.MAILERS = CONSOLE
    b, b_admin = beta
    shown = _invite(logged_in(admin), project, username="inv_x", email="x@example.com")
    path = re.search(LINK, shown.content.decode()).group(1)
    b_client = logged_in(b_admin)
    # By name alone, a user who has chosen no password yet is not b's to add.
    r = b_client.post(
        f"/settings/{b.pk}/members/", {"username": "inv_x", "role": "operator"}, follow=True
    )
    assert "If inv_x can be invited" in _said(r)
    inv_x = User.objects.get(username="inv_x")
    assert not Membership.objects.filter(project=b, user=inv_x).exists()
    assert not Invitation.objects.filter(project=b).exists()
    # Through their own address they are invited, and the link a_admin holds dies. (The
    # email is kept where the test reads it, as a mail server would deliver it.)
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    with django_capture_on_commit_callbacks(execute=True):
        b_client.post(
            f"/settings/{b.pk}/members/",
            {"username": "inv_x", "email": "X@example.com", "role": "operator"},
        )
    assert Invitation.objects.filter(project=b, user=inv_x).exists()
    stale = Client().get(path, follow=True)
    assert b"This link no longer works" in stale.content
    # The email, to inv_x's own address, lets its owner choose a password and accept.
    (email,) = [m for m in mail.outbox if "join beta" in m.body]
    assert email.to == ["x@example.com"]
    owner = Client()
    form = owner.get(re.search(LINK, email.body).group(1), follow=True)
    owner.post(
        form.redirect_chain[-1][0],
        {"new_password1": "a long passphrase", "new_password2": "a long passphrase"},
    )
    assert owner.post(re.search(ACCEPT, email.body).group(1)).status_code == 302
    assert Membership.objects.get(project=b, user=inv_x).role == Role.OPERATOR


def test_staff_see_a_projects_pending_invitations(project, admin, newbie_mail):
    _invite(logged_in(admin), project, username="newbie", email="")
    staff = User.objects.create_superuser("root", password="pw")
    page = logged_in(staff).get(f"/admin/durability/project/{project.pk}/change/")
    assert page.status_code == 200 and "newbie" in page.content.decode()
