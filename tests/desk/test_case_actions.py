"""The case page's actions: each verdict, acknowledging, assigning, commenting, and what
the agent is told afterwards."""

from __future__ import annotations

from html import unescape

import pytest

from durability.models import AuditEntry, Case, Comment, Effect, Reason, Receipt, State
from tests.desk.support import (
    late_success_case,
    logged_in,
    member,
    uncertain_case,
)
from tests.ledger import support as ledger
from tests.trajectories import support as otlp
from tests.trajectories.support import post_traces, queue, request, work

__all__ = ["queue"]  # the RQ queue fixture, used by name


def _resolve(client, case, verdict, note="checked the provider's dashboard", **fields):
    return client.post(
        f"/cases/{case.pk}/resolve/",
        {"verdict": verdict, "version": case.version, "note": note, **fields},
    )


def _refused(client, response, case) -> str:
    """The case page a refused action sends back to (303 See Other), with why."""
    assert response.status_code == 303 and response["Location"] == f"/cases/{case.pk}/"
    return client.get(response["Location"]).content.decode()


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def test_it_happened_settles_the_effect_with_an_operator_attested_receipt(project, desk, api):
    case = uncertain_case(project)
    r = _resolve(
        desk,
        case,
        "happened",
        system="stripe",
        external_id="ch_42",
        link="https://dashboard.stripe.com/payments/ch_42",
        evidence_note="seen in the dashboard",
    )
    assert r.status_code == 302 and r["Location"] == f"/cases/{case.pk}/"
    effect = Effect.objects.get(cases=case)
    assert effect.state == State.SUCCEEDED
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id, receipt.strength) == (
        "stripe",
        "ch_42",
        "operator_attested",
    )
    assert receipt.data == {
        "link": "https://dashboard.stripe.com/payments/ch_42",
        "note": "seen in the dashboard",
    }
    case.refresh_from_db()
    assert case.closed is not None
    assert case.resolution.actor == "user:alice"
    assert case.resolution.note == "checked the provider's dashboard"
    entry = AuditEntry.objects.get(effect=effect, action="attest_happened")
    assert entry.actor == "user:alice" and entry.to_state == State.SUCCEEDED
    body = api.intent("k1").json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == "ch_42"
    assert body["receipt"]["strength"] == "operator_attested"


def test_it_happened_needs_evidence_and_changes_nothing_without_it(project, desk):
    case = uncertain_case(project)
    r = _resolve(desk, case, "happened", system="", external_id="")
    assert r.status_code == 400
    assert b"Evidence needs this to say it happened." in r.content
    assert Effect.objects.get(cases=case).state == State.TIMED_OUT
    assert Case.objects.get(pk=case.pk).closed is None


def test_it_did_not_happen_lets_the_next_intent_proceed(project, desk, api):
    case = uncertain_case(project)
    assert api.intent("k1").json()["decision"] == "wait"
    assert _resolve(desk, case, "not_happened").status_code == 302
    assert Effect.objects.get(cases=case).state == State.NOT_HAPPENED
    assert api.get(f"effects/{case.effect_id}").json()["decision"] == "proceed"
    body = api.intent("k1").json()
    assert body["decision"] == "proceed"
    assert body["effect"]["attempt"] == 2 and body["effect"]["state"] == "pending"


@pytest.mark.parametrize(
    ("verdict", "state"), [("compensated", "compensated"), ("abandoned", "abandoned")]
)
def test_compensated_and_abandoned_close_the_effect_and_deny_the_next_intent(
    project, desk, api, verdict, state
):
    case = uncertain_case(project)
    assert _resolve(desk, case, verdict, note="refunded by hand").status_code == 302
    effect = Effect.objects.get(cases=case)
    assert effect.state == state
    assert not effect.cases.filter(closed=None).exists()
    body = api.intent("k1").json()
    assert body["decision"] == "denied"
    assert state in body["reason"]


def test_acknowledging_a_late_success_closes_it_without_changing_the_effect(project, desk, api):
    case = late_success_case(project)
    r = _resolve(desk, case, "acknowledge", note="the customer was told")
    assert r.status_code == 302
    case.refresh_from_db()
    assert case.closed is not None and case.resolution.action == "acknowledged"
    assert Effect.objects.get(cases=case).state == State.SUCCEEDED
    entry = AuditEntry.objects.get(case=case, action="case_closed")
    assert entry.actor == "user:alice" and entry.data["action"] == "acknowledged"
    assert api.intent("k1").json()["decision"] == "completed"


