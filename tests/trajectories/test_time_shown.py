"""Time made visible on the run pages: durations in human units, and a run that waits on a
person says on whom."""

from __future__ import annotations

import pytest

from durability.templatetags.times import duration_words
from tests.desk.support import logged_in
from tests.trajectories.support import post_traces, request, span
from trajectories.models import Run, Span

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
