"""Who may do what on the desk: every page and action, for each role and for strangers."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from durability.models import AuditEntry, Case, Effect, State
from tests.desk.support import (
    logged_in,
    search,
    uncertain_case,
)

PERSONAS = ["viewer", "alice", "admin", "outsider"]  # alice is an operator


@pytest.fixture
def case(project):
    return uncertain_case(project)


def _actions(case):
    """Each state-changing request of a case page: (name, path, data)."""
    return {
        "resolve": (
            f"/cases/{case.pk}/resolve/",
            {"verdict": "not_happened", "version": case.version, "note": "checked"},
        ),
        "assign": (f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": "me"}),
        "comment": (f"/cases/{case.pk}/comment/", {"body": "looking"}),
        "bulk": ("/queue/bulk/", {"verb": "assign", "scope": "matching", "assign_to": "me"}),
    }


# What each persona gets for each action: operators and admins act; a viewer is refused;
# a stranger is not told the case exists.
EXPECTED = {
    "viewer": {"resolve": 403, "assign": 403, "comment": 403, "bulk": 403},
    "alice": {"resolve": 302, "assign": 302, "comment": 302, "bulk": 200},
    "admin": {"resolve": 302, "assign": 302, "comment": 302, "bulk": 200},
    "outsider": {"resolve": 404, "assign": 404, "comment": 404, "bulk": 200},
}


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("action", ["resolve", "assign", "comment", "bulk"])
def test_each_action_is_allowed_by_role_in_the_cases_project(request, case, persona, action):
    user = request.getfixturevalue(persona)
    path, data = _actions(case)[action]
    before = AuditEntry.objects.filter(actor=f"user:{user.username}", project=case.project).count()
    r = logged_in(user).post(path, data)
    assert r.status_code == EXPECTED[persona][action]
    after = AuditEntry.objects.filter(actor=f"user:{user.username}", project=case.project).count()
    case.refresh_from_db()
    if r.status_code in (302, 200) and persona != "outsider":
        assert after > before  # acted, and audited under the user's name
    else:
        assert after == before
        assert case.closed is None and case.assignee is None and not case.comments.exists()


def test_a_stranger_with_a_project_of_their_own_never_sees_this_one(project, outsider):
    # A key no random token on the page could contain by chance.
    case = uncertain_case(project, "refund:alpha-only-9f3e")
    client = logged_in(outsider)
    assert client.get(f"/cases/{case.pk}/").status_code == 404
    queue = client.get("/queue/").content.decode()
    assert "alpha-only" not in queue and "gamma" in queue
    assert "alpha-only" not in client.get("/audit/").content.decode()
    assert client.post("/projects/switch/", {"project": case.project_id}).status_code == 404


def test_a_logged_in_user_without_a_project_is_told_so(case, mallory):
    client = logged_in(mallory)
    assert "not a member of any project" in client.get("/queue/").content.decode()
    assert client.get(f"/cases/{case.pk}/").status_code == 404


@pytest.mark.parametrize("persona", ["viewer", "alice", "admin"])
def test_every_member_reads_the_queue_the_case_and_the_audit_log(request, case, persona):
    client = logged_in(request.getfixturevalue(persona))
    assert case.summary in client.get("/queue/").content.decode()
    assert client.get(f"/cases/{case.pk}/").status_code == 200
    assert client.get("/audit/").status_code == 200


@pytest.mark.parametrize(
    "path", ["/queue/", "/queue/pulse/", "/audit/", "/cases/1/", "/queue/bulk/preview/"]
)
def test_every_page_needs_a_login(db, path):
    r = Client().get(path)
    assert r.status_code == 302 and r["Location"].startswith("/login/")


@pytest.mark.parametrize("action", ["resolve", "assign", "comment", "bulk"])
def test_no_state_changes_on_get(case, alice, action):
    path, data = _actions(case)[action]
    assert logged_in(alice).get(path, data).status_code == 405
    case.refresh_from_db()
    assert case.closed is None and case.assignee is None
    assert Effect.objects.get(pk=case.effect_id).state == State.TIMED_OUT


def test_posts_without_the_csrf_token_are_refused_and_htmx_sends_it_in_a_header(case, alice):
    client = logged_in(alice, enforce_csrf_checks=True)
    path, data = _actions(case)["assign"]
    assert client.post(path, data).status_code == 403
    page = client.get("/queue/").content.decode()
    token = search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page).group(1)
    r = client.post(path, data, headers={"HX-Request": "true", "X-CSRFToken": token})
    assert r.status_code == 200
    assert Case.objects.get(pk=case.pk).assignee == alice


@pytest.mark.parametrize("path", ["/queue/", "/audit/", "case"])
def test_pages_carry_a_strict_csp_and_no_inline_script_or_style(case, alice, path):
    r = logged_in(alice).get(f"/cases/{case.pk}/" if path == "case" else path)
    policy = r["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "unsafe-inline" not in policy
    html = r.content.decode()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert "<style" not in html and " style=" not in html
    assert " hx-on" not in html and "onclick=" not in html
