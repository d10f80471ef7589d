"""The grant check at intent time: proceed, wait for approval, or denied naming the rule."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability.accounts import members
from durability.authority import grants
from durability.models import (
    AuditAction,
    AuditEntry,
    AuthorityPolicy,
    Case,
    Effect,
    Project,
    State,
)
from tests.authority.support import grant, supersede, under
from tests.ledger import support as ledger


def _denied(body: dict[str, Any], rule: str) -> None:
    assert body["decision"] == "denied", body["reason"]
    assert f"rule `{rule}`" in body["reason"]
    assert body["effect"]["state"] == "denied"
    assert body["case"]["reason"] == "authority_denied"
    assert f"rule `{rule}`" in body["case"]["summary"]


def test_an_intent_under_a_live_grant_proceeds_and_records_the_grant_it_used(api, project):
    g = grant(project, kinds=["payment"], targets=["stripe"])
    r = api.intent("k1", **under(g))
    assert r.status_code == 201
    body = r.json()
    assert body["decision"] == "proceed" and body["case"] is None
    effect = Effect.objects.get(key="k1")
    assert effect.grant == g and effect.state == State.PENDING
    assert not Case.objects.exists()


def test_an_intent_naming_no_grant_proceeds_under_the_audit_policy_with_no_case(api, project):
    assert project.authority_policy == AuthorityPolicy.AUDIT
    body = api.intent("k1", authority=None).json()
    assert body["decision"] == "proceed" and body["case"] is None
    assert "audit policy" in body["reason"] and "authority report" in body["reason"]
    assert not Case.objects.exists()
    # The evidence is the effect row, and the intent's audit entry names the policy.
    effect = Effect.objects.get()
    assert effect.grant is None and effect.state == State.PENDING
    entry = AuditEntry.objects.get(effect=effect, action=AuditAction.INTENT)
    assert entry.data["policy"] == "audit"


def test_an_intent_naming_no_grant_is_flagged_when_the_project_asks_for_cases(api, project):
    members.project_policy_set(
        project=project, actor="user:ada", policy=AuthorityPolicy.AUDIT_CASES
    )
    body = api.intent("k1", authority=None).json()
    assert body["decision"] == "proceed" and body["case"] is None
    assert "opens a case" in body["reason"]
    case = Case.objects.get()
    assert (case.reason, case.get_severity_display()) == ("unauthorized_effect", "low")
    assert case.detail["policy"] == "audit_cases"


def _statements(api: Any, key: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert api.intent(key, authority=None).json()["decision"] == "proceed"
    return [q["sql"] for q in captured.captured_queries]


def test_an_ungranted_intent_under_the_audit_policy_writes_no_case_and_two_statements_less(
    api, project
):
    api.intent("warm-up", authority=None)
    audit = _statements(api, "k1")
    assert not [sql for sql in audit if "durability_case" in sql]
    members.project_policy_set(
        project=project, actor="user:ada", policy=AuthorityPolicy.AUDIT_CASES
    )
    api.intent("warm-up-2", authority=None)
    with_cases = _statements(api, "k2")
    # The open case looked up and the case inserted; its audit entry goes with the other
    # writes, in their one statement (durability.rows.Writes).
    assert len(with_cases) - len(audit) == 2
    assert [sql for sql in with_cases if sql.startswith('INSERT INTO "durability_case"')]


def test_an_intent_naming_no_grant_is_denied_under_the_enforce_policy(api, project):
    members.project_policy_set(project=project, actor="user:ada", policy=AuthorityPolicy.ENFORCE)
    r = api.intent("k1", authority=None)
    assert r.status_code == 201
    _denied(r.json(), "no_grant")
    assert Effect.objects.get().attempt_count == 0


def test_a_grant_of_another_project_or_none_at_all_is_unknown(api, project):
    elsewhere = grant(Project.objects.create(name="beta"))
    _denied(api.intent("k1", authority={"grant": elsewhere.pk}).json(), "unknown_grant")
    _denied(api.intent("k2", authority={"grant": 999_999}).json(), "unknown_grant")


def test_a_grant_id_that_is_not_a_positive_integer_is_a_400_and_nothing_is_stored(api):
    for bad in ("refunds", 0, -1, 1.5, True):
        r = api.intent("k1", authority={"grant": bad})
        assert r.status_code == 400, bad
        assert "authority" in r.json()["fields"]
    assert not Effect.objects.exists()


def test_a_revoked_grant_is_denied(api, project):
    g = grant(project)
    grants.grant_revoke(grant=g, actor="user:ada", note="compromised key")
    _denied(api.intent("k1", **under(g)).json(), "revoked")


def test_an_expired_grant_is_denied(api, project):
    g = grant(project, expires=timezone.now() - timedelta(seconds=1))
    _denied(api.intent("k1", **under(g)).json(), "expired")


def test_a_grant_for_another_agent_or_workflow_is_denied(api, project):
    g = grant(project, principal="refund-*")
    body = api.intent("k1", context={"workflow": "support-bot"}, **under(g)).json()
    _denied(body, "principal")
    assert "'support-bot'" in body["reason"]
    _denied(api.intent("k2", **under(g)).json(), "principal")
    assert api.intent("k3", context={"agent": "refund-bot"}, **under(g)).json()["decision"] == (
        "proceed"
    )
    ok = api.intent("k4", context={"workflow": "refund-v2"}, **under(g)).json()
    assert ok["decision"] == "proceed"


def test_a_kind_or_target_outside_the_grant_is_denied(api, project):
    g = grant(project, kinds=["email.*"], targets=["ses", "smtp:*"])
    _denied(api.intent("k1", kind="payment", target="ses", **under(g)).json(), "kind")
    _denied(api.intent("k2", kind="email.send", target="stripe", **under(g)).json(), "target")
    body = api.intent("k3", kind="email.send", target="smtp:eu", **under(g)).json()
    assert body["decision"] == "proceed"


def test_a_grant_with_amount_limits_denies_an_intent_without_an_amount(api, project):
    g = grant(project, currency="EUR", max_amount="100")
    _denied(api.intent("k1", **under(g)).json(), "amount_missing")


def test_an_amount_in_another_currency_is_denied(api, project):
    g = grant(project, currency="EUR", max_amount="100")
    _denied(api.intent("k1", **under(g, "10.00", "USD")).json(), "currency")


def test_an_amount_over_the_per_effect_limit_is_denied(api, project):
    g = grant(project, currency="EUR", max_amount="100")
    assert api.intent("k1", **under(g, "100.00")).json()["decision"] == "proceed"
    body = api.intent("k2", **under(g, "100.01")).json()
    _denied(body, "max_amount")
    assert "100.01 EUR is over its limit of 100.00 EUR per effect" in body["reason"]


def test_the_daily_limit_counts_every_version_and_only_effects_that_may_have_happened(api, project):
    g = grant(project, currency="EUR", max_daily_amount="100")
    assert api.intent("a", **under(g, "60")).json()["decision"] == "proceed"
    # A version with a new name shares the lineage, and so the day's spending.
    v2 = supersede(g, name="renamed")
    _denied(api.intent("b", **under(v2, "50")).json(), "daily_amount")
    # A failed attempt spent nothing: its amount no longer counts.
    ledger.failure(project, "a", definitive=True)
    assert api.intent("c", **under(v2, "50")).json()["decision"] == "proceed"
    # Spending older than 24 hours no longer counts either.
    Effect.objects.filter(key="c").update(created=timezone.now() - timedelta(hours=25))
    assert api.intent("d", **under(v2, "100")).json()["decision"] == "proceed"


def test_the_count_limit_denies_the_effect_beyond_it_in_its_period(api, project):
    g = grant(project, max_count=2, count_period_s=3600)
    assert api.intent("a", **under(g)).json()["decision"] == "proceed"
    assert api.intent("b", **under(g)).json()["decision"] == "proceed"
    body = api.intent("c", **under(g)).json()
    _denied(body, "count")
    assert "2 effects in the last 3600 s reach its limit of 2" in body["reason"]
    Effect.objects.filter(key="a").update(created=timezone.now() - timedelta(hours=2))
    assert api.intent("d", **under(g)).json()["decision"] == "proceed"


def test_an_intent_naming_a_superseded_version_is_checked_against_the_current_one(api, project):
    v1 = grant(project, targets=["stripe"])
    v2 = supersede(v1, targets=["adyen"])
    body = api.intent("k1", target="stripe", **under(v1)).json()
    _denied(body, "target")
    assert f"Grant {v2.pk}" in body["reason"]
    assert api.intent("k2", target="adyen", **under(v1)).json()["decision"] == "proceed"
    assert Effect.objects.get(key="k2").grant == v2


def test_asking_again_for_a_denied_effect_gives_the_same_denial(api, project):
    g = grant(project, kinds=["email"])
    first = api.intent("k1", **under(g)).json()
    again = api.intent("k1", **under(g))
    assert again.status_code == 200
    assert again.json()["decision"] == "denied"
    assert again.json()["reason"] == first["reason"]
    detail = api.get("effects", key="k1").json()
    assert (detail["decision"], detail["reason"]) == ("denied", first["reason"])


def test_the_denial_is_audited_with_the_rule_and_the_grant(api, project):
    g = grant(project, kinds=["email"])
    api.intent("k1", **under(g))
    entry = ledger.audit_of(Effect.objects.get(key="k1"))[0]
    assert (entry.action, entry.to_state) == ("refuse", "denied")
    assert entry.data["grant"] == g.pk and entry.data["rule"] == "kind"


@pytest.mark.django_db(transaction=True)
def test_concurrent_intents_under_a_count_limit_never_exceed_it(project):
    g = grant(project, max_count=3, count_period_s=3600)
    barrier = threading.Barrier(10)
    decisions: list[str] = []

    def ask(n: int) -> None:
        try:
            barrier.wait(timeout=60)
            decisions.append(ledger.intent(project, f"k{n}", **under(g)).decision)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "an intent did not return"
    assert sorted(decisions) == ["denied"] * 7 + ["proceed"] * 3
    assert Effect.objects.filter(state=State.PENDING).count() == 3
