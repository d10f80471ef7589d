"""Groups of similar cases: what groups (a fingerprint taken when a case is opened), the
grouped queue (one row per group, with its count, first and last seen and trend), a new case
joining its group, and one verdict settling a whole group through the bulk preview."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.desk import queue
from durability.desk.queue import QueueQuery, groups_page, open_cases
from durability.ledger import evidence
from durability.ledger.cases import cause_of, group_key_of
from durability.ledger.commands import Failure
from durability.models import AuditAction, AuditEntry, Case, Grant, Reason, Severity, State
from tests.desk.support import late_success_case, logged_in, search, uncertain_case
from tests.ledger import support as ledger


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _groups(response) -> list[str]:
    """The group keys of the rows of a grouped queue page or fragment, in order."""
    return re.findall(r'<tbody id="group-([0-9a-f]{32})"', response.content.decode())


def _count_of(response, key: str) -> int:
    html = response.content.decode()
    block = search(rf'<tbody id="group-{key}".*?</tbody>', html.replace("\n", " ")).group(0)
    return int(search(r"<strong data-group-count>(\d+)</strong>", block).group(1))


def _failed(project, key: str, error: str, **intent_fields) -> Case:
    """An effect whose attempt failed with `error`, not knowing whether it happened."""
    ledger.intent(project, key, **intent_fields)
    evidence.failure_record(
        project=project,
        actor=ledger.ACTOR,
        failure=Failure(key=key, error=error, definitive=False),
    )
    return Case.objects.get(effect__key=key, reason=Reason.UNCERTAIN, closed=None)


# -- the fingerprint ---------------------------------------------------------------------------


def test_cases_that_differ_only_in_key_run_and_time_share_a_group(project):
    first = uncertain_case(project, "email:1", kind="email", target="smtp", run_id="run-1")
    second = uncertain_case(project, "email:2", kind="email", target="smtp", run_id="run-2")
    assert first.group_key and first.group_key == second.group_key


@pytest.mark.parametrize(
    "other",
    [
        {"target": "sendgrid"},
        {"kind": "sms"},
        {"context": {"agent": "another-bot"}},
        {"context": {"workflow": "another-workflow"}},
    ],
)
def test_cases_on_another_target_kind_agent_or_workflow_are_another_group(project, other):
    base = {"kind": "email", "target": "smtp", "context": {"agent": "mailer"}}
    first = uncertain_case(project, "email:1", **base)
    second = uncertain_case(project, "email:2", **(base | other))
    assert first.group_key != second.group_key


def test_cases_under_another_grant_or_of_another_reason_are_another_group(project):
    first = uncertain_case(project, "refund:1")
    other = Grant.objects.create(
        project=project, name="refunds", kinds=["*"], targets=["*"], granted_by="test"
    )
    second = uncertain_case(project, "refund:2", authority={"grant": other.pk})
    late = late_success_case(project, "refund:3")
    assert len({first.group_key, second.group_key, late.group_key}) == 3


def test_errors_that_differ_only_in_numbers_ids_and_quoted_values_share_a_group(project):
    one = _failed(project, "m:1", "SMTP 421 for msg_8f3a9c2d: 'ada@example.com' deferred")
    two = _failed(project, "m:2", "SMTP 450 for msg_77aa0b13: 'bob@example.com' deferred")
    other = _failed(project, "m:3", "connection reset by peer")
    assert one.group_key == two.group_key != other.group_key
    assert cause_of(one.detail) == "error: smtp … for …: … deferred"


def test_a_timeout_and_a_failure_of_the_same_effects_are_two_groups(project):
    timed_out = uncertain_case(project, "t:1")
    failed = _failed(project, "t:2", "HTTP 502")
    assert timed_out.group_key != failed.group_key


def test_the_fingerprint_is_a_digest_of_what_the_cases_share():
    names = {"kind": "email", "target": "smtp", "agent": "mailer", "workflow": "mail-bot"}
    key = group_key_of(Reason.UNAUTHORIZED_EFFECT, names, 7, {"evidence": 12})
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key == group_key_of(Reason.UNAUTHORIZED_EFFECT, names, 7, {"evidence": 99})
    assert key != group_key_of(Reason.UNAUTHORIZED_EFFECT, names, 8, {"evidence": 12})


# -- the grouped queue -------------------------------------------------------------------------


@pytest.fixture
def piled(project):
    """Three uncertain email cases of one kind (a pile-up), a deploy, and a late success."""
    emails = [
        uncertain_case(project, f"email:{n}", kind="email", target="smtp", run_id=f"r{n}")
        for n in range(3)
    ]
    deploy = uncertain_case(project, "deploy:1", kind="deploy", target="k8s")
    late = late_success_case(project, "refund:1")
    return {"emails": emails, "deploy": deploy, "late": late}


def test_the_grouped_queue_shows_one_row_per_group_with_its_count(desk, piled):
    r = desk.get("/queue/?grouped=1")
    html = r.content.decode()
    emails = piled["emails"][0].group_key
    assert sorted(_groups(r)) == sorted(
        {emails, piled["deploy"].group_key, piled["late"].group_key}
    )
    assert _count_of(r, emails) == 3
    assert "5 open cases in 3 groups" in html
    assert 'name="grouped" value="1" checked' in html
    # No case row until a group is expanded.
    assert '<tr id="case-' not in html


def test_the_queue_is_one_row_per_case_unless_grouped(desk, piled):
    html = desk.get("/queue/").content.decode()
    assert len(re.findall(r'<tr id="case-\d+"', html)) == 5
    assert '<tbody id="group-' not in html


def test_a_new_case_joins_its_group_and_keeps_its_own_page(project, desk, piled):
    key = piled["emails"][0].group_key
    new = uncertain_case(project, "email:9", kind="email", target="smtp", run_id="r9")
    r = desk.get("/queue/?grouped=1")
    assert new.group_key == key
    assert len(_groups(r)) == 3 and _count_of(r, key) == 4
    assert desk.get(new.get_absolute_url()).status_code == 200
    # Expanded, the group lists each of its cases, each a row leading to its page.
    expanded = desk.get(f"/queue/?group={key}", headers={"HX-Request": "true"})
    shown = {int(pk) for pk in re.findall(r'<tr id="case-(\d+)"', expanded.content.decode())}
    assert shown == {c.pk for c in piled["emails"]} | {new.pk}
    assert f"/cases/{new.pk}/?from=group%3D{key}" in expanded.content.decode()


def test_the_filter_applies_to_the_groups_and_their_counts(project, desk, piled, alice):
    email = piled["emails"][0]
    email.refresh_from_db()
    email.assignee = alice
    email.save()
    r = desk.get("/queue/?grouped=1&target=smtp")
    assert _groups(r) == [email.group_key] and _count_of(r, email.group_key) == 3
    mine = desk.get("/queue/?grouped=1&assignee=me")
    assert _groups(mine) == [email.group_key] and _count_of(mine, email.group_key) == 1
    assert "1 open case in 1 group" in mine.content.decode()


def test_the_trend_counts_a_groups_open_cases_per_hour_over_the_last_day(project, piled):
    now = timezone.now()
    first, second, third = piled["emails"]
    Case.objects.filter(pk=first.pk).update(opened=now - timedelta(hours=30))
    Case.objects.filter(pk=second.pk).update(opened=now - timedelta(hours=2))
    Case.objects.filter(pk=third.pk).update(opened=now)
    query = QueueQuery.from_params({"grouped": "1"})
    groups, _ = groups_page(open_cases(project, query, None), query, now=now)
    group = next(g for g in groups if g.key == first.group_key)
    assert group.count == 3 and len(group.trend) == 24
    assert group.trend[-1] == 1 and group.trend[-3] == 1 and sum(group.trend) == 2
    assert group.first_seen == now - timedelta(hours=30) and group.last_seen == now


def test_groups_sort_by_first_seen_or_by_their_most_severe_case(project, desk, piled):
    now = timezone.now()
    Case.objects.filter(pk=piled["late"].pk).update(
        opened=now - timedelta(days=2), severity=Severity.LOW
    )
    Case.objects.filter(pk=piled["deploy"].pk).update(severity=Severity.CRITICAL)
    oldest = _groups(desk.get("/queue/?grouped=1"))
    assert oldest[0] == piled["late"].group_key
    severe = _groups(desk.get("/queue/?grouped=1&sort=severity"))
    assert severe == [piled["deploy"].group_key, piled["emails"][0].group_key, oldest[0]]


@pytest.mark.parametrize("sort", ["age", "severity"])
def test_keyset_pages_of_groups_cover_every_group_once(project, desk, monkeypatch, sort):
    monkeypatch.setattr(queue, "PAGE_SIZE", 2)
    made = {uncertain_case(project, f"k:{n}", target=f"t{n}").group_key for n in range(5)}
    seen: list[str] = []
    url = f"/queue/?grouped=1&sort={sort}"
    while url:
        r = desk.get(url, headers={"HX-Request": "true"} if "after=" in url else {})
        seen += _groups(r)
        more = re.search(r'hx-get="(\?[^"]+after=[^"]+)"', r.content.decode())
        url = "/queue/" + more.group(1).replace("&amp;", "&") if more else ""
    assert sorted(seen) == sorted(made) and len(seen) == len(made)


def test_an_invalid_group_is_reported_and_ignored(desk, piled):
    html = desk.get("/queue/?group=nope").content.decode()
    assert "group: Not a group of this queue. (ignored)" in html
    assert len(re.findall(r'<tr id="case-\d+"', html)) == 5


GROUPED_VIEWS = [
    "/queue/?grouped=1",
    "/queue/?grouped=1&sort=severity",
    "/queue/?grouped=1&target=smtp&reason=uncertain",
]


def test_the_grouped_queue_runs_the_same_few_queries_for_few_groups_or_many(project, desk):
    def queries() -> list[int]:
        counted = []
        for path in GROUPED_VIEWS:
            with CaptureQueriesContext(connection) as captured:
                assert desk.get(path).status_code == 200
            counted.append(len(captured))
        return counted

    uncertain_case(project, "a-0", kind="email", target="smtp")
    few = queries()
    for n in range(1, 12):
        # Eleven more cases in six groups: two cases a target.
        uncertain_case(project, f"a-{n}", kind="email", target="smtp" if n < 6 else f"t{n // 2}")
    many = queries()
    # The session, the user, the membership and its permissions; the groups, their first
    # cases, their trends; the counts per reason, the number of groups, the latest audit
    # entry; the members (the navigation's projects and the assignees); the saved views.
    assert few == many == [13, 13, 13]


# -- settling a group ----------------------------------------------------------------------------


def test_one_verdict_settles_every_case_of_a_group_through_the_state_machine(project, desk, piled):
    key = piled["emails"][0].group_key
    ticked = {"verb": "not_happened", "scope": "selected", "case_group": key, "grouped": "1"}
    ticked["note"] = "the SMTP relay was down: nothing was sent"
    preview = desk.get("/queue/bulk/preview/", ticked).content.decode()
    assert "<strong data-eligible>3</strong> cases" in preview
    assert Case.objects.filter(group_key=key, closed=None).count() == 3

    r = desk.post("/queue/bulk/", ticked)
    assert r.status_code == 200 and "Done" in r.content.decode()
    for case in piled["emails"]:
        case.refresh_from_db()
        assert not case.is_open and case.resolution.action == "attest_not_happened"
        assert case.effect.state == State.NOT_HAPPENED
        entries = AuditEntry.objects.filter(effect=case.effect, actor="user:alice")
        actions = set(entries.values_list("action", flat=True))
        assert {AuditAction.ATTEST_NOT_HAPPENED, AuditAction.CASE_CLOSED} <= actions
    # The other groups are left as they were.
    assert set(Case.objects.filter(closed=None).values_list("pk", flat=True)) == {
        piled["deploy"].pk,
        piled["late"].pk,
    }
    assert key not in _groups(desk.get("/queue/?grouped=1"))


def test_a_group_verdict_settles_only_the_cases_the_filter_shows(project, desk, piled, alice):
    email = piled["emails"][0]
    Case.objects.filter(pk=email.pk).update(assignee=alice)
    key = email.group_key
    ticked = {"verb": "not_happened", "scope": "selected", "case_group": key}
    ticked |= {"note": "mine: nothing sent", "assignee": "me", "grouped": "1"}
    preview = desk.get("/queue/bulk/preview/", ticked).content.decode()
    assert "<strong data-eligible>1</strong> case" in preview
    desk.post("/queue/bulk/", ticked)
    assert list(Case.objects.filter(group_key=key, closed=None).values_list("pk", flat=True)) == [
        c.pk for c in piled["emails"][1:]
    ]


def test_a_ticked_group_must_be_a_group(desk, piled):
    r = desk.get(
        "/queue/bulk/preview/",
        {"verb": "assign", "scope": "selected", "case_group": "nope", "assign_to": "me"},
    )
    assert "case_group: Not a list of groups." in r.content.decode()
