"""The operator pages: a login for every one, and only the user's own projects."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.desk.views import EFFECTS_PAGE_SIZE as PAGE_SIZE
from durability.models import Case, Effect, Reason, State
from tests.desk.support import operator_pages
from tests.ledger.support import effect_in, intent, receipt, timeout

PAGES = operator_pages()


def test_the_pages_include_the_ledgers():
    assert {"/", "/effects/", "/effects/1/"} <= set(PAGES)


@pytest.mark.parametrize("url", PAGES)
def test_every_page_sends_an_anonymous_visitor_to_the_login(client, db, url):
    r = client.get(url)
    if r.status_code == 405:  # a form's target: the POST must ask for a login too
        r = client.post(url)
    assert r.status_code == 302, url
    assert r["Location"].startswith("/login/?next=")


def test_a_member_sees_their_projects_effects(client, alice, project):
    intent(project, "refund:1")
    effect_in(project, State.TIMED_OUT, key="refund:2")
    client.force_login(alice)
    r = client.get("/effects/")
    assert r.status_code == 200
    assert b"refund:1" in r.content and b"refund:2" in r.content


def test_a_member_sees_an_effects_attempts_receipts_and_cases(client, alice, project):
    effect = intent(project, "refund:1", run_id="run-7", worker="w1").effect
    timeout(project, "refund:1")
    receipt(project, "refund:1", "re_late")
    client.force_login(alice)
    r = client.get(f"/effects/{effect.pk}/")
    assert r.status_code == 200
    page = r.content.decode()
    for text in ("refund:1", "succeeded", "late", "run-7", "w1", "re_late", "late_success"):
        assert text in page, text
    assert "Closed: settled by the evidence that arrived" in page and "auto_resolved" not in page


def test_an_effects_page_names_its_grant_or_says_it_had_none(client, alice, project):
    granted = intent(project, "refund:1").effect
    ungranted = intent(project, "email:1", authority=None).effect
    client.force_login(alice)
    page = client.get(f"/effects/{granted.pk}/").content.decode()
    assert f"grant {granted.grant_id} v1" in page
    page = client.get(f"/effects/{ungranted.pk}/").content.decode()
    assert "no grant (audit policy)" in page and "No cases." in page


def test_the_state_filter_shows_only_that_state(client, alice, project):
    effect_in(project, State.PENDING, key="still-pending")
    effect_in(project, State.SUCCEEDED, key="all-done")
    client.force_login(alice)
    page = client.get("/effects/", {"state": "succeeded"}).content
    assert b"all-done" in page and b"still-pending" not in page


def test_a_stranger_gets_a_404_for_someone_elses_effect(client, mallory, project):
    effect = intent(project, "secret-refund").effect
    client.force_login(mallory)
    assert client.get(f"/effects/{effect.pk}/").status_code == 404


def test_a_stranger_sees_no_rows(client, mallory, project):
    intent(project, "secret-refund")
    client.force_login(mallory)
    r = client.get("/effects/")
    assert r.status_code == 200
    assert b"secret-refund" not in r.content
    # In no project: the landing page, as on every list page.
    assert b"not a member of any project" in r.content and "effects" not in r.context


def test_a_member_of_another_project_sees_none_of_these_effects(client, outsider, project):
    intent(project, "secret-refund")
    client.force_login(outsider)
    r = client.get("/effects/")
    assert r.status_code == 200 and r.context["effects"] == []


def test_older_effects_come_a_page_at_a_time_and_as_a_fragment_for_htmx(client, alice, project):
    Effect.objects.bulk_create(
        Effect(project=project, key=f"k{i:03}", kind="payment", target="stripe", fingerprint="f")
        for i in range(PAGE_SIZE + 5)
    )
    client.force_login(alice)
    first = client.get("/effects/")
    assert len(first.context["effects"]) == PAGE_SIZE
    before = first.context["next_before"]
    assert f"before={before}".encode() in first.content
    rest = client.get("/effects/", {"before": before}, headers={"HX-Request": "true"})
    assert len(rest.context["effects"]) == 5
    assert rest.context["next_before"] is None
    assert b"<html" not in rest.content and b"k000" in rest.content


def test_the_effects_page_runs_the_same_queries_for_few_effects_or_many(client, alice, project):
    client.force_login(alice)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/effects/").status_code == 200
        return len(captured)

    for i in range(3):
        effect_in(project, State.SUCCEEDED, key=f"few-{i}")
    few = queries()
    for i in range(30):
        effect_in(project, State.SUCCEEDED, key=f"many-{i}")
    assert queries() == few


def test_an_effects_page_runs_the_same_queries_however_long_its_history(client, alice, project):
    client.force_login(alice)
    short = effect_in(project, State.SUCCEEDED, key="short")
    long = effect_in(project, State.FAILED, key="long", replay="safe")
    for _ in range(5):
        intent(project, "long", replay="safe")
        timeout(project, "long")
    receipt(project, "long", "re_late")

    def queries(effect: Effect) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/effects/{effect.pk}/").status_code == 200
        return len(captured)

    assert queries(long) == queries(short)


def test_the_state_tabs_keep_every_other_filter(client, alice, project):
    effect_in(project, State.FAILED, key="payments-failed")
    client.force_login(alice)
    since = "2026-01-01T00:00:00+00:00"
    page = client.get("/effects/", {"target": "payments", "since": since}).content.decode()
    nav = page[page.index('aria-label="Filter by state"') :]
    nav = nav[: nav.index("</nav>")]
    tabs = {
        name: href.replace("&amp;", "&")
        for href, name in re.findall(r'<a href="([^"]*)"[^>]*>(\w+)</a>', nav)
    }
    assert (
        tabs["failed"]
        == "/effects/?state=failed&target=payments&since=2026-01-01T00%3A00%3A00%2B00%3A00"
    )
    assert tabs["all"] == "/effects/?target=payments&since=2026-01-01T00%3A00%3A00%2B00%3A00"


def _json_blocks(page: str) -> list[Any]:
    return [
        json.loads(unescape(t)) for t in re.findall(r'<pre class="json">(.*?)</pre>', page, re.S)
    ]


def test_the_effect_page_shows_request_authority_and_context_as_json(client, alice, project):
    request = {"environment": "production", "dry_run": False, "amount": None}
    effect = intent(project, "deploy:1", request=request, context={"agent": "deployer"}).effect
    client.force_login(alice)
    page = client.get(f"/effects/{effect.pk}/").content.decode()
    blocks = _json_blocks(page)
    assert request in blocks and {"agent": "deployer"} in blocks
    assert {"grant": effect.authority["grant"]} in blocks
    assert "&#x27;environment&#x27;" not in page


def test_the_case_page_shows_request_and_context_as_json(client, alice, project):
    request = {"environment": "production", "dry_run": False}
    intent(project, "deploy:1", request=request, context={"agent": "deployer"})
    timeout(project, "deploy:1")
    case = Case.objects.get(effect__key="deploy:1", reason=Reason.UNCERTAIN)
    client.force_login(alice)
    page = client.get(f"/cases/{case.pk}/").content.decode()
    blocks = _json_blocks(page)
    assert request in blocks and {"agent": "deployer"} in blocks
    assert "&#x27;environment&#x27;" not in page