def test_an_uncertain_case_cannot_be_acknowledged_away(project, desk):
    case = uncertain_case(project)
    r = _resolve(desk, case, "acknowledge")
    assert r.status_code == 400
    assert "needs a verdict, not an acknowledgement" in r.content.decode()
    assert Case.objects.get(pk=case.pk).closed is None


def test_an_orphan_receipt_case_can_be_acknowledged(project, desk):
    ledger.receipt(project, "nobody-asked", "re_9")
    case = Case.objects.get(reason=Reason.ORPHAN_RECEIPT)
    page = desk.get(f"/cases/{case.pk}/")
    assert page.status_code == 200 and b"re_9" in page.content
    assert _resolve(desk, case, "acknowledge", note="a test payment").status_code == 302
    assert Case.objects.get(pk=case.pk).closed is not None


def test_a_verdict_that_does_not_settle_the_reason_is_refused_plainly(project, desk):
    case = late_success_case(project)
    r = _resolve(desk, case, "not_happened")
    assert r.status_code == 400
    said = unescape(r.content.decode())
    assert "“It did not happen” does not settle a case of reason late_success." in said
    assert "Offered: compensated, acknowledge." in said
    assert Effect.objects.get(cases=case).state == State.SUCCEEDED


def test_every_resolution_needs_a_reason(project, desk):
    case = uncertain_case(project)
    r = _resolve(desk, case, "not_happened", note="   ")
    assert r.status_code == 400
    assert b"This field is required." in r.content
    assert Effect.objects.get(cases=case).state == State.TIMED_OUT


def test_a_resolution_on_a_stale_page_is_refused_and_says_who_changed_it(project, desk, admin):
    case = uncertain_case(project)
    stale_version = case.version
    assert _resolve(logged_in(admin), case, "not_happened").status_code == 302
    case.version = stale_version
    r = _resolve(desk, case, "abandoned")
    text = _refused(desk, r, case)
    assert f"Case #{case.pk} changed while you were looking at it" in text
    assert "closed: it did not happen, by ada" in text and "Your action was not applied" in text
    assert "just now" in text and "0\xa0minutes" not in text  # never "0 minutes ago"
    assert Effect.objects.get(cases=case).state == State.NOT_HAPPENED


def test_assigning_to_me_to_a_colleague_and_to_nobody(project, desk, admin, viewer):
    case = uncertain_case(project)
    r = desk.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": "me"})
    assert r.status_code == 302
    case.refresh_from_db()
    assert case.assignee is not None and case.assignee.username == "alice"
    desk.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": "ada"})
    case.refresh_from_db()
    assert case.assignee is not None and case.assignee.username == "ada"
    r = desk.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": "victor"})
    assert "cannot act on this project" in _refused(desk, r, case)
    desk.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": ""})
    case.refresh_from_db()
    assert case.assignee is None
    actions = AuditEntry.objects.filter(case=case, action="case_assigned").order_by("id")
    assert [e.data["assignee"] for e in actions] == ["alice", "ada", None]
    assert {e.actor for e in actions} == {"user:alice"}


def test_assigning_from_the_queue_answers_with_the_row(project, desk):
    case = uncertain_case(project)
    r = desk.post(
        f"/cases/{case.pk}/assign/",
        {"version": case.version, "assignee": "me"},
        headers={"HX-Request": "true"},
    )
    assert r.status_code == 200
    html = r.content.decode()
    assert html.lstrip().startswith(f'<tr id="case-{case.pk}"') and "alice" in html
    stale = desk.post(
        f"/cases/{case.pk}/assign/",
        {"version": case.version, "assignee": ""},
        headers={"HX-Request": "true"},
    )
    assert "changed while you were looking at it" in stale.content.decode()
    assert Case.objects.get(pk=case.pk, assignee__username="alice")


