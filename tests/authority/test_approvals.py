"""Approvals: an effect whose grant requires it waits for people, one or two of them."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.contrib.auth.models import User

from durability.ledger import settling
from durability.models import (
    Approval,
    AuditEntry,
    Case,
    Effect,
    Project,
    Reason,
    Role,
    Signoff,
    State,
)
from tests.authority.support import grant, under
from tests.desk.support import logged_in, member
from tests.trajectories import support as otlp
from tests.trajectories.support import post_traces, queue, request, work

__all__ = ["queue"]  # the RQ queue fixture, used by name


@pytest.fixture
def bob(project: Project) -> User:
    """A second operator: the other person a two-person approval needs."""
    return member(project, "bob", Role.OPERATOR)


def _ask(api, project, key: str = "refund:1", amount: str = "40.00", **fields):
    g = grant(
        project,
        name="refunds",
        currency="EUR",
        max_amount="1000",
        requires_approval=True,
        second_approval_above="100",
    )
    body = api.intent(
        key, run_id="run-7", context={"agent": "refund-bot"}, **under(g, amount), **fields
    ).json()
    return body, Approval.objects.get(effect__key=key)


def _sign(user: User, approval: Approval, verdict: str, reason: str = "checked the order"):
    return logged_in(user).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": verdict, "reason": reason}
    )


def test_a_grant_requiring_approval_answers_wait_and_opens_an_approval(api, project):
    body, approval = _ask(api, project)
    assert body["decision"] == "wait"
    assert body["effect"]["state"] == "awaiting_approval"
    assert body["case"]["reason"] == "approval_required"
    assert f"/approvals/{approval.pk}/" in body["reason"]
    assert approval.needed == 1 and approval.status == "open"
    assert approval.context == {"agent": "refund-bot"}
    effect = Effect.objects.get(key="refund:1")
    assert effect.attempt_count == 0 and effect.deadline is None
    assert api.intent("refund:1", **under(approval.grant, "40.00")).json()["decision"] == "wait"


def test_one_approval_releases_the_effect_for_the_agents_next_intent(api, project, alice):
    _, approval = _ask(api, project, timeout_s=30)
    response = _sign(alice, approval, "approve")
    assert response.status_code == 302
    effect = Effect.objects.get(key="refund:1")
    assert effect.state == State.PENDING and effect.attempt_count == 0
    assert not Case.objects.filter(reason=Reason.APPROVAL_REQUIRED, closed=None).exists()
    resolution = Case.objects.get(reason=Reason.APPROVAL_REQUIRED).resolution
    assert (resolution.actor, resolution.action) == ("user:alice", "approved")
    assert api.get("effects", key="refund:1").json()["decision"] == "proceed"
    body = api.intent("refund:1", **under(approval.grant, "40.00")).json()
    assert body["decision"] == "proceed"
    assert body["effect"]["attempt"] == 1 and body["effect"]["deadline"] is not None
    assert api.receipt("refund:1", "re_1").json()["effect"]["state"] == "succeeded"


def test_a_denial_denies_the_effect_and_the_agent_is_told_who_and_why(api, project, alice):
    _, approval = _ask(api, project)
    _sign(alice, approval, "deny", "customer already refunded by hand")
    approval.refresh_from_db()
    assert approval.status == "denied" and approval.decided is not None
    body = api.intent("refund:1", **under(approval.grant, "40.00")).json()
    assert body["decision"] == "denied"
    assert body["reason"] == (
        "Approval was denied by user:alice: customer already refunded by hand"
    )


def test_above_the_threshold_two_different_people_must_approve(api, project, alice, bob):
    body, approval = _ask(api, project, amount="250.00")
    assert approval.needed == 2
    assert "two people's approval above 100.00 EUR" in body["reason"]
    _sign(alice, approval, "approve")
    assert Effect.objects.get(key="refund:1").state == State.AWAITING_APPROVAL
    again = _sign(alice, approval, "approve", "really sure")
    assert again.status_code == 409
    assert "must come from someone else" in again.content.decode()
    assert Signoff.objects.filter(approval=approval).count() == 1
    assert Effect.objects.get(key="refund:1").state == State.AWAITING_APPROVAL
    _sign(bob, approval, "approve")
    assert Effect.objects.get(key="refund:1").state == State.PENDING
    assert list(approval.signoffs.values_list("user__username", flat=True)) == ["alice", "bob"]


def test_the_second_person_may_still_deny(api, project, alice, bob):
    _, approval = _ask(api, project, amount="250.00")
    _sign(alice, approval, "approve")
    _sign(bob, approval, "deny", "over budget")
    assert Effect.objects.get(key="refund:1").state == State.DENIED


def test_a_decided_approval_takes_no_more_signatures(api, project, alice, bob):
    _, approval = _ask(api, project)
    _sign(alice, approval, "approve")
    late = _sign(bob, approval, "deny")
    assert late.status_code == 409
    assert "already decided: approved" in late.content.decode()
    assert Effect.objects.get(key="refund:1").state == State.PENDING


def test_a_reason_is_required(api, project, alice):
    _, approval = _ask(api, project)
    assert _sign(alice, approval, "approve", "").status_code == 400
    assert Effect.objects.get().state == State.AWAITING_APPROVAL


def test_viewers_read_approvals_but_cannot_sign_and_strangers_see_nothing(
    api, project, viewer, outsider
):
    _, approval = _ask(api, project)
    page = logged_in(viewer).get(f"/approvals/{approval.pk}/")
    assert (
        page.status_code == 200 and "can read this approval but not decide" in page.content.decode()
    )
    assert _sign(viewer, approval, "approve").status_code == 403
    assert logged_in(outsider).get(f"/approvals/{approval.pk}/").status_code == 404
    assert _sign(outsider, approval, "approve").status_code == 404
    assert Effect.objects.get().state == State.AWAITING_APPROVAL


def test_every_signature_is_audited_with_the_person(api, project, alice, bob):
    _, approval = _ask(api, project, amount="250.00")
    _sign(alice, approval, "approve", "first look")
    _sign(bob, approval, "approve", "second look")
    entries = AuditEntry.objects.filter(effect_id=approval.effect_id).order_by("seq")
    signed = [
        (e.actor, e.data["verdict"], e.data["approvals"])
        for e in entries
        if e.action == "approval_signed"
    ]
    assert signed == [("user:alice", "approve", 1), ("user:bob", "approve", 2)]
    assert [e.action for e in entries][-3:] == ["approval_signed", "approve", "case_closed"]


def test_the_inbox_shows_what_is_asked_by_whom_under_which_grant(
    api, project, alice, django_assert_max_num_queries
):
    for n in range(5):
        _ask(api, project, key=f"refund:{n}")
    client = logged_in(alice)
    with django_assert_max_num_queries(12):
        page = client.get("/approvals/").content.decode()
    assert "Waiting (5)" in page
    assert "refund-bot" in page and "run-7" in page and "refunds" in page
    assert "40.00 EUR" in page


def test_the_approval_page_shows_the_request_and_its_place_in_the_run(api, project, alice):
    _, approval = _ask(api, project, request={"order": "A-17"}, tool_call_id="call_9")
    page = logged_in(alice).get(f"/approvals/{approval.pk}/").content.decode()
    assert "A-17" in page and "call_9" in page and "run-7" in page
    assert "refund-bot" in page


def test_the_approval_links_the_tool_call_and_the_model_run_that_asked(
    api, project, alice, queue, django_capture_on_commit_callbacks
):
    model, tool_span = "1" * 16, "2" * 16
    with django_capture_on_commit_callbacks(execute=True):
        spans = request(otlp.chat(model), otlp.tool(tool_span))
        assert post_traces(api.client, api.key, spans).status_code == 200
        _, approval = _ask(api, project, trace_id=otlp.TRACE, span_id=tool_span)
    work(queue)
    html = logged_in(alice).get(f"/approvals/{approval.pk}/").content.decode()
    trajectory = html[html.index('aria-label="Trajectory"') :]
    assert "execute_tool refund" in trajectory and tool_span in trajectory
    assert "chat gpt-4o" in trajectory and model in trajectory


def test_the_approval_page_shows_the_request_and_context_as_json(api, project, alice):
    _, approval = _ask(api, project, request={"environment": "production", "dry_run": False})
    page = logged_in(alice).get(f"/approvals/{approval.pk}/").content.decode()
    shown = [unescape(t) for t in re.findall(r'<pre class="json">(.*?)</pre>', page, re.S)]
    assert json.loads(shown[0]) == {"environment": "production", "dry_run": False}
    assert json.loads(shown[1]) == {"agent": "refund-bot"}
    assert '"environment": "production"' in shown[0] and "&#x27;environment&#x27;" not in page


def _decided_without_the_approvals_service(api, project) -> Approval:
    """An effect released through the state machine directly (as the demo's seed once did),
    then performed and receipted: its approval was never signed."""
    _, approval = _ask(api, project)
    settling.effect_approval_decide(
        project=project, effect_id=approval.effect_id, actor="user:ada", approve=True, note="ok"
    )
    api.intent("refund:1", **under(approval.grant, "40.00"))
    api.receipt("refund:1", "re_1")
    assert Effect.objects.get(key="refund:1").state == State.SUCCEEDED
    approval.refresh_from_db()
    return approval


def test_an_approval_whose_effect_was_decided_without_it_is_closed_and_says_why(
    api, project, alice
):
    approval = _decided_without_the_approvals_service(api, project)
    assert approval.status == "closed" and approval.decided is not None
    client = logged_in(alice)
    inbox = client.get("/approvals/").content.decode()
    assert "Waiting (0)" in inbox
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "closed: the effect was settled without it" in page and "now succeeded" in page
    assert "Sign</button>" not in page


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_signing_a_stale_approval_is_a_clear_409_never_a_500(api, project, alice, verdict):
    approval = _decided_without_the_approvals_service(api, project)
    # Also a row left open by a version that did not close it.
    Approval.objects.filter(pk=approval.pk).update(status="open", decided=None)
    response = _sign(alice, approval, verdict)
    assert response.status_code == 409
    page = response.content.decode()
    assert f"Approval {approval.pk} is closed: the effect was settled without it" in page
    assert 'role="alert"' in page
    approval.refresh_from_db()
    assert approval.status == "closed" and approval.decided is not None
    assert not approval.signoffs.exists()
    assert Effect.objects.get(key="refund:1").state == State.SUCCEEDED
    assert _sign(alice, approval, verdict).status_code == 409
