"""A receipt that arrives before its intent: adopted, it passes the evidence checks of a
receipt that came after its intent, and the agent is never told to perform it again."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from durability.models import Approval, Case, Effect, Project, Receipt, Role, State
from tests.authority.support import grant, under
from tests.desk.support import logged_in, member
from tests.ledger.support import cases_asked, needs_approval, refusing

ORDERS = ["intent first", "receipt first"]


@pytest.fixture
def alice(project: Project) -> User:
    return member(project, "alice", Role.OPERATOR)


def _both_orders(api: Any, order: str, intent: dict[str, Any], receipt: dict[str, Any]) -> Any:
    """Send an intent and its receipt in `order`; the intent's answer."""
    if order == "receipt first":
        api.receipt("k1", "re_1", **receipt)
        return api.intent("k1", **intent).json()
    answer = api.intent("k1", **intent).json()
    api.receipt("k1", "re_1", **receipt)
    return answer


def _open_cases() -> set[tuple[str, str]]:
    return {(c.reason, c.get_severity_display()) for c in Case.objects.filter(closed=None)}


@pytest.mark.parametrize("order", ORDERS)
def test_evidence_beyond_its_grant_opens_authority_exceeded_in_either_order(api, project, order):
    g = grant(project, name="payments", currency="EUR", max_amount="100")
    over = {"amount": {"value": "900", "currency": "EUR"}}

    _both_orders(api, order, under(g, "50"), over)

    # Received first, the receipt's 900 EUR also disputes the intent's 50: its case stays.
    disputed = {("orphan_receipt", "high")} if order == "receipt first" else set()
    assert _open_cases() == {("authority_exceeded", "critical")} | disputed
    case = Case.objects.get(reason="authority_exceeded")
    assert set(case.detail["rules"]) == {"max_amount", "intent_amount"}
    assert Effect.objects.get().state == State.SUCCEEDED


@pytest.mark.parametrize("order", ORDERS)
def test_evidence_with_no_grant_opens_no_case_under_the_audit_policy_in_either_order(api, order):
    _both_orders(api, order, {"authority": None}, {})
    # The orphan case (receipt first) closes: the intent arrived and agrees with it.
    assert _open_cases() == set()
    assert Effect.objects.get().state == State.SUCCEEDED


@pytest.mark.parametrize("order", ORDERS)
def test_evidence_with_no_grant_rises_to_high_when_the_project_asks_for_cases(api, project, order):
    cases_asked(project)
    _both_orders(api, order, {"authority": None}, {})
    assert _open_cases() == {("unauthorized_effect", "high")}


@pytest.mark.parametrize("order", ORDERS)
def test_evidence_for_an_effect_awaiting_approval_is_unauthorized_in_either_order(
    api, project, order
):
    body = _both_orders(api, order, {"authority": {"grant": needs_approval(project).pk}}, {})
    assert body["decision"] == "wait"
    assert _open_cases() == {("approval_required", "medium"), ("unauthorized_effect", "critical")}
    assert Effect.objects.get().state == State.AWAITING_APPROVAL


@pytest.mark.parametrize("order", ORDERS)
def test_approving_an_effect_whose_receipt_is_on_record_completes_it_never_proceed(
    api, project, alice, order
):
    _both_orders(api, order, {"authority": {"grant": needs_approval(project).pk}}, {})
    approval = Approval.objects.get()

    signed = logged_in(alice).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "looks right"}
    )

    assert signed.status_code == 302
    assert Effect.objects.get().state == State.SUCCEEDED
    assert api.get("effects", key="k1").json()["decision"] == "completed"
    body = api.intent("k1", authority={"grant": approval.grant_id}).json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == "re_1"
    assert Effect.objects.get().attempt_count == 0
    assert ("unauthorized_effect", "critical") in _open_cases()