def test_a_comment_joins_the_story_and_the_audit_log(project, desk):
    case = uncertain_case(project)
    r = desk.post(f"/cases/{case.pk}/comment/", {"body": "Asked Stripe support, ticket 881"})
    assert r.status_code == 302
    comment = Comment.objects.get(case=case)
    assert comment.actor == "user:alice"
    entry = AuditEntry.objects.get(case=case, action="case_commented")
    assert entry.data == {"comment": comment.pk} and entry.actor == "user:alice"
    assert "Asked Stripe support, ticket 881" in desk.get(f"/cases/{case.pk}/").content.decode()
    assert desk.post(f"/cases/{case.pk}/comment/", {"body": ""}).status_code == 400


def test_the_story_tells_intent_attempts_and_their_context_changes_in_order(project, desk):
    authority = {"grant": ledger.everything(project).pk, "ticket": "refunds-under-50"}
    ledger.intent(
        project,
        "k1",
        run_id="run-1",
        worker="w1",
        authority=authority,
        context={"workflow": "refund-bot", "workflow_version": "2.3.0", "model": "m-1"},
    )
    ledger.failure(project, "k1", definitive=True)
    ledger.intent(
        project,
        "k1",
        run_id="run-1",
        worker="w2",
        authority=authority,
        context={"workflow": "refund-bot", "workflow_version": "2.4.0", "model": "m-1"},
    )
    ledger.timeout(project, "k1")
    case = Case.objects.get(reason=Reason.UNCERTAIN)
    html = desk.get(f"/cases/{case.pk}/").content.decode()
    story = html[html.index('<ol class="timeline">') :]
    order = [
        "Intent recorded",
        "refunds-under-50",
        "Failed: nothing happened",
        "New attempt",
        "2.4.0",
        "Changed since attempt 1",
        "Case opened",  # version drift, on attempt 2
        "Timed out",
        "Attempt 2 timed out: no answer in 30s",
    ]
    positions = [story.index(text) for text in order]
    assert positions == sorted(positions)
    assert "version_drift" in story


def test_a_viewer_sees_the_case_but_no_actions(project, viewer):
    case = uncertain_case(project)
    html = logged_in(viewer).get(f"/cases/{case.pk}/").content.decode()
    assert "can read this case but not resolve it" in html
    assert 'action="/cases/' not in html


def test_members_of_another_project_are_not_assignable(project, desk):
    from durability.models import Project, Role

    other = Project.objects.create(name="delta")
    member(other, "gus", Role.OPERATOR)
    case = uncertain_case(project)
    r = desk.post(f"/cases/{case.pk}/assign/", {"version": case.version, "assignee": "gus"})
    assert "cannot act on this project" in _refused(desk, r, case)
    assert Case.objects.get(pk=case.pk).assignee is None


def test_beside_the_story_the_case_links_the_tool_call_and_the_model_run(
    desk, api, queue, django_capture_on_commit_callbacks
):
    model, tool_span = "1" * 16, "2" * 16
    with django_capture_on_commit_callbacks(execute=True):
        spans = request(otlp.chat(model), otlp.tool(tool_span))
        assert post_traces(api.client, api.key, spans).status_code == 200
        api.intent("k1", trace_id=otlp.TRACE, span_id=tool_span)
        api.timeout("k1")
    work(queue)
    case = Case.objects.get(reason=Reason.UNCERTAIN)
    html = desk.get(f"/cases/{case.pk}/").content.decode()
    trajectory = html[html.index('aria-label="Trajectory"') :]
    assert "execute_tool refund" in trajectory and tool_span in trajectory
    assert "chat gpt-4o" in trajectory and model in trajectory


def test_after_a_refused_verdict_the_address_is_the_cases_and_a_reload_posts_nothing(
    project, desk, admin
):
    case = uncertain_case(project)
    stale_version = case.version
    assert _resolve(logged_in(admin), case, "not_happened").status_code == 302
    case.version = stale_version
    r = _resolve(desk, case, "abandoned")
    assert r.status_code == 303 and r["Location"] == f"/cases/{case.pk}/"
    entries = AuditEntry.objects.count()
    shown = desk.get(r["Location"]).content.decode()
    assert "changed while you were looking at it" in shown
    # Reloading is a GET of the case page: nothing posted again, the message shown once.
    again = desk.get(r["Location"]).content.decode()
    assert "changed while you were looking at it" not in again
    assert AuditEntry.objects.count() == entries
