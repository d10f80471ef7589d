"""What else the search finds: a run id finds the run's effects and cases, not only the run;
a verdict's reason, a comment and an approval's sign-off reason are searchable; approvals
are a kind of result."""

from __future__ import annotations

from durability.desk import case_actions
from durability.models import Approval
from tests.authority.support import grant, under
from tests.desk.support import logged_in, uncertain_case
from tests.search.support import found, run


def test_a_run_id_finds_the_runs_effects_and_cases(alice, project):
    case = uncertain_case(project, "refund:7", run_id="run-7f3a")
    uncertain_case(project, "refund:8", run_id="run-other")
    run(project, "run-7f3a", "a" * 32)

    groups = found(logged_in(alice), "run-7f3a")

    assert groups["runs"] == ["run-7f3a"]
    assert groups["effects"] == ["refund:7"]
    assert groups["cases"] == [f"#{case.pk} uncertain"]


def test_a_verdicts_reason_and_a_comment_find_their_cases(alice, project):
    settled = uncertain_case(project, "refund:1")
    talked = uncertain_case(project, "refund:2")
    case_actions.case_resolve(
        project=project,
        case_id=settled.pk,
        version=settled.version,
        actor="user:alice",
        verdict=case_actions.Verdict.NOT_HAPPENED,
        note="Stripe dashboard shows no charge for Mrs Okonkwo",
    )
    case_actions.case_comment(
        project=project, case_id=talked.pk, actor="user:alice", body="waiting on the Zendesk ticket"
    )
    client = logged_in(alice)

    assert found(client, "okonkwo")["cases"] == [f"#{settled.pk} uncertain"]
    assert found(client, "zendesk")["cases"] == [f"#{talked.pk} uncertain"]
    html = client.get("/search/", {"q": "zendesk"}).content.decode()
    assert "matched its comment" in html


def test_approvals_are_found_by_their_effect_and_by_a_sign_off_reason(api, alice, project):
    g = grant(project, name="refunds", currency="EUR", max_amount="1000", requires_approval=True)
    api.intent("refund:H-112", **under(g, "40.00"))
    approval = Approval.objects.get(effect__key="refund:H-112")
    r = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/",
        {"verdict": "approve", "reason": "customer called the hotline twice"},
    )
    assert r.status_code in (200, 302, 303)
    client = logged_in(alice)

    assert found(client, "refund:H-112")["approvals"] == [f"#{approval.pk} refund:H-112"]
    assert found(client, "hotline")["approvals"] == [f"#{approval.pk} refund:H-112"]
    assert "matched its sign-off" in client.get("/search/", {"q": "hotline"}).content.decode()
