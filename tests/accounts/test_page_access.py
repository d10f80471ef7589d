"""Who gets which answer from every page: one rule, from the one access helper.

A user in no project gets the landing page that says so; an object of a project the user
is not in is not found (404); a member whose role lacks the permission is refused (403).
"""

from __future__ import annotations

import re
from functools import cached_property

import pytest
from django.utils import timezone

from durability.authority import webhook_sources
from durability.models import (
    ApiKey,
    Approval,
    BulkAction,
    BulkVerb,
    Membership,
    Project,
    Role,
    SavedView,
    WebhookKind,
)
from tests.authority.support import ADMIN, grant, under
from tests.desk.support import logged_in, member, operator_pages, uncertain_case
from tests.ledger import support as ledger
from trajectories.models import Run, Span

LANDING = b"not a member of any project"


class World:
    """One of each object a page shows, in project alpha, made when a page first asks."""

    def __init__(self, project: Project) -> None:
        self.project = project

    @cached_property
    def case(self):
        return uncertain_case(self.project)

    @cached_property
    def effect(self):
        return self.case.effect

    @cached_property
    def grant(self):
        return grant(self.project, name="refunds", requires_approval=True)

    @cached_property
    def approval(self):
        ledger.intent(self.project, "refund:asked", **under(self.grant, "10"))
        return Approval.objects.get(effect__key="refund:asked")

    @cached_property
    def source(self):
        return webhook_sources.webhook_source_create(
            project=self.project,
            actor=ADMIN,
            name="stripe-hooks",
            kind=WebhookKind.GENERIC,
            system="stripe",
            mapping={},
            tolerance_s=300,
        )

    @cached_property
    def bulk(self):
        return BulkAction.objects.create(
            project=self.project, actor=ADMIN, verb=BulkVerb.ASSIGN, total=0
        )

    @cached_property
    def membership(self):
        return Membership.objects.get(user=member(self.project, "tom", Role.VIEWER))

    @cached_property
    def key(self):
        return ApiKey.issue(self.project, name="agents")[0]

    @cached_property
    def shared_view(self):
        # Another admin's, shared: its owner or an admin may delete it.
        owner = member(self.project, "sam", Role.ADMIN)
        return SavedView.objects.create(
            project=self.project, owner=owner, name="refunds", query="kind=payment", shared=True
        )

    @cached_property
    def run(self):
        return Run.objects.create(project=self.project, run_id="run-1")

    @cached_property
    def span(self):
        made = Span.objects.create(
            project=self.project,
            run=self.run,
            trace_id="a" * 32,
            span_id="b" * 16,
            name="invoke_agent",
            start=timezone.now(),
        )
        # As ingest keeps them: the run's days are where its page looks for its spans.
        Run.objects.filter(pk=self.run.pk).update(first_day=made.day, last_day=made.day)
        self.run.first_day = self.run.last_day = made.day
        return made


# (method, path, what it is, the role it needs, what an allowed user gets).
# A "list" page shows the user's current project; an "object" page names an object.
PAGES = [
    ("get", "/", "list", "viewer", 200),
    ("get", "/queue/", "list", "viewer", 200),
    ("get", "/queue/pulse/", "pulse", "viewer", 200),
    ("get", "/queue/bulk/preview/", "list", "viewer", 200),
    ("post", "/queue/bulk/", "list", "viewer", 400),
    ("get", "/queue/bulk/{w.bulk.pk}/", "object", "viewer", 200),
    ("post", "/queue/views/", "list", "viewer", 400),
    ("post", "/queue/views/{w.shared_view.pk}/delete/", "object", "admin", 302),
    ("get", "/audit/", "list", "viewer", 200),
    ("get", "/effects/", "list", "viewer", 200),
    ("get", "/effects/{w.effect.pk}/", "object", "viewer", 200),
    ("get", "/effects/{w.effect.pk}/probes/", "object", "viewer", 200),
    ("post", "/effects/{w.effect.pk}/probe/", "object", "operator", 302),
    ("get", "/cases/{w.case.pk}/", "object", "viewer", 200),
    ("get", "/cases/{w.case.pk}/next/", "object", "viewer", 302),
    ("post", "/cases/{w.case.pk}/resolve/", "object", "operator", 400),
    ("post", "/cases/{w.case.pk}/assign/", "object", "operator", 303),
    ("post", "/cases/{w.case.pk}/comment/", "object", "operator", 400),
    ("post", "/cases/{w.case.pk}/snooze/", "object", "operator", 400),
    ("get", "/runs/", "list", "viewer", 200),
    ("get", "/runs/{w.run.pk}/", "object", "viewer", 200),
    ("get", "/runs/{w.run.pk}/spans/{w.span.pk}/", "object", "viewer", 200),
    ("get", "/authority/", "list", "viewer", 200),
    ("get", "/authority/grants/new/", "list", "admin", 200),
    ("post", "/authority/grants/new/", "list", "admin", 400),
    ("get", "/authority/grants/{w.grant.pk}/", "object", "viewer", 200),
    ("post", "/authority/grants/{w.grant.pk}/supersede/", "object", "admin", 400),
    ("post", "/authority/grants/{w.grant.pk}/revoke/", "object", "admin", 400),
    ("get", "/authority/webhooks/", "list", "admin", 200),
    ("post", "/authority/webhooks/{w.source.pk}/toggle/", "object", "admin", 302),
    ("get", "/authority/audit/", "list", "viewer", 200),
    ("get", "/authority/audit.csv", "list", "viewer", 200),
    ("get", "/approvals/", "list", "viewer", 200),
    ("get", "/approvals/{w.approval.pk}/", "object", "viewer", 200),
    ("post", "/approvals/{w.approval.pk}/sign/", "object", "operator", 400),
    ("get", "/search/", "list", "viewer", 200),
    ("get", "/settings/", "list", "admin", 200),
    ("post", "/settings/time-zone/", "list", "viewer", 302),
    ("post", "/settings/{w.project.pk}/members/{w.membership.pk}/role/", "object", "admin", 400),
    ("post", "/settings/{w.project.pk}/members/{w.membership.pk}/remove/", "object", "admin", 302),
    ("post", "/settings/{w.project.pk}/members/{w.membership.pk}/unlock/", "object", "admin", 302),
    ("post", "/settings/{w.project.pk}/keys/{w.key.pk}/revoke/", "object", "admin", 302),
    ("post", "/settings/{w.project.pk}/redaction/", "object", "admin", 302),
    ("post", "/settings/{w.project.pk}/retention/", "object", "admin", 400),
    ("post", "/settings/{w.project.pk}/members/", "object", "admin", 400),
    ("post", "/settings/{w.project.pk}/keys/", "object", "admin", 400),
    ("post", "/settings/{w.project.pk}/policy/", "object", "admin", 400),
    ("get", "/settings/notifications/", "list", "viewer", 200),
    ("post", "/settings/{w.project.pk}/notifications/", "object", "viewer", 302),
]
# Pages the matrix leaves to a test of their own, and why.
NOT_IN_MATRIX = {
    # Its project comes from the form, not the URL: tests/desk/test_permissions.py.
    "/projects/switch/": "the project is the form's",
    # An invitation is its invited user's, whatever their role: tests/accounts/test_invitations.py.
    "/invitations/1/1/": "the invited user's, by the emailed link",
}


