"""The overview: the landing page counts what needs a person and what the agents did,
in the user's current project, and every number links to the list it counts."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.models import ApiKey, Case, Effect, Membership, Project, Role
from trajectories.models import Run

NUMBER_LINK = re.compile(r'<a[^>]*href="([^"]+)"[^>]*>(\d+)</a>')


def _agent(api, key: str, agent: str, target: str = "stripe", **fields):
    return api.intent(key, target=target, context={"workflow": agent}, **fields)


@pytest.fixture
def operator(client: Client, alice: User) -> User:
    client.force_login(alice)
    return alice


def _busy_day(api) -> None:
    """Effects in most states, with open and closed cases of several reasons."""
    for n in range(3):
        _agent(api, f"ok:{n}", "refund-bot")
        api.receipt(f"ok:{n}", f"re_{n}")
    _agent(api, "lost:1", "refund-bot")
    api.timeout("lost:1")  # uncertain, high
    _agent(api, "late:1", "release-bot", target="github")
    api.timeout("late:1")
    api.receipt("late:1", "sha-late")  # late success (the uncertain case closes)
    _agent(api, "dup:1", "support-bot", target="slack")
    api.receipt("dup:1", "msg-1")
    api.receipt("dup:1", "msg-2")  # duplicate effect, critical
    _agent(api, "reuse:1", "support-bot", target="slack")
    _agent(api, "reuse:1", "support-bot", target="slack", request={"other": True})  # conflict
    api.failure("reuse:1", definitive=True)
    api.receipt("nobody:1", "re_orphan")  # orphan receipt
    _agent(api, "pending:1", "release-bot", target="github", timeout_s=3600)


def test_it_sends_anonymous_visitors_to_the_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_logging_in_lands_on_the_overview(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "password"})
    assert response.status_code == 302 and response.url == "/"


def test_a_user_without_a_project_is_told_so(client, mallory):
    client.force_login(mallory)
    response = client.get("/")
    assert response.status_code == 200
    assert b"not a member of any project" in response.content


def test_it_counts_open_cases_by_reason_and_severity(api, client, operator):
    _busy_day(api)
    response = client.get("/")
    assert response.status_code == 200
    rows = {row.reason: [c.n for c in row.cells] for row in response.context["reasons"]}
    # Columns: critical, high and above, medium and above, all.
    assert rows["duplicate_effect"] == [1, 1, 1, 1]
    assert rows["uncertain"] == [0, 1, 1, 1]
    assert rows["late_success"][-1] == 1
    assert rows["key_reuse_conflict"][-1] == 1
    assert rows["orphan_receipt"][-1] == 1
    totals = [c.n for c in response.context["severity_totals"]]
    assert totals[-1] == sum(cells[-1] for cells in rows.values())
    assert totals[0] == 1
    body = response.content.decode()
    assert 'href="/queue/?reason=duplicate_effect&amp;severity=4">1</a>' in body
    assert 'href="/queue/?reason=uncertain">1</a>' in body


def test_it_names_the_oldest_open_case(api, client, operator):
    _busy_day(api)
    lost = Case.objects.filter(effect__key="lost:1", reason="uncertain")
    lost.update(opened=timezone.now() - timedelta(hours=3))
    response = client.get("/")
    oldest = response.context["oldest"]
    assert oldest.effect.key == "lost:1" and oldest.reason == "uncertain"
    assert f'href="/cases/{oldest.pk}/"' in response.content.decode()


def test_it_counts_late_successes_and_duplicates_of_the_last_day(api, client, operator):
    _busy_day(api)
    response = client.get("/")
    seen = {reason: (n.n, still_open.n) for reason, n, still_open in response.context["last_day"]}
    assert seen == {"late_success": (1, 1), "duplicate_effect": (1, 1)}


def test_it_counts_effects_by_receipt_strength(api, client, operator):
    _busy_day(api)
    strengths = dict(client.get("/").context["strengths"])
    # The three plain successes, the late one and the duplicated one; orphans name no effect.
    assert strengths["agent_reported"].n == 5


def test_it_ranks_the_busiest_agents_and_targets(api, client, operator):
    _busy_day(api)
    response = client.get("/")
    agents = [(b.name, b.effects.n) for b in response.context["agents"]]
    assert agents == [("refund-bot", 4), ("release-bot", 2), ("support-bot", 2)]
    targets = [(b.name, b.effects.n) for b in response.context["targets"]]
    assert targets == [("stripe", 4), ("github", 2), ("slack", 2)]
    # Their open cases, as the queue filtered by agent or by target counts them.
    for busy in [*response.context["agents"], *response.context["targets"]]:
        assert busy.open_cases.n == client.get(busy.open_cases.url).context["total"]
    assert [b.open_cases.n > 0 for b in response.context["targets"]] == [True] * 3


def test_the_chart_stacks_each_bucket_by_state(api, client, operator):
    _busy_day(api)
    # An effect created two hours ago falls in an earlier bar of the day's chart.
    then = timezone.now() - timedelta(hours=2)
    Effect.objects.filter(key="ok:0").update(created=then)
    chart = client.get("/?range=24h").context["chart"]
    assert chart.range == "24h" and len(chart.bars) == 24
    earlier = next(bar for bar in chart.bars if bar.start <= then < bar.end)
    assert {s.state: s.n for s in earlier.segments} == {"succeeded": 1}
    recent = [s for bar in chart.bars[-2:] for s in bar.segments]
    assert sum(s.n for s in recent) == 7
    assert {state: n.n for state, n in chart.legend} == {
        "succeeded": 5,
        "failed": 1,
        "pending": 1,
        "timed_out": 1,
    }
    # Segments stack upwards from the baseline without overlapping.
    busiest = max(chart.bars, key=lambda bar: bar.total)
    for below, above in zip(busiest.segments, busiest.segments[1:], strict=False):
        assert above.y + above.height == pytest.approx(below.y)
    # Drawn on the server, within the CSP: no script, no inline style.
    page = client.get("/?range=24h").content.decode()
    main = page[page.index("<main>") : page.index("</main>")]
    assert "<svg" in main and "<script" not in main and "style=" not in main


def test_the_chart_can_show_the_problems_alone_scaled_to_them(api, client, operator):
    _busy_day(api)
    everything = client.get("/?range=24h").context["chart"]
    chart = client.get("/?range=24h&show=problems").context["chart"]
    assert chart.problems and not everything.problems
    # Beside the failed states, the successes that came late or twice.
    problems = {"failed": 1, "timed_out": 1, "late_success": 1, "duplicate_effect": 1}
    assert {state: n.n for state, n in chart.legend} == problems
    assert {s.state for bar in chart.bars for s in bar.segments} == set(problems)
    # The axis' top follows the problems, not the successes around them.
    assert chart.ticks[-1][1] < everything.ticks[-1][1]
    page = client.get("/?range=24h&show=problems").content.decode()
    assert 'href="?range=1h&amp;show=problems"' in page and "Problems by state" in page


def test_the_chart_shows_the_last_hour_of_a_young_project(api, client, operator):
    _agent(api, "first", "refund-bot")
    chart = client.get("/").context["chart"]
    assert chart.range == "1h" and len(chart.bars) == 12


def test_every_number_links_to_a_list_of_exactly_that_many(api, client, operator):
    _busy_day(api)
    body = client.get("/").content.decode()
    links = [(html.unescape(url), int(n)) for url, n in NUMBER_LINK.findall(body)]
    assert len(links) > 20
    for url, n in links:
        response = client.get(url)
        assert response.status_code == 200, url
        if url.startswith("/runs/"):
            continue  # a run's spans and errors: its page
        if url.startswith("/queue/"):
            shown = response.context["total"]
        else:
            assert url.startswith("/effects/"), url
            shown = len(response.context["effects"])
        assert shown == n, f"{url} lists {shown}, the overview said {n}"


def test_it_lists_the_recent_runs(api, client, operator, project):
    for n in range(10):
        Run.objects.create(
            project=project,
            run_id=f"run-{n}",
            agent="refund-bot",
            started=timezone.now() - timedelta(minutes=10 - n),
            span_count=n,
        )
    response = client.get("/")
    runs = response.context["runs"]
    assert [r.run_id for r in runs] == [f"run-{n}" for n in range(9, 1, -1)]
    assert f'href="/runs/{runs[0].pk}/"' in response.content.decode()


def test_it_counts_only_the_current_project(api, client, operator, alice):
    _busy_day(api)
    other = Project.objects.create(name="zeta")
    Membership.objects.create(project=other, user=alice, role=Role.OPERATOR)
    _, raw = ApiKey.issue(other)
    client.post(
        "/api/v1/intents",
        {"key": "z", "kind": "payment", "target": "bank"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    response = client.get("/")
    assert response.context["project"].name == "alpha"
    assert "bank" not in [b.name for b in response.context["targets"]]
    client.post("/projects/switch/", {"project": other.pk})
    response = client.get("/")
    assert response.context["project"] == other
    assert [b.name for b in response.context["targets"]] == ["bank"]
    assert response.context["open_total"].n == Case.objects.filter(project=other).count()


def test_it_takes_the_same_few_queries_however_much_there_is(api, client, operator):
    _busy_day(api)
    with CaptureQueriesContext(connection) as few:
        client.get("/")
    assert 5 < len(few) <= 20
    for n in range(20):
        _agent(api, f"more:{n}", f"agent-{n}", target=f"target-{n}")
        api.timeout(f"more:{n}")
    with CaptureQueriesContext(connection) as more:
        client.get("/")
    assert len(more) == len(few)


def test_the_effects_list_filters_by_agent_target_case_strength_and_time(api, client, operator):
    _busy_day(api)

    def keys(**params):
        return sorted(e.key for e in client.get("/effects/", params).context["effects"])

    assert keys(agent="support-bot") == ["dup:1", "reuse:1"]
    assert keys(target="github") == ["late:1", "pending:1"]
    assert keys(case="late_success") == ["late:1"]
    assert keys(case="duplicate_effect", since=timezone.now().isoformat()) == []
    assert keys(strength="agent_reported", target="slack") == ["dup:1"]
    assert keys(since=(timezone.now() + timedelta(minutes=1)).isoformat()) == []
    assert keys(state="timed_out") == ["lost:1"]
    # An invalid field is ignored, not fatal.
    assert len(keys(state="exploded", since="yesterday")) == 8


def test_the_severity_columns_are_named_in_words(api, client, operator):
    _busy_day(api)
    body = client.get("/").content.decode()
    for label in ("critical", "high or worse", "medium or worse", "all"):
        assert f'<th class="num">{label}</th>' in body
    assert "+</th>" not in body
