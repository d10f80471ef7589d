"""The queue page: open cases of every reason, filtered from the URL, sorted, counted,
paginated by keyset, kept fresh without a reload, and switched between projects."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.desk import case_actions
from durability.desk.queue import PAGE_SIZE
from durability.models import Case, Membership, Project, Reason, Role, Severity
from tests.desk.support import (
    late_success_case,
    logged_in,
    search,
    uncertain_case,
)
from tests.ledger import support as ledger


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _shown(response) -> list[int]:
    """The case ids of the rows of a queue page or fragment, in order."""
    return [int(pk) for pk in re.findall(r'<tr id="case-(\d+)"', response.content.decode())]


@pytest.fixture
def mixed(project, admin):
    """One open case of several reasons, kinds, targets, workflows and assignees."""
    refund = uncertain_case(
        project, "refund-1", context={"workflow": "refund-bot", "workflow_version": "2.3.0"}
    )
    deploy = uncertain_case(project, "deploy-1", run_id="run-deploy", kind="deploy", target="k8s")
    late = late_success_case(project, "mail-1")
    ledger.receipt(project, "stray", "re_stray")
    orphan = Case.objects.get(reason=Reason.ORPHAN_RECEIPT)
    case_actions.case_assign(
        project=project, case_id=deploy.pk, version=deploy.version, actor="user:ada", assignee=admin
    )
    return {"refund": refund, "deploy": deploy, "late": late, "orphan": orphan}


def test_it_lists_open_cases_of_every_reason_with_what_a_triager_needs(desk, mixed):
    r = desk.get("/queue/")
    html = r.content.decode()
    assert set(_shown(r)) == {c.pk for c in mixed.values()}
    for text in [
        "uncertain",
        "late_success",
        "orphan_receipt",
        "refund-bot",
        "2.3.0",
        "run-deploy",
    ]:
        assert text in html
    assert "k8s" in html and "deploy" in html and "ada" in html
    assert "4 open cases" in html


def test_closed_cases_leave_the_queue(project, desk, mixed):
    late = mixed["late"]
    case_actions.case_acknowledge(
        project=project, case_id=late.pk, version=late.version, actor="user:alice", note="ok"
    )
    assert late.pk not in _shown(desk.get("/queue/"))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("reason=uncertain", {"refund", "deploy"}),
        ("reason=late_success", {"late"}),
        ("severity=4", set()),
        ("severity=3", {"refund", "deploy", "late", "orphan"}),
        ("kind=deploy", {"deploy"}),
        ("target=stripe", {"refund", "late"}),
        ("workflow=refund-bot", {"refund"}),
        ("workflow=run-deploy", {"deploy"}),
        ("assignee=ada", {"deploy"}),
        ("assignee=none", {"refund", "late", "orphan"}),
        ("assignee=me", set()),
        ("reason=uncertain&target=k8s", {"deploy"}),
    ],
)
def test_each_filter_lives_in_the_url(desk, mixed, query, expected):
    assert set(_shown(desk.get(f"/queue/?{query}"))) == {mixed[n].pk for n in expected}


def test_a_filter_on_the_agent_named_in_the_context_matches(project, desk):
    case = uncertain_case(project, "a-1", context={"agent": "billing-agent"})
    uncertain_case(project, "a-2")
    assert _shown(desk.get("/queue/?workflow=billing-agent")) == [case.pk]


def test_a_filter_on_the_workflow_follows_a_retry_under_another_one(project, desk):
    ledger.intent(project, "k1", context={"workflow": "refund-bot"}, replay="safe")
    ledger.intent(project, "k1", context={"workflow": "refund-bot"}, request={"other": 1})
    conflict = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert _shown(desk.get("/queue/?workflow=refund-bot")) == [conflict.pk]
    ledger.failure(project, "k1", definitive=True)
    ledger.intent(project, "k1", context={"workflow": "refund-bot-2"})
    retried = set(_shown(desk.get("/queue/?workflow=refund-bot-2")))
    assert conflict.pk in retried
    assert _shown(desk.get("/queue/?workflow=refund-bot")) == []


def test_an_invalid_filter_is_reported_and_ignored(desk, mixed):
    r = desk.get("/queue/?reason=bogus&severity=9&after=x")
    assert r.status_code == 200
    html = r.content.decode()
    assert "reason: Select a valid choice" in html and "(ignored)" in html
    assert len(_shown(r)) == 4


def test_counts_per_reason_follow_the_other_filters(desk, mixed):
    html = desk.get("/queue/?target=stripe").content.decode()
    counts = dict(re.findall(r'>(\w+) <span class="count">(\d+)</span>', html))
    assert counts == {"all": "2", "uncertain": "1", "late_success": "1"}


def test_sorting_by_severity_puts_the_most_severe_first_then_the_oldest(project, desk):
    low = uncertain_case(project, "low")
    Case.objects.filter(pk=low.pk).update(severity=Severity.LOW)
    high = uncertain_case(project, "high")
    ledger.intent(project, "dup")
    ledger.receipt(project, "dup", "a")
    ledger.receipt(project, "dup", "b")
    critical = Case.objects.get(reason=Reason.DUPLICATE_EFFECT)
    assert _shown(desk.get("/queue/?sort=severity")) == [critical.pk, high.pk, low.pk]
    assert _shown(desk.get("/queue/")) == [low.pk, high.pk, critical.pk]


@pytest.mark.parametrize("sort", ["age", "severity"])
def test_keyset_pages_cover_every_case_once(project, desk, sort):
    now = timezone.now()
    made = [
        c.pk
        for c in Case.objects.bulk_create(
            Case(project=project, reason=Reason.ORPHAN_RECEIPT, severity=Severity.HIGH, summary="s")
            for _ in range(PAGE_SIZE * 2 + 5)
        )
    ]
    # Ties on the opening time and on severity must not lose or repeat a row.
    Case.objects.filter(pk__in=made[:60]).update(opened=now - timedelta(hours=1))
    Case.objects.filter(pk__in=made[::3]).update(severity=Severity.CRITICAL)
    seen: list[int] = []
    url = f"/queue/?sort={sort}"
    while url:
        r = desk.get(url, headers={"HX-Request": "true"} if seen else {})
        seen += _shown(r)
        more = re.search(r'hx-get="(\?[^"]+after=[^"]+)"', r.content.decode())
        url = "/queue/" + more.group(1).replace("&amp;", "&") if more else ""
    assert sorted(seen) == sorted(made) and len(seen) == len(made)


def test_the_pulse_shows_a_case_resolved_elsewhere_and_new_ones(project, desk, mixed):
    page = desk.get("/queue/").content.decode()
    since = search(r"since=(\d+)", page).group(1)
    refund = mixed["refund"]
    case_actions.case_resolve(
        project=project,
        case_id=refund.pk,
        version=refund.version,
        actor="user:ada",
        verdict=case_actions.Verdict.NOT_HAPPENED,
        note="not in Stripe",
    )
    uncertain_case(project, "fresh")
    shown = ".".join(str(c.pk) for c in mixed.values())
    pulse = desk.get(f"/queue/pulse/?since={since}&shown={shown}").content.decode()
    row = search(rf'<tr id="case-{refund.pk}"[^>]*>', pulse).group(0)
    assert 'hx-swap-oob="outerHTML"' in row and "closed" in row
    assert "Closed: it did not happen by ada" in pulse
    assert "1 new case since this page loaded" in pulse
    assert 'id="reason-counts"' in pulse
    # The next poll starts after what this one saw.
    later = search(r"since=(\d+)&amp;new=(\d+)", pulse)
    assert int(later.group(1)) > int(since) and later.group(2) == "1"
    quiet = desk.get(f"/queue/pulse/?since={later.group(1)}&shown={shown}").content.decode()
    assert "<tr" not in quiet


def test_the_current_project_is_switchable_and_remembered(project, desk, alice):
    uncertain_case(project, "in-alpha")
    beta = Project.objects.create(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.VIEWER)
    uncertain_case(beta, "in-beta")
    header = desk.get("/queue/").content.decode()
    assert f'<option value="{project.pk}" selected>alpha</option>' in header
    assert "in-alpha" in header and "in-beta" not in header
    r = desk.post("/projects/switch/", {"project": beta.pk, "next": "/queue/?sort=severity"})
    assert r.status_code == 302 and r["Location"] == "/queue/?sort=severity"
    page = desk.get("/queue/").content.decode()
    assert "in-beta" in page and "in-alpha" not in page
    assert '<span class="role" title="Your role in this project">viewer</span>' in page
    r = desk.post("/projects/switch/", {"project": project.pk, "next": "https://evil.example/"})
    assert r["Location"] == "/queue/"


QUEUE_VIEWS = [
    "/queue/",
    "/queue/?sort=severity",
    "/queue/?workflow=refund-bot",
    "/queue/?kind=payment&target=stripe&reason=uncertain",
]


def test_the_queue_runs_the_same_queries_for_few_cases_or_many(project, desk):
    def queries() -> list[list[str]]:
        counted = []
        for path in QUEUE_VIEWS:
            with CaptureQueriesContext(connection) as captured:
                assert desk.get(path).status_code == 200
            counted.append([q["sql"] for q in captured.captured_queries])
        return counted

    uncertain_case(project, "a-0", context={"workflow": "refund-bot"})
    few = queries()
    for n in range(1, 12):
        uncertain_case(project, f"a-{n}", context={"workflow": "refund-bot"})
    many = queries()
    assert [len(sqls) for sqls in many] == [len(sqls) for sqls in few]
    # Its counts read the open cases alone, whatever the filter: no effect, no attempt.
    for sqls in many:
        counts = [sql for sql in sqls if sql.startswith('SELECT "durability_case"."reason"')]
        assert counts and all("durability_effect" not in sql for sql in counts)


def test_the_pulse_counts_only_new_cases_the_filter_would_show(project, desk, mixed):
    page = desk.get("/queue/?reason=late_success").content.decode()
    since = search(r"since=(\d+)", page).group(1)
    uncertain_case(project, "another-uncertain")
    pulse = desk.get(f"/queue/pulse/?reason=late_success&since={since}").content.decode()
    assert "new case" not in pulse
    assert search(r"since=(\d+)&amp;new=(\d+)", pulse).group(2) == "0"
    late_success_case(project, "another-late")
    pulse = desk.get(f"/queue/pulse/?reason=late_success&since={since}").content.decode()
    assert "1 new case since this page loaded" in pulse
    assert 'href="/queue/?reason=late_success">Show</a>' in pulse


def test_the_pulse_sends_rows_only_for_the_cases_the_page_shows(project, desk, admin, mixed):
    page = desk.get("/queue/?reason=late_success")
    since = search(r"since=(\d+)", page.content.decode()).group(1)
    late, deploy = mixed["late"], mixed["deploy"]
    for case, assignee in ((late, admin), (deploy, None)):
        case.refresh_from_db()
        case_actions.case_assign(
            project=project,
            case_id=case.pk,
            version=case.version,
            actor="user:ada",
            assignee=assignee,
        )
    shown = ".".join(str(pk) for pk in _shown(page))
    pulse = desk.get(f"/queue/pulse/?reason=late_success&since={since}&shown={shown}")
    assert _shown(pulse) == [late.pk]
    # A page that names no row (or names them wrongly) gets none.
    assert _shown(desk.get(f"/queue/pulse/?since={since}&shown=x.-1")) == []