def test_the_matrix_names_every_page_the_urls_route_to():
    # A new page cannot be added without saying which role it needs.
    in_matrix = {re.sub(r"\{[^}]*\}", "1", path) for _, path, *_ in PAGES}
    assert set(operator_pages()) - set(NOT_IN_MATRIX) == in_matrix


RANK = {"viewer": 0, "operator": 1, "admin": 2}
# Each persona's role in alpha; `outsider` is an admin of gamma, `mallory` of nothing.
PERSONAS = {"viewer": "viewer", "alice": "operator", "admin": "admin"}


def expected(persona: str, kind: str, needs: str, allowed: int) -> int:
    if persona == "mallory":
        return {"list": 200, "pulse": 204, "object": 404}[kind]
    if persona == "outsider":
        # Their current project is their own gamma, where they are admin.
        return allowed if kind != "object" else 404
    return allowed if RANK[PERSONAS[persona]] >= RANK[needs] else 403


@pytest.mark.parametrize("persona", ["mallory", "outsider", "viewer", "alice", "admin"])
@pytest.mark.parametrize(("method", "path", "kind", "needs", "allowed"), PAGES)
def test_every_page_answers_each_persona_by_the_one_rule(
    request, project, persona, method, path, kind, needs, allowed
):
    url = path.format(w=World(project))
    client = logged_in(request.getfixturevalue(persona))
    r = getattr(client, method)(url)
    assert r.status_code == expected(persona, kind, needs, allowed), url
    landing = persona == "mallory" and kind == "list"
    assert (LANDING in (b"" if r.streaming else r.content)) == landing


@pytest.mark.parametrize(("method", "path", "kind", "needs", "allowed"), PAGES)
def test_every_page_needs_a_login(client, project, method, path, kind, needs, allowed):
    r = getattr(client, method)(path.format(w=World(project)))
    assert r.status_code == 302 and r["Location"].startswith("/login/")


@pytest.mark.parametrize(
    "path",
    [
        "/runs/{w.run.pk}/",
        "/authority/grants/{w.grant.pk}/",
        "/approvals/{w.approval.pk}/",
    ],
)
def test_objects_of_the_projects_pages_are_found_in_the_current_project_only(project, alice, path):
    # As the project switcher means it: these pages show the project the user works in.
    url = path.format(w=World(project))
    client = logged_in(alice)
    assert client.get(url).status_code == 200
    beta = Project.objects.create(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.OPERATOR)
    client.post("/projects/switch/", {"project": beta.pk})
    assert client.get(url).status_code == 404


@pytest.mark.parametrize("path", ["/cases/{w.case.pk}/", "/effects/{w.effect.pk}/"])
def test_cases_and_effects_are_found_in_any_of_the_users_projects(project, alice, path):
    # Links to them leave the queue and the effects list of every project (and alerts).
    url = path.format(w=World(project))
    client = logged_in(alice)
    beta = Project.objects.create(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.OPERATOR)
    client.post("/projects/switch/", {"project": beta.pk})
    assert client.get(url).status_code == 200
