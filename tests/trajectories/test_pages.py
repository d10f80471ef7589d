"""The runs list and the run page: a span tree beside its waterfall, effects under tool calls."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from durability.models import Membership, Project, Role
from tests.trajectories.support import TRACE, chat, post_traces, request, span, tool
from trajectories.links import effect_link_record
from trajectories.models import Run, Span

AGENT, MODEL, TOOL = "a" * 16, "1" * 16, "2" * 16


@pytest.fixture
def run(api):
    post_traces(
        api.client,
        api.key,
        request(
            span(
                AGENT,
                "invoke_agent refunds",
                duration_ms=500,
                attributes={"gen_ai.agent.name": "refunds"},
            ),
            chat(
                MODEL,
                parent=AGENT,
                at_ms=10,
                attributes={"gen_ai.input.messages": '[{"role": "user"}]'},
            ),
            tool(
                TOOL,
                parent=AGENT,
                at_ms=100,
                attributes={"gen_ai.tool.call.arguments": '{"password": "hunter2"}'},
            ),
        ),
    )
    return Run.objects.get()


@pytest.fixture
def effect(api, run):
    effect_id = api.intent("refund:1", trace_id=TRACE, span_id=TOOL).json()["effect"]["id"]
    api.receipt("refund:1", "re_77")
    effect_link_record(effect_id=effect_id)
    return effect_id


def test_the_pages_need_a_login(client, run):
    assert client.get("/runs/").status_code == 302
    assert client.get(f"/runs/{run.pk}/").status_code == 302


def test_a_stranger_sees_no_runs(client, mallory, run):
    client.force_login(mallory)
    assert "invoke_agent" not in client.get("/runs/").content.decode()
    assert client.get(f"/runs/{run.pk}/").status_code == 404


def test_a_stranger_with_a_project_of_their_own_sees_none_of_these_runs(client, outsider, run):
    client.force_login(outsider)
    model = Span.objects.get(span_id=MODEL)
    assert TRACE not in client.get("/runs/").content.decode()
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert client.get(f"/runs/{run.pk}/spans/{model.pk}/").status_code == 404
    htmx = {"HX-Request": "true"}
    assert client.get(f"/runs/{run.pk}/spans/{model.pk}/", headers=htmx).status_code == 404


def test_the_runs_pages_follow_the_current_project(client, alice, run, other_api):
    beta = Project.objects.get(name="beta")
    Membership.objects.create(project=beta, user=alice, role=Role.VIEWER)
    theirs = "5" * 32
    post_traces(other_api.client, other_api.key, request(chat(MODEL, trace_id=theirs)))
    beta_run = Run.objects.get(project=beta)
    beta_span = Span.objects.get(run=beta_run)
    alpha_span = Span.objects.get(run=run, span_id=MODEL)
    client.force_login(alice)

    def pages(of: Run, span: Span) -> list[int]:
        urls = [f"/runs/{of.pk}/", f"/runs/{of.pk}/spans/{span.pk}/"]
        return [client.get(url).status_code for url in urls] + [
            client.get(urls[1], headers={"HX-Request": "true"}).status_code
        ]

    listed = client.get("/runs/").content.decode()
    assert f'<option value="{run.project_id}" selected>alpha</option>' in listed
    assert TRACE in listed and theirs not in listed
    assert pages(run, alpha_span) == [200, 200, 200]
    assert pages(beta_run, beta_span) == [404, 404, 404]

    client.post("/projects/switch/", {"project": beta.pk})
    listed = client.get("/runs/").content.decode()
    assert f'<option value="{beta.pk}" selected>beta</option>' in listed
    assert theirs in listed and TRACE not in listed
    assert pages(beta_run, beta_span) == [200, 200, 200]
    assert pages(run, alpha_span) == [404, 404, 404]


def test_the_runs_list_shows_the_last_24_hours_with_counts(client, alice, run):
    Run.objects.create(
        project=run.project, run_id="old", started=timezone.now() - timedelta(days=2)
    )
    client.force_login(alice)
    page = client.get("/runs/").content.decode()
    assert TRACE in page and ">old<" not in page
    assert re.search(r"<strong>1</strong> run\b", page)
    assert "refunds" in page
    since = (timezone.now() - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    assert "old" in client.get("/runs/", {"since": since}).content.decode()


def test_the_runs_list_filters_by_agent_workflow_version_and_status(client, alice, run):
    Run.objects.create(project=run.project, run_id="other", agent="billing", status="error")
    client.force_login(alice)
    assert "other" not in client.get("/runs/", {"agent": "refunds"}).content.decode()
    assert TRACE not in client.get("/runs/", {"status": "error"}).content.decode()
    assert TRACE not in client.get("/runs/", {"version": "9"}).content.decode()
    assert TRACE in client.get("/runs/", {"workflow": "invoke_agent refunds"}).content.decode()


def test_the_runs_list_pages_with_a_keyset(client, alice, project):
    now = timezone.now()
    for i in range(55):
        Run.objects.create(
            project=project, run_id=f"run-{i:02d}", started=now - timedelta(seconds=i)
        )
    client.force_login(alice)
    first = client.get("/runs/").content.decode()
    assert "run-00" in first and "run-49" in first and "run-50" not in first
    found = re.search(r'href="\?([^"]+before=[^"]+)"', first)
    assert found is not None
    more = found.group(1).replace("&amp;", "&")
    rest = client.get(f"/runs/?{more}", headers={"HX-Request": "true"}).content.decode()
    assert "run-50" in rest and "run-54" in rest and "run-49" not in rest
    assert "<table" not in rest


def test_the_run_page_shows_the_tree_beside_the_waterfall_and_the_effect_under_its_tool_call(
    client, alice, run, effect
):
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert (
        page.index(f'id="span-{AGENT}"')
        < page.index(f'id="span-{MODEL}"')
        < page.index(f'id="span-{TOOL}"')
    )
    assert len(re.findall(r'<svg class="bar" viewBox="0 0 1000 10"', page)) == 3
    assert "style=" not in page and "<script>" not in page
    tool_row = page[page.index(f'id="span-{TOOL}"') :]
    assert (
        f'href="/effects/{effect}/"' in tool_row and "succeeded" in tool_row and "re_77" in tool_row
    )


def test_a_span_opens_without_a_reload_and_has_a_deep_link(client, alice, run):
    client.force_login(alice)
    model = Span.objects.get(span_id=MODEL)
    url = f"/runs/{run.pk}/spans/{model.pk}/"
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="{url}" hx-get="{url}" hx-target="#span-detail"' in page
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in fragment and "gpt-4o" in fragment and "100 in / 20 out" in fragment
    full = client.get(url).content.decode()
    assert "<html" in full and 'class="node selected"' in full and "gpt-4o" in full


def test_span_detail_shows_inputs_redacted(client, alice, run):
    client.force_login(alice)
    executed = Span.objects.get(span_id=TOOL)
    page = client.get(f"/runs/{run.pk}/spans/{executed.pk}/").content.decode()
    assert "[REDACTED]" in page and "hunter2" not in page


def test_the_effect_page_links_to_its_run_tool_call_and_model_span(client, alice, run, effect):
    client.force_login(alice)
    page = client.get(f"/effects/{effect}/").content.decode()
    for span_id in (TOOL, MODEL):
        found = Span.objects.get(span_id=span_id)
        assert f'href="/runs/{run.pk}/spans/{found.pk}/"' in page
    assert f'href="/runs/{run.pk}/"' in page


def test_a_run_of_5000_spans_renders_a_bounded_page_and_loads_the_rest_when_opened(
    client, alice, api
):
    # An agent loop: 50 steps, each a model call and a tool call with 98 spans below it.
    spans = [span(AGENT, "invoke_agent", duration_ms=60_000)]
    n = 0
    for step in range(50):
        step_id = f"b{step:015x}"
        spans.append(tool(step_id, f"call_{step}", parent=AGENT, at_ms=step * 1000))
        for _ in range(99):
            n += 1
            spans.append(span(f"c{n:015x}", "http", parent=step_id, at_ms=step * 1000 + 1))
    for i in range(0, len(spans), 1000):
        assert post_traces(api.client, api.key, request(*spans[i : i + 1000])).status_code == 200
    run = Run.objects.get()
    assert run.span_count == 5001
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    rendered = page.count('class="node')
    assert 50 < rendered < 400
    lazy = re.findall(r'hx-get="(/runs/\d+/\?root=\d+)" hx-trigger="toggle once"', page)
    assert lazy
    children = client.get(lazy[0], headers={"HX-Request": "true"}).content.decode()
    assert children.count('class="node') == 99 and "<html" not in children


def test_a_span_whose_status_was_never_set_shows_no_status(client, alice, run):
    client.force_login(alice)
    model = Span.objects.get(span_id=MODEL)
    Span.objects.filter(pk=model.pk).update(status="unset")
    page = client.get(f"/runs/{run.pk}/spans/{model.pk}/").content.decode()
    assert "span-unset" not in page and ">unset<" not in page
    Span.objects.filter(pk=model.pk).update(status="error")
    page = client.get(f"/runs/{run.pk}/spans/{model.pk}/").content.decode()
    assert '<span class="state span-error">error</span>' in page
