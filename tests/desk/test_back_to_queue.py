"""The way back from a case to the queue it was opened from: the queue's filter travels with
the links to the case (`?from=`), through its actions, and back, to the queue and nowhere else."""

from __future__ import annotations

import html
import re

import pytest

from tests.desk.support import logged_in, search, uncertain_case

FILTER = "reason=uncertain&target=stripe&sort=severity"
FROM = "?from=reason%3Duncertain%26target%3Dstripe%26sort%3Dseverity"


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _back(page: str) -> str:
    return html.unescape(search(r'<a href="([^"]*)" data-back>← Queue</a>', page).group(1))


def test_the_queue_links_each_case_with_its_filter(project, desk):
    case = uncertain_case(project)
    page = desk.get(f"/queue/?{FILTER}&after=1.2").content.decode()
    row = search(rf'<tr id="case-{case.pk}".*?</tr>', page.replace("\n", " ")).group(0)
    url = f"/cases/{case.pk}/{FROM}"
    assert f'data-url="{url}"' in row and f'<a class="open" href="{url}">' in row
    assert f'action="/cases/{case.pk}/assign/{FROM}"' in row
    # The row an assignment from the queue answers with links the same way.
    taken = desk.post(
        f"/cases/{case.pk}/assign/{FROM}",
        {"version": case.version, "assignee": "me"},
        headers={"HX-Request": "true"},
    )
    assert f'<a class="open" href="{url}">' in taken.content.decode()


def test_a_case_leads_back_to_the_filtered_queue_through_its_actions(project, desk):
    case = uncertain_case(project)
    page = desk.get(f"/cases/{case.pk}/{FROM}").content.decode()
    assert _back(page) == f"/queue/?{FILTER}"
    for action in ("resolve", "assign", "comment"):
        assert f'action="/cases/{case.pk}/{action}/{FROM}"' in page
    r = desk.post(f"/cases/{case.pk}/comment/{FROM}", {"body": "looking"})
    assert r["Location"] == f"/cases/{case.pk}/{FROM}#comment"
    r = desk.post(f"/cases/{case.pk}/assign/{FROM}", {"version": case.version, "assignee": "me"})
    assert r["Location"] == f"/cases/{case.pk}/{FROM}"
    case.refresh_from_db()
    r = desk.post(
        f"/cases/{case.pk}/resolve/{FROM}",
        {"verdict": "not_happened", "version": case.version, "note": "not in Stripe"},
    )
    assert r["Location"] == f"/cases/{case.pk}/{FROM}"
    assert _back(desk.get(r["Location"]).content.decode()) == f"/queue/?{FILTER}"


@pytest.mark.parametrize(
    ("came_from", "back"),
    [
        ("", "/queue/"),
        ("https://evil.example/", "/queue/"),
        ("//evil.example/queue/", "/queue/"),
        ("/admin/?reason=uncertain", "/queue/"),
        ("reason=bogus&target=k8s&next=https://evil.example/", "/queue/?target=k8s"),
        ("target=a%26b%3Dc", "/queue/?target=a%26b%3Dc"),
    ],
)
def test_the_way_back_leads_to_the_queue_and_nowhere_else(project, desk, came_from, back):
    case = uncertain_case(project)
    page = desk.get(f"/cases/{case.pk}/", {"from": came_from}).content.decode()
    assert _back(page) == back
    assert not re.search(r'(href|action)="[^"]*evil', page)
