"""Saved views: a named filter of the queue, a member's own or shared with the project,
validated field by field, and never seen or touched from outside its project."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth.models import User

from durability.models import Membership, Project, Role, SavedView
from tests.desk.support import logged_in, member

FILTER = "reason=uncertain&target=stripe"


def _save(user: User, name: str = "Stripe", filter: str = FILTER, **more: str):
    return logged_in(user).post("/queue/views/", {"name": name, "filter": filter, **more})


def _listed(user: User, path: str = "/queue/") -> str:
    page = html.unescape(logged_in(user).get(path).content.decode())
    start = page.index('<section class="views"')
    return " ".join(page[start : page.index("</section>", start)].split())


@pytest.fixture
def bob(project: Project) -> User:
    """A teammate of alice's: another operator of the project."""
    return member(project, "bob", Role.OPERATOR)


def test_a_member_saves_the_queue_filter_under_a_name(project, alice):
    r = _save(alice, "  Stripe timeouts  ", "target=stripe&reason=uncertain&after=1.2")
    view = SavedView.objects.get()
    # The filter's own fields, in the queue's order, without the page cursor.
    assert (view.name, view.query, view.shared) == ("Stripe timeouts", FILTER, False)
    assert (view.project, view.owner) == (project, alice)
    assert r.status_code == 302 and r["Location"] == f"/queue/?{FILTER}"
    listed = _listed(alice, f"/queue/?{FILTER}")
    assert f'<a href="/queue/?{FILTER}" aria-current="page">Stripe timeouts</a>' in listed


def test_saving_under_a_name_of_yours_again_gives_that_view_the_new_filter(alice):
    _save(alice, "Mine")
    _save(alice, "Mine", "assignee=me", shared="on")
    view = SavedView.objects.get()
    assert (view.query, view.shared) == ("assignee=me", True)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": ""}, "name", "This field is required."),
        ({"name": "x" * 81}, "name", "at most 80 characters"),
        ({"filter": ""}, "filter", "This is the whole queue: filter it first"),
        ({"filter": "after=3.4"}, "filter", "This is the whole queue"),
        ({"filter": "reason=bogus"}, "filter", "reason: Select a valid choice."),
        ({"filter": "severity=9"}, "filter", "severity: Select a valid choice."),
        ({"filter": "x" * 1001}, "filter", "at most 1000 characters"),
    ],
)
def test_a_view_is_refused_field_by_field(alice, fields, field, message):
    r = logged_in(alice).post("/queue/views/", {"name": "A view", "filter": FILTER, **fields})
    assert r.status_code == 400
    page = html.unescape(r.content.decode())
    assert f"<li>{field}: " in page and message in page
    assert not SavedView.objects.exists()


def test_a_personal_view_is_its_owners_alone(alice, bob):
    _save(alice, "Alice's")
    assert "Alice's" in _listed(alice)
    assert "Alice's" not in _listed(bob)
    view = SavedView.objects.get()
    # Bob cannot delete it either: to him it does not exist.
    assert logged_in(bob).post(f"/queue/views/{view.pk}/delete/").status_code == 404
    assert SavedView.objects.exists()


def test_a_shared_view_is_listed_for_every_member_with_its_owner(alice, bob, viewer):
    _save(alice, "Team", shared="on")
    for user in (bob, viewer):
        assert 'Team</a> <span class="muted">shared by alice</span>' in _listed(user)
    view = SavedView.objects.get()
    # A teammate may use it, not delete it.
    assert logged_in(bob).post(f"/queue/views/{view.pk}/delete/").status_code == 403
    assert 'aria-label="Delete the view Team"' not in _listed(bob)
    assert SavedView.objects.exists()


def test_a_viewer_saves_views_for_themselves_but_cannot_share_them(viewer):
    assert "share with the project" not in _listed(viewer, f"/queue/?{FILTER}")
    r = _save(viewer, "Shared?", shared="on")
    assert r.status_code == 400
    assert "shared: Your role (viewer) can save views for yourself, not share them." in (
        html.unescape(r.content.decode())
    )
    assert not SavedView.objects.exists()
    assert _save(viewer, "Mine").status_code == 302
    assert SavedView.objects.get().owner == viewer


def test_the_owner_or_a_project_admin_deletes_a_shared_view(alice, admin):
    _save(alice, "Team", shared="on")
    _save(alice, "Other team", "target=stripe", shared="on")
    team, other = SavedView.objects.order_by("name")[1], SavedView.objects.order_by("name")[0]
    r = logged_in(alice).post(f"/queue/views/{team.pk}/delete/?from=target%3Dstripe")
    assert r.status_code == 302 and r["Location"] == "/queue/?target=stripe"
    assert logged_in(admin).post(f"/queue/views/{other.pk}/delete/").status_code == 302
    assert not SavedView.objects.exists()


def test_another_projects_member_cannot_see_use_or_delete_a_view(alice, outsider, mallory):
    _save(alice, "Team", shared="on")
    view = SavedView.objects.get()
    assert "Team" not in _listed(outsider)
    for stranger in (outsider, mallory):
        r = logged_in(stranger).post(f"/queue/views/{view.pk}/delete/")
        assert r.status_code == 404
    assert SavedView.objects.exists()


def test_a_view_belongs_to_the_project_it_was_saved_in(alice, project):
    beta = Project.objects.create(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.OPERATOR)
    desk = logged_in(alice)
    desk.post("/projects/switch/", {"project": beta.pk})
    desk.post("/queue/views/", {"name": "Beta's", "filter": FILTER, "shared": "on"})
    assert SavedView.objects.get().project == beta
    assert "Beta's" in html.unescape(desk.get("/queue/").content.decode())
    desk.post("/projects/switch/", {"project": project.pk})
    assert "Beta's" not in html.unescape(desk.get("/queue/").content.decode())
    # Nor is it deleted from there: only in its own project, the current one.
    view = SavedView.objects.get()
    assert desk.post(f"/queue/views/{view.pk}/delete/").status_code == 404