def test_the_orphan_case_closes_on_the_effect_when_an_intent_awaiting_approval_adopts_it(
    api, project
):
    orphan = api.receipt("k1", "re_1").json()
    body = api.intent("k1", authority={"grant": needs_approval(project).pk}).json()
    assert body["receipt"]["id"] == orphan["receipt"]["id"]
    assert "already happened" in body["reason"]
    effect = Effect.objects.get()
    assert Receipt.objects.get().effect == effect
    case = Case.objects.get(pk=orphan["case"]["id"])
    assert case.effect == effect and case.closed is not None


def test_evidence_for_a_denied_effect_is_adopted_and_unauthorized(api, project):
    api.receipt("k1", "re_1")
    body = api.intent("k1", authority={"grant": refusing(project).pk}).json()
    assert body["decision"] == "denied"
    assert Receipt.objects.get().effect_id == body["effect"]["id"]
    assert _open_cases() == {("authority_denied", "medium"), ("unauthorized_effect", "critical")}


def test_two_orphan_receipts_with_different_ids_are_a_duplicate_effect(api):
    api.receipt("k1", "re_1")
    api.receipt("k1", "re_2")
    body = api.intent("k1").json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == "re_1"
    assert _open_cases() == {("duplicate_effect", "critical")}
    assert Receipt.objects.filter(effect=None).count() == 0
    duplicate = Case.objects.get(reason="duplicate_effect")
    first = Receipt.objects.get(external_id="re_1")
    assert duplicate.detail["first"] == first.pk
    assert "differs from the first (stripe:re_1)" in duplicate.summary


def test_an_orphan_receipt_that_disagrees_with_the_later_intent_keeps_its_case_open(api, alice):
    orphan = api.receipt(
        "k1", "re_1", data={"order": "o-1", "amount": 50}, amount={"value": "50", "currency": "EUR"}
    ).json()

    body = api.intent(
        "k1",
        request={"order": "o-1", "amount": 900},
        amount={"value": "900", "currency": "EUR"},
    ).json()

    assert body["decision"] == "completed"
    case = Case.objects.get(pk=orphan["case"]["id"])
    assert body["case"]["id"] == case.pk
    assert case.closed is None and case.effect_id == body["effect"]["id"]
    assert case.detail["differs"] == {
        "amount": ["900.00 EUR", "50.00 EUR"],
        "request.amount": [900, 50],
    }
    assert "disagrees" in case.summary
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    assert "data-differs" in page and "request.amount" in page


def test_an_orphan_receipt_that_agrees_with_the_later_intent_closes_its_case(api):
    orphan = api.receipt("k1", "re_1", data={"order": "o-1", "id": "re_1"}).json()
    api.intent("k1", request={"order": "o-1", "amount": 1})
    case = Case.objects.get(pk=orphan["case"]["id"])
    assert case.closed is not None and "differs" not in case.detail


def test_two_disputed_orphan_receipts_leave_one_open_case_on_the_effect(api):
    for external_id in ("re_1", "re_2"):
        api.receipt("k1", external_id, data={"amount": 50})
    api.intent("k1", request={"amount": 900})
    effect = Effect.objects.get()
    disputed = Case.objects.get(effect=effect, reason="orphan_receipt", closed=None)
    assert disputed.detail["differs"] == {"request.amount": [900, 50]}
    assert [r["differs"] for r in disputed.detail["repeats"]] == [{"request.amount": [900, 50]}]
    assert Case.objects.filter(effect=effect, reason="orphan_receipt").count() == 2


def test_an_acknowledged_orphan_case_is_named_by_the_effect_that_adopts_it(api, project, alice):
    orphan = api.receipt("k1", "re_1").json()
    case = Case.objects.get(pk=orphan["case"]["id"])
    logged_in(alice).post(
        f"/cases/{case.pk}/resolve/",
        {"verdict": "acknowledge", "note": "we know", "version": case.version},
    )
    case.refresh_from_db()
    assert case.closed is not None

    api.intent("k1")

    case.refresh_from_db()
    assert case.effect == Effect.objects.get() and case.resolution.actor == "user:alice"
