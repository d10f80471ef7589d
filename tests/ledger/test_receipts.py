"""POST /api/v1/receipts: evidence that an effect happened, and what it settles."""

from __future__ import annotations

from datetime import UTC, datetime

from durability.accounts import members
from durability.audit import first_broken_entry
from durability.models import AuditEntry, AuthorityPolicy, Case, Effect, Receipt, State
from tests.ledger.support import OPERATOR, effect_in, row_counts


def test_a_receipt_for_a_pending_effect_settles_it_as_succeeded(api):
    effect_id = api.intent("k1").json()["effect"]["id"]
    r = api.receipt("k1", "re_1", attempt=1, trace_id="a" * 32, span_id="b" * 16)
    assert r.status_code == 201
    body = r.json()
    assert body["created"] is True
    assert body["effect"]["state"] == "succeeded" and body["effect"]["late"] is False
    assert body["case"] is None
    assert body["receipt"]["external_id"] == "re_1"
    assert body["receipt"]["strength"] == "agent_reported"
    stored = Receipt.objects.get()
    assert (stored.effect_id, stored.attempt, stored.trace_id, stored.span_id) == (
        effect_id,
        1,
        "a" * 32,
        "b" * 16,
    )


def test_the_same_receipt_twice_is_one_receipt_and_changes_nothing(api):
    api.intent("k1")
    first = api.receipt("k1", "re_1").json()
    counts = row_counts()
    r = api.receipt("k1", "re_1", data={"ignored": True})
    assert r.status_code == 200
    assert r.json()["created"] is False
    assert r.json()["receipt"]["id"] == first["receipt"]["id"]
    assert r.json()["case"] is None
    assert row_counts() == counts


def test_the_external_timestamp_is_kept_and_a_naive_one_is_read_as_utc(api):
    api.intent("k1")
    api.receipt("k1", "re_1", observed_at="2025-03-01T12:00:00")
    assert Receipt.objects.get().observed_at == datetime(2025, 3, 1, 12, tzinfo=UTC)
    api.intent("k2")
    api.receipt("k2", "re_2", observed_at="2025-03-01T12:00:00+02:00")
    assert Receipt.objects.get(key="k2").observed_at == datetime(2025, 3, 1, 10, tzinfo=UTC)


def test_a_late_receipt_succeeds_the_effect_flags_it_and_auto_closes_the_uncertain_case(api):
    api.intent("k1")
    uncertain = api.timeout("k1").json()["case"]
    r = api.receipt("k1", "re_1")
    assert r.status_code == 201
    body = r.json()
    assert body["effect"]["state"] == "succeeded"
    assert body["effect"]["late"] is True and body["receipt"]["late"] is True
    assert body["case"]["reason"] == "late_success"
    assert body["case"]["severity"] == "high"
    closed = Case.objects.get(pk=uncertain["id"])
    assert closed.closed is not None
    assert closed.resolution.action == "auto_resolved"
    assert list(Case.objects.filter(closed=None).values_list("reason", flat=True)) == [
        "late_success"
    ]
    assert api.intent("k1").json()["decision"] == "completed"


def test_a_receipt_after_a_definitive_failure_is_a_late_success_too(api, project):
    effect_in(project, State.FAILED)
    body = api.receipt("k1", "re_1").json()
    assert (body["effect"]["state"], body["effect"]["late"]) == ("succeeded", True)
    assert body["case"]["reason"] == "late_success"
    assert "recorded as failed" in body["case"]["summary"]


def test_a_second_receipt_with_another_external_id_opens_a_critical_duplicate_effect_case(api):
    api.intent("k1")
    api.receipt("k1", "re_1")
    r = api.receipt("k1", "re_2")
    assert r.status_code == 201
    body = r.json()
    assert body["effect"]["state"] == "succeeded"
    assert body["case"]["reason"] == "duplicate_effect"
    assert body["case"]["severity"] == "critical"
    assert "re_2" in body["case"]["summary"] and "re_1" in body["case"]["summary"]
    assert Receipt.objects.filter(key="k1").count() == 2


