"""Each member chooses which emails about a project's cases they receive: all by default,
saved per project, audited in its chain."""

from __future__ import annotations

from durability.models import AuditEntry, Membership, Project, Role
from tests.desk.support import logged_in

CHOICES = ("notify_assigned", "notify_mentioned", "notify_overdue")


def _choices(user, project):
    return Membership.objects.filter(user=user, project=project).values(*CHOICES).get()


def test_every_email_is_on_until_the_member_turns_it_off(project, viewer):
    assert _choices(viewer, project) == dict.fromkeys(CHOICES, True)
    page = logged_in(viewer).get("/settings/notifications/").content.decode()
    assert page.count("checked") == 3
    assert "A case is assigned to me" in page and "no email address" in page


def test_a_member_turns_emails_off_and_the_audit_says_which(project, alice):
    client = logged_in(alice)
    r = client.post(f"/settings/{project.pk}/notifications/", {"notify_assigned": "on"})
    assert r.status_code == 302 and r["Location"] == "/settings/notifications/"
    assert _choices(alice, project) == {
        "notify_assigned": True,
        "notify_mentioned": False,
        "notify_overdue": False,
    }
    entry = AuditEntry.objects.get(project=project, action="notifications_set")
    assert entry.actor == "user:alice"
    assert entry.data == {
        "username": "alice",
        "was": ["assigned", "mentioned", "overdue"],
        "now": ["assigned"],
    }
    # The same choice again changes and records nothing.
    client.post(f"/settings/{project.pk}/notifications/", {"notify_assigned": "on"})
    assert AuditEntry.objects.filter(action="notifications_set").count() == 1
    page = client.get("/settings/notifications/").content.decode()
    assert page.count("checked") == 1


def test_choices_are_per_project(project, alice):
    beta = Project.objects.create(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.OPERATOR)
    logged_in(alice).post(f"/settings/{beta.pk}/notifications/", {})
    assert _choices(alice, beta) == dict.fromkeys(CHOICES, False)
    assert _choices(alice, project) == dict.fromkeys(CHOICES, True)


def test_a_stranger_cannot_set_choices_in_a_project_not_theirs(project, outsider):
    r = logged_in(outsider).post(f"/settings/{project.pk}/notifications/", {})
    assert r.status_code == 404
    assert not AuditEntry.objects.filter(action="notifications_set").exists()
