"""The effect page: the case page's story, why the effect failed, and links to its run,
agent, workflow, grant and cases."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.urls import reverse

from durability.desk import case_actions
from durability.models import Case, Effect, Reason
from tests.desk.support import logged_in, search, uncertain_case
from tests.ledger.support import failure, intent, receipt, timeout


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _moments(page: str) -> list[str]:
    return re.findall(r'id="(moment-\d+)"', page)


def test_the_effect_page_tells_the_same_story_as_its_case(project, desk):
    case = uncertain_case(project, "refund:1", run_id="run-7")
    case_actions.case_comment(project=project, case_id=case.pk, actor="user:alice", body="looking")
    case_page = desk.get(f"/cases/{case.pk}/").content.decode()
    effect_page = desk.get(f"/effects/{case.effect_id}/").content.decode()
    assert _moments(effect_page) == _moments(case_page)
    assert len(_moments(effect_page)) >= 4  # intent, timeout, case opened, comment
    assert "looking" in effect_page and "no answer in 30s" in effect_page


def test_the_effect_page_says_why_it_failed(project, desk):
    effect = intent(project, "refund:1", replay="safe").effect
    failure(project, "refund:1", definitive=True)
    page = unescape(desk.get(f"/effects/{effect.pk}/").content.decode())
    line = search(r'<p class="failure" data-failure>(.*?)</p>', page)[1]
    assert "Failed: nothing happened" in line and "HTTP 502" in line
    # The latest failure is the one said: a later timeout.
    intent(project, "refund:1", replay="safe")
    timeout(project, "refund:1")
    page = unescape(desk.get(f"/effects/{effect.pk}/").content.decode())
    line = search(r'<p class="failure" data-failure>(.*?)</p>', page)[1]
    assert "Timed out" in line and "no answer in 30s" in line


def test_an_effect_that_never_failed_says_no_failure(project, desk):
    effect = intent(project, "refund:1").effect
    receipt(project, "refund:1", "re_1")
    assert "data-failure" not in desk.get(f"/effects/{effect.pk}/").content.decode()


def test_the_effect_page_links_its_run_agent_workflow_grant_and_cases(project, desk):
    context = {"agent": "refund-bot", "workflow": "refunds"}
    case = uncertain_case(project, "refund:1", run_id="run 7", context=context)
    effect = Effect.objects.get(pk=case.effect_id)
    intent(project, "refund:1", request={"amount": 2})  # a second case: key reuse
    page = desk.get(f"/effects/{effect.pk}/").content.decode()
    run = search(r"<dd data-run>(.*?)</dd>", page)[1]
    assert '<a href="/effects/?run=run%207">its effects</a>' in run
    assert 'href="/effects/?agent=refund-bot"' in page
    assert 'href="/effects/?workflow=refunds"' in page
    grant = search(r"<dd data-grant>(.*?)</dd>", page)[1]
    assert f'href="{reverse("grant", args=[effect.grant_id])}"' in grant
    cases = search(r"<ul class=\"cases\" data-cases>(.*?)</ul>", page.replace("\n", ""))[1]
    for each in Case.objects.filter(effect=effect):
        assert f'<a href="/cases/{each.pk}/">' in cases
    assert {c.reason for c in Case.objects.filter(effect=effect)} == {
        Reason.UNCERTAIN,
        Reason.KEY_REUSE_CONFLICT,
    }


def test_the_effect_page_shows_request_data_as_json(project, desk):
    effect = intent(project, "deploy:1", request={"environment": "production"}).effect
    page = unescape(desk.get(f"/effects/{effect.pk}/").content.decode())
    assert '"environment": "production"' in page and "{'environment'" not in page
