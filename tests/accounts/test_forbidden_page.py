"""A 403 is a page in the desk's layout: it says which role the action needs and who the
project's admins are, not a bare "403 Forbidden"."""

from __future__ import annotations

import re

from tests.desk.support import logged_in, uncertain_case


def test_a_viewer_refused_a_verdict_is_told_the_role_it_needs_and_whom_to_ask(
    project, viewer, admin
):
    admin.email = "ada@example.com"
    admin.save()
    case = uncertain_case(project, "refund-1")

    r = logged_in(viewer).post(
        f"/cases/{case.pk}/resolve/", {"verdict": "not_happened", "version": 1, "note": "x"}
    )

    assert r.status_code == 403
    html = r.content.decode()
    assert '<header class="top">' in html, "in the desk's layout"
    assert re.search(r"<strong data-needed>operator</strong>", html)
    assert "yours is <strong>viewer</strong>" in html
    assert re.search(r"<ul data-admins><li>ada · <a href=\"mailto:ada@example.com\">", html)


def test_a_page_only_admins_see_names_the_admin_role(project, alice, admin):
    r = logged_in(alice).get("/settings/")

    assert r.status_code == 403
    assert "<strong data-needed>admin</strong>" in r.content.decode()


def test_another_refusal_is_a_page_in_the_layout_too(project, alice, admin):
    from durability.desk import saved_views
    from durability.models import Role
    from tests.desk.support import member

    someone = member(project, "sam", Role.OPERATOR)
    view = saved_views.view_save(
        access=_access(project, someone), owner=someone, name="mine", query=_query(), shared=True
    )

    r = logged_in(alice).post(f"/queue/views/{view.pk}/delete/")

    assert r.status_code == 403
    html = r.content.decode()
    assert '<header class="top">' in html and "Only its owner or a project admin" in html


def _access(project, user):
    from durability.accounts.roles import access_of

    return access_of(user, project.pk)


def _query():
    from durability.desk.queue import QueueQuery

    return QueueQuery.from_params({"reason": "uncertain"})
