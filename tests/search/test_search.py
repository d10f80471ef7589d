"""The search page finds effects, cases and runs by what an operator has at hand, ranked, in
the current project only; bad input gets a message, never an error page."""

from __future__ import annotations

import pytest

from durability.models import Effect, Project
from tests.desk.support import logged_in, uncertain_case
from tests.ledger.support import intent, receipt
from tests.search.support import found, run


@pytest.fixture
def client(alice):
    return logged_in(alice)


def test_it_finds_an_effect_by_its_whole_key(client, project):
    intent(project, "refund:1042")
    assert found(client, "refund:1042")["effects"] == ["refund:1042"]


def test_it_finds_an_effect_by_part_of_its_key(client, project):
    intent(project, "refund:1042")
    intent(project, "email:welcome")
    assert found(client, "1042")["effects"] == ["refund:1042"]


def test_it_finds_an_effect_by_its_receipts_external_id(client, project):
    intent(project, "refund:1042")
    receipt(project, "refund:1042", "re_3PqXy")
    assert found(client, "re_3PqXy")["effects"] == ["refund:1042"]
    assert found(client, "3PqX")["effects"] == ["refund:1042"]


def test_it_finds_effects_by_target_and_by_agent(client, project):
    intent(project, "deploy:api", kind="deploy", target="k8s-prod")
    intent(project, "mail:1", target="smtp", context={"agent": "support-bot"})
    assert found(client, "k8s-prod")["effects"] == ["deploy:api"]
    assert found(client, "support-bot")["effects"] == ["mail:1"]


def test_it_finds_an_effect_by_any_text_of_its_request(client, project):
    intent(project, "refund:1", request={"order": 42, "customer": "Ana.Lopez@example.com"})
    intent(project, "refund:2", request={"order": 43, "customer": "bo@example.com"})
    assert found(client, "ana.lopez")["effects"] == ["refund:1"]


def test_it_searches_the_stored_request_whose_secrets_were_redacted(client, project):
    intent(project, "charge:1", request={"amount": 5, "api_key": "sk_live_51Hqsecretvalue"})
    assert "sk_live_51Hqsecretvalue" not in str(Effect.objects.get(key="charge:1").request)
    assert found(client, "sk_live_51Hqsecret")["effects"] == []


def test_a_whole_key_ranks_before_keys_and_requests_that_contain_it(client, project):
    intent(project, "refund:7", request={"note": "after refund:7 failed"})
    intent(project, "refund:70")
    intent(project, "refund:700")
    intent(project, "audit:1", request={"about": "refund:7"})
    effects = found(client, "refund:7")["effects"]
    assert effects[0] == "refund:7"
    # Keys that contain the text (newest first), then the request that mentions it.
    assert effects[1:] == ["refund:700", "refund:70", "audit:1"]


def test_an_external_id_ranks_before_a_request_that_mentions_it(client, project):
    intent(project, "refund:1", request={"reply_to": "msg-77aa"})
    intent(project, "mail:1")
    receipt(project, "mail:1", "msg-77aa")
    assert found(client, "msg-77aa")["effects"] == ["mail:1", "refund:1"]


def test_it_finds_cases_through_their_effects(client, project):
    case = uncertain_case(project, "refund:1042", request={"order": 1042, "customer": "ana"})
    uncertain_case(project, "refund:9")
    cases = found(client, "refund:1042")["cases"]
    assert cases == [f"#{case.pk} uncertain"]
    assert found(client, "customer")["cases"] == [f"#{case.pk} uncertain"]


def test_it_finds_cases_by_their_reason_open_ones_newest_first(client, project):
    older = uncertain_case(project, "refund:1")
    newer = uncertain_case(project, "refund:2")
    intent(project, "other")
    for q in ("uncertain", "Uncertain"):
        assert found(client, q)["cases"] == [f"#{newer.pk} uncertain", f"#{older.pk} uncertain"]


def test_the_reason_leads_to_the_queue_filtered_by_it(client, project):
    uncertain_case(project, "refund:1")
    html = client.get("/search/", {"q": "uncertain"}).content.decode()
    assert 'href="/queue/?reason=uncertain"' in html


