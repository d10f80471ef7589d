"""The overview's backlog: cases opened and settled per hour (or day), the open cases over
time and how long cases took to settle by reason, read from the hourly case tallies, the
same before and after the job runs, at a cost that does not grow with the cases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability import tallies
from durability.models import Case, CaseHour, Effect, EffectHour, Project
from tests.desk.support import logged_in, uncertain_case
from tests.ledger import support as ledger


def _settled(project: Project, key: str, opened_ago: timedelta, took: timedelta) -> Case:
    """An uncertain case opened `opened_ago`, settled `took` after it opened."""
    case = uncertain_case(project, key)
    opened = timezone.now() - opened_ago
    closed = opened + took
    Case.objects.filter(pk=case.pk).update(opened=opened, closed=closed)
    return case


def _opened(project: Project, key: str, ago: timedelta) -> Case:
    case = uncertain_case(project, key)
    Case.objects.filter(pk=case.pk).update(opened=timezone.now() - ago)
    return case


@pytest.fixture
def week(project: Project) -> None:
    """Cases over the last days: some still open, some settled after minutes or hours."""
    _opened(project, "open:1", timedelta(hours=30))
    _opened(project, "open:2", timedelta(minutes=20))
    _settled(project, "quick:1", timedelta(hours=5), timedelta(minutes=4))
    _settled(project, "quick:2", timedelta(hours=3), timedelta(minutes=6))
    _settled(project, "slow:1", timedelta(days=3), timedelta(hours=10))
    _settled(project, "now:1", timedelta(minutes=30), timedelta(minutes=2))


def _backlog(client: Any, range_name: str) -> dict[str, Any]:
    backlog = client.get(f"/?range={range_name}").context["backlog"]
    return {
        "bars": [(b.start, b.opened, b.settled, b.still_open) for b in backlog.bars],
        "times": [(t.reason, t.settled, t.median_ms, t.p90_ms) for t in backlog.settle_times],
    }


def test_the_backlog_counts_cases_opened_and_settled_and_still_open(project, alice, week):
    client = logged_in(alice)
    day = _backlog(client, "24h")
    # Opened in the last day: open:2, quick:1, quick:2, now:1 (open:1 is 30 h old).
    assert sum(bar[1] for bar in day["bars"]) == 4
    assert sum(bar[2] for bar in day["bars"]) == 3
    assert day["bars"][-1][3] == 2  # open now: open:1 and open:2
    week_ = _backlog(client, "7d")
    assert sum(bar[1] for bar in week_["bars"]) == 6
    assert sum(bar[2] for bar in week_["bars"]) == 4
    page = client.get("/?range=7d").content.decode()
    assert "Backlog: cases opened and settled per day, last 7 days" in page
    assert "data-opened>6<" in page and "data-settled>4<" in page


def test_time_to_settle_reads_median_and_90th_percentile_by_reason(project, alice, week):
    client = logged_in(alice)
    (uncertain,) = _backlog(client, "7d")["times"]
    reason, settled, median, p90 = uncertain
    assert (reason, settled) == ("uncertain", 4)
    # Four settled in 2, 4, 6 minutes and 10 hours: the median between 4 and 6 minutes'
    # buckets, the 90th percentile in the 10 hours' bucket (8 h to 16 h).
    assert 3 * 60_000 <= median <= 15 * 60_000
    assert 8 * 3_600_000 <= p90 <= 16 * 3_600_000
    page = client.get("/?range=7d").content.decode()
    assert "data-settle-times" in page and "90th percentile" in page


def test_the_backlog_is_the_same_before_and_after_the_job_runs(project, alice, week):
    client = logged_in(alice)
    live = {name: _backlog(client, name) for name in ("24h", "7d")}
    tallies.projects_tally()
    assert CaseHour.objects.filter(project=project).exists()
    assert {name: _backlog(client, name) for name in ("24h", "7d")} == live
    tallies.projects_tally()
    assert {name: _backlog(client, name) for name in ("24h", "7d")} == live


def test_a_case_settled_after_its_hour_was_tallied_counts_after_the_next_run(project, alice, week):
    client = logged_in(alice)
    tallies.projects_tally()
    # The effect of open:1 (30 hours old, its hour tallied) is found not to have happened.
    ledger.settle(project, "open:1", ledger.Event.ATTEST_NOT_HAPPENED)
    tallies.projects_tally()
    shown = _backlog(client, "7d")
    assert sum(bar[2] for bar in shown["bars"]) == 5
    assert shown["bars"][-1][3] == 1


def test_settling_buckets_and_quantiles():
    assert tallies.bucket_of(30) == 0 and tallies.bucket_of(60) == 0
    assert tallies.bucket_of(61) == 1
    assert tallies.bucket_of(10**9) == len(tallies.SETTLE_BOUNDS)
    took = [0] * (len(tallies.SETTLE_BOUNDS) + 1)
    assert tallies.settle_quantile(took, 0.5) is None
    took[1] = 10  # ten cases, each 1 to 5 minutes
    assert tallies.settle_quantile(took, 0.5) == pytest.approx(180)


def test_the_backlog_costs_the_same_queries_for_few_cases_or_many(project, alice):
    client = logged_in(alice)

    def queries() -> list[int]:
        counted = []
        for name in ("1h", "24h", "7d"):
            with CaptureQueriesContext(connection) as captured:
                assert client.get(f"/?range={name}").status_code == 200
            counted.append(len(captured))
        return counted

    _settled(project, "a:0", timedelta(hours=2), timedelta(minutes=5))
    tallies.projects_tally()
    few = queries()
    for n in range(1, 15):
        _settled(project, f"a:{n}", timedelta(hours=n * 7), timedelta(minutes=n))
        _opened(project, f"b:{n}", timedelta(minutes=n))
    tallies.projects_tally()
    assert queries() == few


def test_problems_only_counts_late_successes_and_duplicates_tallied_or_live(project, alice):
    ledger.intent(project, "late:1")
    ledger.timeout(project, "late:1")
    ledger.receipt(project, "late:1", "re-late")
    ledger.intent(project, "dup:1")
    ledger.receipt(project, "dup:1", "re-a")
    ledger.receipt(project, "dup:1", "re-b")
    then = timezone.now() - timedelta(hours=3)
    Effect.objects.update(created=then)
    client = logged_in(alice)

    def legend() -> dict[str, int]:
        chart = client.get("/?range=24h&show=problems").context["chart"]
        return {state: number.n for state, number in chart.legend}

    live = legend()
    assert live == {"late_success": 1, "duplicate_effect": 1}
    tallies.projects_tally()
    assert EffectHour.objects.filter(late_success=1).exists()
    assert legend() == live
    page = client.get("/?range=24h&show=problems").content.decode()
    assert "case=duplicate_effect" in page and 'class="s-late_success"' in page