def test_a_third_receipt_adds_to_the_open_duplicate_case_instead_of_opening_another(api):
    api.intent("k1")
    for external_id in ("re_1", "re_2", "re_3"):
        api.receipt("k1", external_id)
    case = Case.objects.get(reason="duplicate_effect")
    assert case.closed is None
    assert len(case.detail["repeats"]) == 1
    assert case.version == 2


def test_a_receipt_for_a_compensated_effect_is_a_duplicate_effect(api, project):
    effect_in(project, State.COMPENSATED)
    body = api.receipt("k1", "re_again").json()
    assert body["effect"]["state"] == "compensated"
    assert body["case"]["reason"] == "duplicate_effect"


def test_a_receipt_for_an_effect_with_no_authority_is_an_unauthorized_effect(api, project):
    for state in (State.AWAITING_APPROVAL, State.DENIED):
        effect_in(project, state, key=state)
        body = api.receipt(state, "re_1").json()
        assert body["effect"]["state"] == state
        assert (body["case"]["reason"], body["case"]["severity"]) == (
            "unauthorized_effect",
            "critical",
        )


def test_a_receipt_for_an_ungranted_effect_opens_no_case_under_the_audit_policy(api, project):
    api.intent("k1", authority=None)
    body = api.receipt("k1", "re_1").json()
    assert body["effect"]["state"] == "succeeded" and body["case"] is None
    assert not Case.objects.exists()


def test_a_receipt_for_an_ungranted_effect_is_unauthorized_once_the_policy_is_enforce(api, project):
    api.intent("k1", authority=None)
    members.project_policy_set(project=project, actor=OPERATOR, policy=AuthorityPolicy.ENFORCE)
    body = api.receipt("k1", "re_1").json()
    assert body["effect"]["state"] == "succeeded"
    assert (body["case"]["reason"], body["case"]["severity"]) == ("unauthorized_effect", "high")


def test_a_receipt_for_an_unknown_key_is_stored_and_opens_an_orphan_receipt_case(api):
    r = api.receipt("nobody-asked", "re_1")
    assert r.status_code == 201
    body = r.json()
    assert body["effect"] is None
    assert body["case"]["reason"] == "orphan_receipt"
    assert Receipt.objects.get().effect is None
    assert not Effect.objects.exists()


def test_a_later_intent_for_an_orphan_key_is_told_completed_and_adopts_the_receipt(api):
    orphan = api.receipt("k1", "re_1").json()
    r = api.intent("k1")
    assert r.status_code == 201
    body = r.json()
    assert body["decision"] == "completed"
    assert body["effect"]["state"] == "succeeded"
    assert body["receipt"]["id"] == orphan["receipt"]["id"]
    assert "do not repeat" in body["reason"]
    assert Receipt.objects.get().effect_id == body["effect"]["id"]
    # The case's question, which effect the receipt belongs to, is answered.
    case = Case.objects.get(pk=orphan["case"]["id"])
    assert case.effect_id == body["effect"]["id"]
    assert case.closed is not None and case.resolution.action == "auto_resolved"
    assert api.intent("k1").json()["decision"] == "completed"


def test_a_receipt_in_another_project_never_touches_this_projects_effect(api, other_api):
    api.intent("k1")
    body = other_api.receipt("k1", "re_1").json()
    assert body["effect"] is None and body["case"]["reason"] == "orphan_receipt"
    assert Effect.objects.get(key="k1").state == "pending"


def test_every_receipt_leaves_the_audit_chain_intact(api, project):
    api.receipt("k0", "re_0")
    api.intent("k0")
    api.intent("k1")
    api.timeout("k1")
    api.receipt("k1", "re_1")
    api.receipt("k1", "re_2")
    assert AuditEntry.objects.filter(action="receipt").count() == 4
    assert first_broken_entry(project) is None
