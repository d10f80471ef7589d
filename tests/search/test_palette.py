"""The command palette's list, the search page's fragment: pages and saved views by name,
a case, effect or approval by id, and the search's best rows (an effect by key, a run)."""

from __future__ import annotations

import re

from durability.accounts.roles import access_of
from durability.desk import saved_views
from durability.desk.queue import QueueQuery
from tests.desk.support import logged_in, uncertain_case
from tests.search.support import run


def _palette(client, q: str) -> list[str]:
    r = client.get("/search/", {"q": q, "palette": "1"}, headers={"HX-Request": "true"})
    assert r.status_code == 200
    html = r.content.decode()
    assert "<html" not in html, "a fragment, not the page"
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", item)).strip()
        for item in re.findall(r'<a href="[^"]*" role="option">(.*?)</a>', html, re.S)
    ]


def test_nothing_typed_lists_the_pages_and_saved_views(alice, project):
    saved_views.view_save(
        access=access_of(alice, project.pk),
        owner=alice,
        name="Stripe refunds",
        query=QueueQuery.from_params({"target": "stripe"}),
        shared=False,
    )

    listed = _palette(logged_in(alice), "")

    assert "Queue page" in listed and "Approvals page" in listed and "Overview page" in listed
    assert "Stripe refunds view" in listed
    assert "Settings page" not in listed, "an operator has no settings page"


def test_a_number_finds_the_case_and_effect_of_that_id(alice, project):
    case = uncertain_case(project, "refund:1")

    listed = _palette(logged_in(alice), f"#{case.pk}")

    assert f"Case #{case.pk} uncertain case by id" in listed


def test_a_key_and_a_run_id_are_found_by_the_search(alice, project):
    uncertain_case(project, "refund:H-112", run_id="ticket-88")
    run(project, "ticket-88", "b" * 32)
    client = logged_in(alice)

    assert any(item.startswith("refund:H-112 effect") for item in _palette(client, "H-112"))
    listed = _palette(client, "ticket-88")
    assert any(item.startswith("Run ticket-88 run") for item in listed)
    assert any(item.startswith("refund:H-112 effect · run id") for item in listed)
    assert listed[-1] == "Search for “ticket-88” all results"


def test_without_htmx_the_palettes_form_is_the_search_page(alice, project):
    r = logged_in(alice).get("/search/", {"q": "refund", "palette": "1"})

    assert r.status_code == 200 and "<h1>Search" in r.content.decode()
