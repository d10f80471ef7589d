"""Asking again: retries where they are safe, waiting where they are not, resumed attempts."""

from __future__ import annotations

import pytest

from durability.models import Attempt, Case, Effect, State
from tests.ledger.support import effect_in

CONTEXT = {"workflow": "refunds", "workflow_version": "2.3.0", "model": "m-1"}


@pytest.mark.parametrize("state", [State.FAILED, State.NOT_HAPPENED])
def test_an_effect_that_did_not_happen_gets_a_new_attempt(api, project, state):
    effect_in(project, state, timeout_s=30)
    r = api.intent("k1", timeout_s=30, run_id="run-2", worker="w2")
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "proceed"
    assert (body["effect"]["state"], body["effect"]["attempt"]) == ("pending", 2)
    assert body["reason"].startswith("Attempt 2")
    first, second = Attempt.objects.filter(effect__key="k1").order_by("number")
    assert (second.run_id, second.worker) == ("run-2", "w2")
    assert second.deadline == Effect.objects.get().deadline
    assert first.deadline and second.deadline and second.deadline > first.deadline


@pytest.mark.parametrize("replay", ["safe", "idempotent"])
def test_a_timed_out_effect_whose_replay_allows_it_is_retried_and_its_case_closed(
    api, project, replay
):
    effect_in(project, State.TIMED_OUT, replay=replay)
    r = api.intent("k1", replay=replay)
    body = r.json()
    assert body["decision"] == "proceed"
    assert (body["effect"]["state"], body["effect"]["attempt"]) == ("pending", 2)
    uncertain = Case.objects.get(reason="uncertain")
    assert uncertain.closed is not None and uncertain.resolution.action == "retried"


@pytest.mark.parametrize("replay", ["never", "reconcile"])
def test_a_timed_out_effect_whose_replay_forbids_it_waits(api, project, replay):
    effect_in(project, State.TIMED_OUT, replay=replay)
    body = api.intent("k1", replay=replay).json()
    assert body["decision"] == "wait"
    assert body["case"]["reason"] == "uncertain"
    assert Effect.objects.get().state == "timed_out"
    assert Attempt.objects.count() == 1


def test_a_retry_is_answered_proceed_only_once(api, project):
    effect_in(project, State.FAILED)
    assert api.intent("k1").json()["decision"] == "proceed"
    again = api.intent("k1").json()
    assert again["decision"] == "wait"
    assert again["effect"]["attempt"] == 2


def test_a_retry_under_another_context_opens_a_low_version_drift_case(api, project):
    effect_in(project, State.FAILED, context=CONTEXT)
    newer = {**CONTEXT, "workflow_version": "2.4.0", "policy_version": "p7"}
    body = api.intent("k1", context=newer).json()
    assert body["decision"] == "proceed"
    case = Case.objects.get(reason="version_drift")
    assert case.get_severity_display() == "low"
    assert case.detail["changes"] == {
        "policy_version": [None, "p7"],
        "workflow_version": ["2.3.0", "2.4.0"],
    }
    assert "workflow_version" in case.summary and "policy_version" in case.summary


def test_a_retry_under_the_same_context_opens_no_drift_case(api, project):
    effect_in(project, State.FAILED, context=CONTEXT)
    api.intent("k1", context=CONTEXT)
    assert not Case.objects.filter(reason="version_drift").exists()


def test_free_context_keys_count_towards_drift(api, project):
    effect_in(project, State.FAILED, context={**CONTEXT, "region": "eu"})
    api.intent("k1", context={**CONTEXT, "region": "us"})
    assert Case.objects.get(reason="version_drift").detail["changes"] == {"region": ["eu", "us"]}


def test_a_retry_with_another_request_is_a_conflict_not_a_retry(api, project):
    effect_in(project, State.FAILED)
    r = api.intent("k1", request={"amount": 2})
    assert r.status_code == 409
    assert Effect.objects.get().state == "failed"
    assert Attempt.objects.count() == 1


# -- resuming a pending attempt ----------------------------------------------------------


def test_the_same_worker_asking_again_carries_on_with_the_same_attempt(api):
    api.intent("k1", run_id="run-1", worker="w1")
    r = api.intent("k1", run_id="run-1", worker="w1")
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "proceed"
    assert (body["effect"]["state"], body["effect"]["attempt"]) == ("pending", 1)
    assert Attempt.objects.count() == 1
    assert not Case.objects.exists()


def test_the_same_run_in_another_worker_is_an_interruption_with_an_uncertain_case(api):
    api.intent("k1", run_id="run-1", worker="w1")
    r = api.intent("k1", run_id="run-1", worker="w2")
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "wait"
    assert body["effect"]["state"] == "timed_out"
    assert body["case"]["reason"] == "uncertain"
    assert "resumed" in body["case"]["summary"]
    assert Case.objects.get(reason="uncertain").detail["cause"] == "interruption"
    assert Attempt.objects.count() == 1


def test_an_interrupted_attempt_whose_replay_allows_it_is_retried_at_once(api):
    api.intent("k1", run_id="run-1", worker="w1", replay="safe")
    body = api.intent("k1", run_id="run-1", worker="w2", replay="safe").json()
    assert body["decision"] == "proceed"
    assert (body["effect"]["state"], body["effect"]["attempt"]) == ("pending", 2)
    uncertain = Case.objects.get(reason="uncertain")
    assert uncertain.resolution.action == "retried"
    assert Attempt.objects.get(number=2).worker == "w2"


def test_another_run_asking_about_a_pending_effect_waits(api):
    api.intent("k1", run_id="run-1", worker="w1")
    body = api.intent("k1", run_id="run-2", worker="w2").json()
    assert body["decision"] == "wait"
    assert body["effect"]["state"] == "pending"
    assert not Case.objects.exists()


def test_the_same_run_without_a_worker_identity_waits_rather_than_guess(api):
    # Without worker identities a resent request and a resumed process look the same.
    api.intent("k1", run_id="run-1")
    body = api.intent("k1", run_id="run-1").json()
    assert body["decision"] == "wait"
    assert body["effect"]["state"] == "pending"
    assert not Case.objects.exists()
