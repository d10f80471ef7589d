"""The effects list's filters (kind, target, agent, workflow, run) in the page, how they
combine and survive the state tabs, and its open-cases column."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.models import State
from tests.desk.support import logged_in, search
from tests.ledger.support import effect_in, intent, receipt, timeout


@pytest.fixture
def desk(alice):
    return logged_in(alice)


@pytest.fixture
def mixed(project):
    """Effects that differ in one field each from `refund`."""
    refund = {"context": {"agent": "refund-bot", "workflow": "refunds"}, "run_id": "run-1"}
    intent(project, "refund", kind="payment", target="stripe", **refund)
    intent(project, "email", kind="email", target="smtp", **refund)
    intent(project, "other-target", kind="payment", target="adyen", **refund)
    other_agent = {"context": {"agent": "support-bot", "workflow": "refunds"}, "run_id": "run-1"}
    intent(project, "other-agent", kind="payment", target="stripe", **other_agent)
    other_flow = {"context": {"agent": "refund-bot", "workflow": "payouts"}, "run_id": "run-1"}
    intent(project, "other-workflow", kind="payment", target="stripe", **other_flow)
    other_run = {"context": {"agent": "refund-bot", "workflow": "refunds"}, "run_id": "run-2"}
    intent(project, "other-run", kind="payment", target="stripe", **other_run)


def _keys(client, **params) -> set[str]:
    return {e.key for e in client.get("/effects/", params).context["effects"]}


ALL = {"refund", "email", "other-target", "other-agent", "other-workflow", "other-run"}


@pytest.mark.parametrize(
    ("field", "value", "left_out"),
    [
        ("kind", "payment", {"email"}),
        ("target", "stripe", {"email", "other-target"}),
        ("agent", "refund-bot", {"other-agent"}),
        ("workflow", "refunds", {"other-workflow"}),
        ("run", "run-1", {"other-run"}),
    ],
)
def test_each_filter_shows_only_the_effects_it_names(desk, mixed, field, value, left_out):
    assert _keys(desk, **{field: value}) == ALL - left_out


def test_the_filters_combine(desk, mixed):
    both = {"kind": "payment", "target": "stripe", "agent": "refund-bot"}
    assert _keys(desk, **both, workflow="refunds", run="run-1") == {"refund"}
    assert _keys(desk, **both, run="run-2") == {"other-run"}
    assert _keys(desk, kind="email", target="stripe") == set()


def test_the_page_has_the_filters_form_with_the_current_values(desk, mixed):
    since = "2026-01-01T00:00:00+00:00"
    page = desk.get("/effects/", {"agent": "refund-bot", "run": "run-1", "since": since})
    html = unescape(page.content.decode())
    form = search(r"<form [^>]*data-effects-filter>(.*?)</form>", html.replace("\n", ""))[1]
    for name in ("kind", "target", "agent", "workflow", "run"):
        assert f'name="{name}"' in form, name
    assert search(r'<input[^>]*name="agent"[^>]*>', form)[0].count('value="refund-bot"') == 1
    assert search(r'<input[^>]*name="run"[^>]*>', form)[0].count('value="run-1"') == 1
    # A filter the form does not show (from an overview link) is kept when it is applied.
    assert f'<input type="hidden" name="since" value="{since}">' in form


def test_the_state_tabs_keep_the_new_filters(desk, project, mixed):
    timeout(project, "refund")
    params = {"kind": "payment", "agent": "refund-bot", "workflow": "refunds", "run": "run-1"}
    page = unescape(desk.get("/effects/", {**params, "target": "stripe"}).content.decode())
    nav = page[page.index('aria-label="Filter by state"') :]
    nav = nav[: nav.index("</nav>")]
    tabs = {name: href for href, name in re.findall(r'<a href="([^"]*)"[^>]*>(\w+)</a>', nav)}
    assert tabs["timed_out"] == (
        "/effects/?state=timed_out&kind=payment&target=stripe&agent=refund-bot"
        "&workflow=refunds&run=run-1"
    )
    assert _keys(desk, state="timed_out", **params) == {"refund"}
    assert _keys(desk, state="pending", **params) == {"other-target"}


def test_a_filter_value_too_long_is_ignored_and_said(desk, mixed):
    page = desk.get("/effects/", {"kind": "x" * 101}).content.decode()
    assert "kind: Ensure this value has at most 100 characters" in page
    assert _keys(desk, kind="x" * 101) == ALL


def test_the_open_cases_column_counts_each_effects_open_cases(desk, project):
    effect_in(project, State.SUCCEEDED, key="quiet")
    intent(project, "twice")
    receipt(project, "twice", "re_a")
    receipt(project, "twice", "re_b")  # a duplicate effect
    intent(project, "twice", request={"amount": 2})  # and a key reuse conflict
    effect_in(project, State.NOT_HAPPENED, key="settled")  # its uncertain case closed
    r = desk.get("/effects/")
    assert {e.key: e.open_cases for e in r.context["effects"]} == {
        "quiet": 0,
        "twice": 2,
        "settled": 0,
    }
    settled, twice, quiet = re.findall(r"<td data-open-cases>(.*?)</td>", r.content.decode())
    assert twice == f'<a href="/effects/{r.context["effects"][1].pk}/#cases">2</a>'
    assert settled == quiet == '<span class="muted">0</span>'


def test_the_open_cases_column_is_one_query_for_few_effects_or_many(desk, project):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert desk.get("/effects/").status_code == 200
        return len(captured)

    for i in range(2):
        effect_in(project, State.TIMED_OUT, key=f"few-{i}")
    few = queries()
    for i in range(20):
        effect_in(project, State.TIMED_OUT, key=f"many-{i}")
    assert queries() == few
