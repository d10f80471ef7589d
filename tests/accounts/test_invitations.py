"""Inviting people from the settings page: a new user gets a one-time link to choose a
password (emailed after the commit, and shown once to the admin), an existing one joins."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core import mail
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from durability.models import AuditEntry, Membership, Notice, NoticeKind, Role
from tests.desk.support import logged_in

LINK = r"http://[^/\s]+(/welcome/[\w-]+/[\w-]+/)"


@pytest.fixture(autouse=True)
def inline(settings):
    settings.REDIS_URL = ""


def _invite(client, project, username="nina", email="nina@example.com", role="operator"):
    return client.post(
        f"/settings/{project.pk}/members/", {"username": username, "email": email, "role": role}
    )


def test_an_invitation_creates_the_user_and_membership_and_emails_a_one_time_link(
    project, admin, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = _invite(logged_in(admin), project)
    assert r.status_code == 200
    nina = User.objects.get(username="nina")
    assert nina.email == "nina@example.com" and not nina.has_usable_password()
    assert Membership.objects.get(project=project, user=nina).role == Role.OPERATOR
    entry = AuditEntry.objects.filter(project=project).latest("id")
    assert entry.action == "member_invited" and entry.actor == "user:ada"
    assert entry.data == {"username": "nina", "role": "operator"}
    # Shown once to the admin, in a page no cache keeps.
    page = r.content.decode()
    shown = re.search(LINK, page)
    assert shown and "no-store" in r["Cache-Control"]
    (email,) = mail.outbox
    assert email.to == ["nina@example.com"]
    assert email.subject == "[Tallybook · alpha] ada invited you to alpha"
    assert "Your username: nina" in email.body
    # Each link is a reset token made when it is written: both let nina in, until used.
    sent = re.search(LINK, email.body)
    for link in (shown, sent):
        assert link
        uid, token = link.group(1).strip("/").split("/")[1:]
        assert uid == urlsafe_base64_encode(force_bytes(nina.pk))
        assert default_token_generator.check_token(nina, token)
    assert Notice.objects.get().kind == NoticeKind.INVITED


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
    assert done.status_code == 302 and done["Location"] == "/"
    assert browser.get("/queue/").status_code == 200  # logged in, in the project
    nina = User.objects.get(username="nina")
    assert nina.check_password("a long passphrase")

    again = Client().get(path, follow=True)
    assert b"This link no longer works" in again.content
    assert b"new_password1" not in again.content
    nina.refresh_from_db()
    assert nina.check_password("a long passphrase")


def test_an_existing_user_is_added_with_the_role_and_no_email(project, admin, newbie_mail):
    r = _invite(logged_in(admin), project, username="newbie", email="")
    assert r.status_code == 302
    assert Membership.objects.get(project=project, user=newbie_mail).role == Role.OPERATOR
    newbie_mail.refresh_from_db()
    assert newbie_mail.has_usable_password()
    assert mail.outbox == [] and not Notice.objects.exists()
    assert AuditEntry.objects.filter(project=project).latest("id").action == "member_added"


@pytest.fixture
def newbie_mail(db):
    return User.objects.create_user("newbie", email="newbie@example.com", password="pw")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"username": "nina", "email": ""}, "username", "Give an email address to invite them"),
        ({"username": "nina", "email": "not-an-address"}, "email", "Enter a valid email"),
        ({"username": "nina", "email": "newbie@example.com"}, "email", "already has"),
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
