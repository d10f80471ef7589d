"""Counts stay true after a bulk action: its finished progress brings the queue's heading,
tab title, reason tabs and rows as they are now; the bulk scope is the ticked rows unless
"all N matching" is chosen."""

from __future__ import annotations

import re

import pytest

from tests.desk.support import late_success_case, logged_in, uncertain_case


@pytest.fixture
def desk(alice):
    return logged_in(alice)


@pytest.fixture
def piled(project):
    """Two late successes of one group, and an uncertain case."""
    return {
        "late": [late_success_case(project, f"refund:{n}") for n in range(2)],
        "uncertain": uncertain_case(project, "deploy:1", kind="deploy", target="k8s"),
    }


def _oob(html: str, element_id: str) -> str:
    found = re.search(
        rf'<(\w+) id="{element_id}"[^>]*hx-swap-oob="true"[^>]*>(.*?)</\1>', html, re.S
    )
    assert found, f"{element_id} is not swapped out of band"
    return re.sub(r"\s+", " ", found.group(2))


def test_a_group_acknowledged_in_bulk_leaves_the_grouped_queue_and_the_counts_follow(desk, piled):
    group = piled["late"][0].group_key
    page = desk.get("/queue/?grouped=1").content.decode()
    assert "<title>Queue (3) · Tallybook</title>" in page
    assert "3 open cases in 2 groups" in page

    r = desk.post(
        "/queue/bulk/",
        {
            "verb": "acknowledge",
            "scope": "selected",
            "case_group": [group],
            "note": "refunds checked",
            "grouped": "1",
        },
    )

    html = r.content.decode()
    assert "Done: acknowledge on 2 cases" in re.sub(r"\s+", " ", html)
    assert "<title>Queue (1) · Tallybook</title>" in html
    assert "1 open case in 1 group" in _oob(html, "queue-heading")
    tabs = _oob(html, "reason-counts")
    assert "late_success" not in tabs and 'all <span class="count">1</span>' in tabs
    rows = _oob(html, "queue-list")
    assert f'id="group-{group}"' not in rows
    assert f'id="group-{piled["uncertain"].group_key}"' in rows
    assert "all 1 matching" in _oob(html, "bulk-matching")


def test_the_progress_of_an_unfinished_action_sends_no_queue(desk, project, piled):
    from durability.desk import case_actions
    from durability.models import BulkVerb

    bulk = case_actions.bulk_start(
        project=project,
        actor="user:alice",
        verb=BulkVerb.ACKNOWLEDGE,
        case_ids=[c.pk for c in piled["late"]],
        note="x",
    )

    html = desk.get(f"/queue/bulk/{bulk.pk}/").content.decode()

    assert "hx-swap-oob" not in html and "<title>" not in html


def test_the_bulk_scope_is_the_ticked_rows_unless_all_matching_is_chosen(desk, piled):
    html = desk.get("/queue/").content.decode()

    assert re.search(r'<input type="radio" name="scope" value="selected" checked>', html)
    assert re.search(r'<input type="radio" name="scope" value="matching">', html)
    r = desk.get("/queue/bulk/preview/", {"verb": "acknowledge", "scope": "selected", "note": "x"})
    assert "Select at least one case or group, or act on all matching." in r.content.decode()
