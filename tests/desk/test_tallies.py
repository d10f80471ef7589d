"""The hourly tallies: the overview counts whole past hours from them and the rest live,
and shows the same numbers as counting every effect, however often the job runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability import tallies
from durability.models import Effect, EffectHour, EffectHourMark, Project
from tests.desk.support import logged_in
from tests.ledger import support as ledger

RANGES = ("24h", "7d")


def _spread(project: Project, agent: str, n: int, hours_ago: int, **fields: Any) -> None:
    """`n` effects of `agent` created `hours_ago` hours ago, half of them with a receipt."""
    for i in range(n):
        key = f"{agent}:{hours_ago}:{i}"
        ledger.intent(project, key, context={"workflow": agent}, **fields)
        if i % 2 == 0:
            ledger.receipt(project, key, f"re-{key}")
    then = timezone.now() - timedelta(hours=hours_ago, minutes=1)
    Effect.objects.filter(key__startswith=f"{agent}:{hours_ago}:").update(created=then)


@pytest.fixture
def days(project: Project) -> None:
    """Effects over the last week: in the current hour, earlier today, days ago."""
    _spread(project, "refund-bot", 3, 0, target="stripe")
    _spread(project, "refund-bot", 2, 5, target="stripe")
    _spread(project, "release-bot", 4, 23, target="github")
    _spread(project, "mail-bot", 2, 30, target="smtp")
    _spread(project, "mail-bot", 3, 24 * 6, target="smtp", timeout_s=60)
    ledger.timeout(project, "mail-bot:144:1")


def _numbers(client: Any) -> dict[str, Any]:
    """Every count the overview shows, per chart range."""
    numbers: dict[str, Any] = {}
    for name in RANGES:
        context = client.get(f"/?range={name}").context
        chart = context["chart"]
        numbers[name] = {
            "bars": [(bar.start, [(s.state, s.n) for s in bar.segments]) for bar in chart.bars],
            "legend": [(state, n.n) for state, n in chart.legend],
            "strengths": [(s, n.n) for s, n in context["strengths"]],
            "agents": [(b.name, b.effects.n, b.open_cases.n) for b in context["agents"]],
            "targets": [(b.name, b.effects.n, b.open_cases.n) for b in context["targets"]],
        }
    return numbers


def _live(client: Any) -> dict[str, Any]:
    """The numbers as counted from every effect (no hour tallied)."""
    marks = list(EffectHourMark.objects.all())
    EffectHourMark.objects.all().delete()
    try:
        return _numbers(client)
    finally:
        EffectHourMark.objects.bulk_create(marks)


def test_the_overview_shows_the_same_numbers_before_and_after_the_job_runs_twice(
    project, alice, days
):
    client = logged_in(alice)
    counted = _numbers(client)
    assert counted["24h"]["agents"][0][:2] == ("refund-bot", 5)
    tallies.projects_tally()
    assert EffectHour.objects.filter(project=project).exists()
    assert _numbers(client) == counted
    tallies.projects_tally()
    assert _numbers(client) == counted


def test_the_job_leaves_the_same_rows_when_it_runs_again(project, days):
    def rows() -> list[tuple[Any, ...]]:
        return sorted(
            EffectHour.objects.values_list(
                "hour", "state", "kind", "target", "agent", "grant", "n", "evidenced"
            )
        )

    tallies.projects_tally()
    first = rows()
    assert (
        sum(row[6] for row in first)
        == Effect.objects.exclude(
            created__gte=timezone.now().replace(minute=0, second=0, microsecond=0)
        ).count()
    )
    tallies.projects_tally()
    assert rows() == first


def test_an_effect_of_a_tallied_hour_counts_as_it_is_now_after_the_next_run(project, alice, days):
    client = logged_in(alice)
    tallies.projects_tally()
    # Days after it was created: a late receipt, a new state, and evidence.
    ledger.receipt(project, "mail-bot:144:1", "re-late")
    ledger.failure(project, "refund-bot:5:1", definitive=True)
    tallies.projects_tally()
    shown = _numbers(client)
    assert shown == _live(client)
    legend = dict(shown["7d"]["legend"])
    assert legend["succeeded"] == Effect.objects.filter(state="succeeded").count()


def test_the_overview_costs_the_same_queries_for_few_effects_or_many(project, alice):
    client = logged_in(alice)

    def queries() -> list[int]:
        tallies.projects_tally()
        counted = []
        for name in ("1h", *RANGES):
            with CaptureQueriesContext(connection) as captured:
                assert client.get(f"/?range={name}").status_code == 200
            counted.append(len(captured))
        return counted

    _spread(project, "refund-bot", 2, 3)
    few = queries()
    for hours_ago in (1, 7, 30, 100):
        _spread(project, f"bot-{hours_ago}", 5, hours_ago, target=f"t{hours_ago}")
    assert queries() == few
