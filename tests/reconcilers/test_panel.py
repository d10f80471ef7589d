"""The case page's probe panel: who may probe now, and what the panel shows."""

from __future__ import annotations

import django_rq
import pytest
from django.contrib.auth.models import User
from django.template import engines
from django.test import RequestFactory
from rq import SimpleWorker

from durability.accounts.roles import access_of
from durability.models import AuditEntry, Case, Effect, Membership, Probe, ReconcilerConfig, Role
from durability.reconcilers.reconciling import effect_probe
from tests.local_http import LocalHttp, Reply


@pytest.fixture
def server():
    with LocalHttp() as s:
        s.reply("/refunds/refund%3A1", Reply(200, {"id": "re_1"}))
        yield s


@pytest.fixture
def effect(api, project, server) -> Effect:
    ReconcilerConfig.objects.create(
        project=project,
        target="stripe",
        kind="http",
        config={"url": server.url + "/refunds/{key}", "external_id_path": "id"},
    )
    api.intent("refund:1")
    api.timeout("refund:1")
    return Effect.objects.get(key="refund:1")


@pytest.fixture
def inline(settings):
    settings.REDIS_URL = ""


@pytest.fixture
def victor(project) -> User:
    """A viewer of `project`: may read, not act."""
    user = User.objects.create_user("victor", password="password")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    return user


def url(effect, what="probe"):
    return f"/effects/{effect.pk}/{what}/"


def poll_url(response) -> str:
    """Where the panel polls for the answer to a requested probe."""
    html = response.content.decode()
    return str(html.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&"))


def test_an_operator_probes_now_and_the_panel_shows_the_answer(
    client, alice, effect, inline, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(url(effect), headers={"HX-Request": "true"})
        # Rendered before the commit (as every request here): the panel waits for it.
        assert 'hx-trigger="every 2s"' in r.content.decode()
    probe = Probe.objects.get()
    assert probe.requested_by == "user:alice" and probe.answer == "found"
    html = client.get(poll_url(r), headers={"HX-Request": "true"}).content.decode()
    assert 'id="probes"' in html and f'id="probe-{probe.pk}"' in html
    assert "stripe:re_1" in html and "settled: probe_found" in html
    assert "hx-trigger" not in html
    assert "Probe now" not in html  # settled: nothing left to probe
    assert AuditEntry.objects.get(action="probe").actor == "user:alice"
    assert Effect.objects.get(pk=effect.pk).state == "succeeded"


def test_without_javascript_probe_now_redirects_back(
    client, alice, effect, inline, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(url(effect), {"next": "/effects/?state=timed_out"})
    assert r.status_code == 302 and r.url == "/effects/?state=timed_out"
    r = client.post(url(effect), {"next": "https://evil.example/"})
    assert r.status_code == 302 and r.url == effect.get_absolute_url()


def test_probe_now_needs_a_login(client, effect, inline):
    r = client.post(url(effect))
    assert r.status_code == 302 and r.url.startswith("/login/")
    assert not Probe.objects.exists()


def test_a_viewer_may_not_probe(client, victor, effect, inline):
    client.force_login(victor)
    assert client.post(url(effect)).status_code == 403
    assert not Probe.objects.exists()


def test_a_stranger_does_not_see_the_effect(client, mallory, effect, inline):
    client.force_login(mallory)
    assert client.post(url(effect)).status_code == 404
    assert client.get(url(effect, "probes")).status_code == 404
    assert not Probe.objects.exists()


def test_probe_now_is_post_only(client, alice, effect):
    client.force_login(alice)
    assert client.get(url(effect)).status_code == 405


def test_a_settled_effect_is_not_probed(client, alice, effect, api, inline):
    api.receipt("refund:1", "re_agent")
    client.force_login(alice)
    r = client.post(url(effect), headers={"HX-Request": "true"})
    assert "The effect is succeeded, not timed out" in r.content.decode()
    assert not Probe.objects.exists()


def test_with_redis_the_panel_waits_for_the_worker(
    client, alice, effect, django_capture_on_commit_callbacks
):
    queue = django_rq.get_queue("default")
    queue.connection.flushdb()
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(url(effect), headers={"HX-Request": "true"})
    assert "Probe requested" in r.content.decode()
    poll = poll_url(r)
    assert "Probe requested" in client.get(poll).content.decode()

    SimpleWorker([queue], connection=queue.connection).work(burst=True)

    html = client.get(poll, headers={"HX-Request": "true"}).content.decode()
    assert "Probe requested" not in html and "hx-trigger" not in html
    assert "settled: probe_found" in html
    queue.connection.flushdb()


def test_a_viewer_sees_the_history_without_the_button(client, victor, effect, server):
    server.reply("/refunds/refund%3A1", Reply(404, {}))
    effect_probe(effect_id=effect.pk)
    client.force_login(victor)
    html = client.get(url(effect, "probes")).content.decode()
    assert "Not Found" in html and "HTTP 404" in html
    assert "Probe now" not in html
    assert "evidence for an operator" in html


def test_the_panel_renders_from_the_case_page_include(rf: RequestFactory, alice, effect):
    request = rf.get("/")
    request.user = alice
    html = (
        engines["django"]
        .from_string('{% include "durability/reconcilers/_case_probes.html" %}')
        .render({"effect": effect, "access": access_of(alice, effect.project_id)}, request)
    )
    assert "Reconciler probes" in html and "Probe now" in html


def test_the_case_page_shows_the_probes_and_the_button(client, alice, effect, server):
    server.reply("/refunds/refund%3A1", Reply(404, {}))
    probe = effect_probe(effect_id=effect.pk)
    assert probe is not None
    case = Case.objects.get(effect=effect, reason="uncertain")
    client.force_login(alice)
    html = client.get(f"/cases/{case.pk}/").content.decode()
    assert 'id="probes"' in html and f'id="probe-{probe.pk}"' in html
    assert f'action="/effects/{effect.pk}/probe/"' in html


def test_a_probe_that_found_the_effect_shows_when_the_provider_saw_it(
    client, alice, effect, server
):
    # As the demo's provider answers: the creation time as ISO 8601 text with an offset.
    server.reply(
        "/refunds/refund%3A1", Reply(200, {"id": "re_1", "created": "2026-12-01T07:49:12+01:00"})
    )
    config = ReconcilerConfig.objects.get(project=effect.project)
    config.config = {**config.config, "observed_at_path": "created"}
    config.save()
    probe = effect_probe(effect_id=effect.pk)
    assert probe is not None and probe.settled == "probe_found"
    assert isinstance(probe.evidence["observed_at"], str)  # stored as JSON text
    client.force_login(alice)
    case = Case.objects.filter(effect=effect).first()
    pages = [f"/effects/{effect.pk}/", url(effect, "probes")]
    pages += [f"/cases/{case.pk}/"] if case else []
    for page in pages:
        r = client.get(page)
        assert r.status_code == 200, page
        assert '<time datetime="2026-12-01T06:49:12Z"' in r.content.decode(), page


@pytest.mark.parametrize("stored", ["yesterday", 17, "2026-13-45T00:00:00", ["x"]])
def test_an_unreadable_stored_observation_time_does_not_fail_the_panel(
    client, alice, effect, stored
):
    Probe.objects.create(
        project=effect.project,
        effect=effect,
        kind="http",
        attempt=1,
        requested_by="system:scan",
        started=effect.created,
        finished=effect.created,
        answer="found",
        evidence={"system": "stripe", "external_id": "re_1", "observed_at": stored},
    )
    client.force_login(alice)
    r = client.get(url(effect, "probes"))
    assert r.status_code == 200 and "stripe:re_1" in r.content.decode()
