"""Time made visible on the run pages: durations in human units, and a run that waits on a
person says on whom."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import reset_queries
from django.utils import timezone

from durability.models import Approval, Case, Effect, Reason
from durability.templatetags.times import duration_words
from tests.desk.support import logged_in
from tests.ledger import support as ledger
from tests.trajectories.support import TRACE, post_traces, request, span, tool
from trajectories.links import effect_link_record
from trajectories.models import Run, RunStatus, Span
from trajectories.views import scale_of

AGENT, WAIT = "a" * 16, "b" * 16


@pytest.mark.parametrize(
    ("ms", "words"),
    [
        (0.042, "0.04 ms"),
        (4.2, "4.2 ms"),
        (312.4, "312 ms"),
        (5310, "5.3 s"),
        (59_990, "1 min"),
        (311_410, "5 min 11 s"),
        (7_500_000, "2 h 5 min"),
        (3 * 86_400_000 + 4 * 3_600_000, "3 d 4 h"),
    ],
)
def test_durations_read_in_human_units(ms, words):
    assert duration_words(ms) == words


def test_the_run_and_span_pages_show_durations_in_human_units(api, alice):
    post_traces(
        api.client,
        api.key,
        request(
            span(AGENT, "invoke_agent refunds", duration_ms=311_410),
            span(WAIT, "wait", parent=AGENT, at_ms=10, duration_ms=5310),
        ),
    )
    run, client = Run.objects.get(), logged_in(alice)
    page = client.get(run.get_absolute_url()).content.decode()
    assert 'title="311410.000 ms">5 min 11 s</span>' in page
    assert ">5.3 s</span>" in page
    assert "311410 ms" not in page and "311410.0 ms" not in page
    agent = Span.objects.get(span_id=AGENT)
    detail = client.get(f"/runs/{run.pk}/spans/{agent.pk}/").content.decode()
    assert '<dt>Duration</dt><dd><span class="duration"' in detail
    assert client.get("/runs/").content.decode().count(">5 min 11 s</span>") == 1


TOOL = "2" * 16


def _waiting_run(api, project, *, approval: bool) -> Run:
    """A run whose agent span is still open, and whose tool call's effect waits on a person:
    an approval, or (timed out) an uncertain case."""
    post_traces(
        api.client,
        api.key,
        request(
            span(AGENT, "invoke_agent refunds", duration_ms=0),
            tool(TOOL, parent=AGENT, at_ms=10),
        ),
    )
    fields = {"authority": {"grant": ledger.needs_approval(project).pk}} if approval else {}
    ledger.intent(project, "refund:1", trace_id=TRACE, span_id=TOOL, **fields)
    if not approval:
        ledger.timeout(project, "refund:1")
    effect_link_record(effect_id=Effect.objects.get(key="refund:1").pk)
    run = Run.objects.get()
    assert run.status == RunStatus.RUNNING
    return run


def test_a_run_waiting_on_an_approval_says_so_and_links_it(api, project, alice):
    run = _waiting_run(api, project, approval=True)
    approval = Approval.objects.get()
    client = logged_in(alice)
    said = f'waiting on <a href="/approvals/{approval.pk}/">approval #{approval.pk}</a>'
    assert said in client.get("/runs/").content.decode()
    page = client.get(run.get_absolute_url()).content.decode()
    assert said in page
    assert "data-events" in page and "Require approval" in page


def test_a_run_waiting_on_a_case_says_which(api, project, alice):
    run = _waiting_run(api, project, approval=False)
    case = Case.objects.get(reason=Reason.UNCERTAIN)
    page = logged_in(alice).get(run.get_absolute_url()).content.decode()
    assert f'waiting on <a href="/cases/{case.pk}/">case #{case.pk}</a>' in page
    assert "Case opened: uncertain" in page


def test_a_signed_approval_is_an_event_on_the_runs_timeline(api, project, alice):
    run = _waiting_run(api, project, approval=True)
    approval = Approval.objects.get()
    client = logged_in(alice)
    client.post(f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "ok"})
    page = client.get(run.get_absolute_url()).content.decode()
    events = page[page.index("data-run-events") :]
    assert "Approval signed: approve" in events
    assert 'by <span title="user:alice">alice</span>' in events
    assert "waiting on" not in page


def test_the_runs_list_reads_what_runs_wait_on_in_constant_queries(
    api, project, alice, django_assert_num_queries, django_assert_max_num_queries
):
    client = logged_in(alice)
    _waiting_run(api, project, approval=True)
    reset_queries()
    with django_assert_max_num_queries(100) as one:
        client.get("/runs/")
    counted = len(one)
    for n in range(2, 6):
        post_traces(
            api.client,
            api.key,
            request(span(f"{n:016x}", "invoke_agent", trace_id=f"{n:032x}", duration_ms=0)),
        )
        ledger.intent(project, f"refund:{n}", trace_id=f"{n:032x}", span_id=f"{n:016x}")
        ledger.timeout(project, f"refund:{n}")
        effect_link_record(effect_id=Effect.objects.get(key=f"refund:{n}").pk)
    reset_queries()
    with django_assert_num_queries(counted):
        page = client.get("/runs/").content.decode()
    assert page.count("waiting on") == 5


def test_a_long_idle_gap_is_drawn_as_a_break(api, alice):
    post_traces(
        api.client,
        api.key,
        request(
            span(AGENT, "invoke_agent refunds", duration_ms=600_400),
            span("c" * 16, "chat", parent=AGENT, at_ms=0, duration_ms=200),
            span("d" * 16, "chat", parent=AGENT, at_ms=600_200, duration_ms=200),
        ),
    )
    run = Run.objects.get()
    page = logged_in(alice).get(run.get_absolute_url()).content.decode()
    assert "Idle gaps drawn short, as breaks:" in page
    assert ">10 min</span>" in page[page.index("data-breaks") :]
    # The two calls' bars stay readable: each far wider than 1/3000 of the timeline.
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="1" width="([\d.]+)"', page)]
    assert sorted(widths)[:2] == [pytest.approx(widths[1], rel=0.01)] * 2
    assert min(widths) > 100


def test_scale_without_gaps_is_linear():
    start = timezone.now()
    scale = scale_of([(start, start + timedelta(seconds=10))])
    assert scale.breaks == []
    assert scale.x(start + timedelta(seconds=5)) == pytest.approx(500)


def test_the_overviews_recent_runs_say_what_they_wait_on(api, project, alice):
    _waiting_run(api, project, approval=True)
    approval = Approval.objects.get()
    page = logged_in(alice).get("/").content.decode()
    runs = page[page.index('id="runs-title"') :]
    assert f'waiting on <a href="/approvals/{approval.pk}/">approval #{approval.pk}</a>' in runs


def test_a_span_still_open_is_drawn_to_the_runs_latest_moment(api, project, alice):
    run = _waiting_run(api, project, approval=True)
    page = logged_in(alice).get(run.get_absolute_url()).content.decode()
    widths = re.findall(r'<rect x="([\d.]+)" y="1" width="([\d.]+)"', page)
    agent_x, agent_width = (float(v) for v in widths[0])  # the agent's span, first
    assert agent_x == 0 and agent_width > 500
