"""POST /api/v1/failures and /api/v1/timeouts, and deadlines: when the outcome is not known."""

from __future__ import annotations

from datetime import timedelta

from durability.ledger import evidence
from durability.models import AuditEntry, Case, Effect, State
from tests.ledger.support import effect_in, later, row_counts


def test_a_definitive_failure_makes_the_effect_failed_without_a_case(api):
    api.intent("k1")
    r = api.failure("k1", error="card_declined", definitive=True)
    assert r.status_code == 200
    body = r.json()
    assert (body["effect"]["state"], body["changed"], body["case"]) == ("failed", True, None)
    entry = AuditEntry.objects.get(action="failure")
    assert (entry.from_state, entry.to_state, entry.data) == (
        "pending",
        "failed",
        {"error": "card_declined"},
    )
    assert not Case.objects.exists()


def test_an_uncertain_failure_times_the_effect_out_and_opens_an_uncertain_case(api):
    api.intent("k1")
    r = api.failure("k1", error="connection reset", definitive=False)
    assert r.status_code == 200
    body = r.json()
    assert (body["effect"]["state"], body["changed"]) == ("timed_out", True)
    assert (body["case"]["reason"], body["case"]["severity"]) == ("uncertain", "high")
    assert "connection reset" in body["case"]["summary"]


def test_a_failure_is_uncertain_unless_it_says_definitive(api):
    api.intent("k1")
    r = api.post("failures", {"key": "k1", "error": "HTTP 504"})
    assert r.json()["effect"]["state"] == "timed_out"


def test_a_long_error_is_cut_in_the_summary_and_kept_whole_in_the_case(api):
    api.intent("k1")
    error = "x" * 4000
    case = Case.objects.get(pk=api.failure("k1", error=error).json()["case"]["id"])
    assert len(case.summary) < 300
    assert case.detail["error"] == error


def test_a_reported_timeout_times_the_effect_out_with_an_uncertain_case(api):
    api.intent("k1")
    r = api.timeout("k1", reason="no answer in 30s")
    assert r.status_code == 200
    body = r.json()
    assert (body["effect"]["state"], body["changed"]) == ("timed_out", True)
    assert body["case"]["reason"] == "uncertain"
    assert "no answer in 30s" in body["case"]["summary"]
    assert Case.objects.get(reason="uncertain").detail["cause"] == "timeout"


def test_timing_out_twice_is_a_no_op_that_answers_with_the_open_case(api):
    api.intent("k1")
    first = api.timeout("k1").json()
    counts = row_counts()
    again = api.timeout("k1", reason="still nothing")
    assert again.status_code == 200
    assert again.json()["changed"] is False
    assert again.json()["case"]["id"] == first["case"]["id"]
    assert row_counts() == counts


def test_a_timeout_cannot_undo_a_receipt(api):
    api.intent("k1")
    api.receipt("k1")
    r = api.timeout("k1")
    assert r.status_code == 409
    assert "succeeded" in r.json()["error"]
    assert Effect.objects.get().state == "succeeded"


def test_after_a_timeout_an_irreversible_effect_waits_for_a_person(api):
    api.intent("k1", replay="never")
    case = api.timeout("k1").json()["case"]
    r = api.intent("k1", replay="never")
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "wait"
    assert body["case"]["id"] == case["id"]
    assert "forbids a blind retry" in body["reason"]
    assert Effect.objects.get().attempt_count == 1


def test_after_a_timeout_a_reconcile_effect_waits_for_the_reconciler(api):
    api.intent("k1", replay="reconcile")
    api.timeout("k1")
    assert api.intent("k1", replay="reconcile").json()["decision"] == "wait"


def test_an_intent_with_a_timeout_gets_a_deadline_on_the_effect_and_the_attempt(api):
    body = api.intent("k1", timeout_s=30).json()
    effect = Effect.objects.get()
    attempt = effect.attempts.get()
    assert effect.deadline is not None and effect.deadline == attempt.deadline
    assert timedelta(seconds=29) < effect.deadline - attempt.started <= timedelta(seconds=30)
    assert body["effect"]["deadline"] == effect.deadline.isoformat()


def test_the_sweep_times_out_only_pending_effects_past_their_deadline(project):
    effect_in(project, State.PENDING, key="due", timeout_s=30)
    effect_in(project, State.PENDING, key="not-yet", timeout_s=300)
    effect_in(project, State.SUCCEEDED, key="done", timeout_s=30)
    moved = evidence.deadlines_sweep(now=later(60))
    assert [e.key for e in moved] == ["due"]
    states = dict(Effect.objects.values_list("key", "state"))
    assert states == {"due": "timed_out", "not-yet": "pending", "done": "succeeded"}
    case = Case.objects.select_related("effect").get(reason="uncertain")
    assert case.effect is not None
    assert (case.effect.key, case.reason, case.detail["cause"]) == ("due", "uncertain", "deadline")


def test_reports_about_another_projects_effect_are_404(api, other_api):
    api.intent("k1")
    assert other_api.timeout("k1").status_code == 404
    assert other_api.failure("k1", definitive=True).status_code == 404
    assert Effect.objects.get().state == "pending"