def test_it_finds_runs_by_run_id_trace_id_and_agent(client, project):
    run(project, "ticket-5521", "4bf92f3577b34da6a3ce929d0e0e4736", agent="refund-bot")
    run(project, "ticket-9", "00000000000000000000000000000009", agent="release-bot")
    assert found(client, "ticket-5521")["runs"] == ["ticket-5521"]
    assert found(client, "5521")["runs"] == ["ticket-5521"]
    assert found(client, "4bf92f3577b34da6a3ce929d0e0e4736")["runs"] == ["ticket-5521"]
    assert found(client, "4bf92f35")["runs"] == ["ticket-5521"]
    assert found(client, "refund-bot")["runs"] == ["ticket-5521"]


def test_a_whole_run_id_ranks_before_run_ids_that_contain_it(client, project):
    run(project, "run-1")
    run(project, "run-10")
    run(project, "run-100", agent="run-1-agent")
    assert found(client, "run-1")["runs"] == ["run-1", "run-100", "run-10"]


def test_each_result_links_to_its_page(client, project):
    case = uncertain_case(project, "refund:1042")
    made = run(project, "refund:1042-run")
    html = client.get("/search/", {"q": "refund:1042"}).content.decode()
    assert f'href="{case.effect.get_absolute_url()}"' in html
    assert f'href="{case.get_absolute_url()}"' in html
    assert f'href="{made.get_absolute_url()}"' in html


def test_it_shows_only_the_current_projects_rows(client, project, outsider):
    theirs = Project.objects.get(name="gamma")
    intent(theirs, "refund:1042")
    uncertain_case(theirs, "refund:1043")
    run(theirs, "refund:1042-run")
    intent(project, "refund:1044")
    groups = found(client, "refund:104")
    assert groups == {"effects": ["refund:1044"], "cases": [], "approvals": [], "runs": []}
    # The other project's admin finds theirs, and not ours.
    assert found(logged_in(outsider), "refund:104")["effects"] == ["refund:1043", "refund:1042"]


def test_a_stranger_to_every_project_gets_the_landing_page(mallory, project):
    intent(project, "refund:1")
    r = logged_in(mallory).get("/search/", {"q": "refund"})
    assert b"refund:1" not in r.content


def test_short_text_finds_whole_values_only(client, project):
    intent(project, "ab")
    intent(project, "abc")
    r = client.get("/search/", {"q": "ab"})
    assert found(client, "ab")["effects"] == ["ab"]
    assert b"fewer than 3 characters" in r.content


def test_empty_text_is_refused_with_a_message(client, project):
    for q in ("", "   "):
        r = client.get("/search/", {"q": q})
        assert r.status_code == 400
        assert b"Type what to look for" in r.content


def test_too_long_text_is_refused_with_a_message(client, project):
    r = client.get("/search/", {"q": "x" * 201})
    assert r.status_code == 400
    assert b"at most 200 characters (201 were given)" in r.content


def test_text_with_a_nul_or_like_wildcards_is_handled(client, project):
    intent(project, "late_success:1")
    intent(project, "latexsuccess")
    assert client.get("/search/", {"q": "a\x00b"}).status_code == 400
    assert found(client, "e_s")["effects"] == ["late_success:1"]
    assert found(client, "100%")["effects"] == []


def test_an_unknown_kind_is_refused_with_a_message(client, project):
    r = client.get("/search/", {"q": "refund", "kind": "grants"})
    assert r.status_code == 400
    assert b"Search one of effects, cases, approvals, runs" in r.content


def test_the_page_without_text_shows_the_box(client, project):
    r = client.get("/search/")
    assert r.status_code == 200
    assert b'name="q"' in r.content


def test_more_leads_to_a_kinds_longer_list(client, project):
    for n in range(12):
        intent(project, f"refund:{n}")
    html = client.get("/search/", {"q": "refund"}).content.decode()
    assert 'href="?q=refund&amp;kind=effects"' in html
    longer = found(client, "refund", kind="effects")
    assert list(longer) == ["effects"]
    assert len(longer["effects"]) == 12


def test_the_header_has_the_search_box_on_every_page(client, project):
    html = client.get("/queue/").content.decode()
    assert 'action="/search/"' in html and "data-search" in html
