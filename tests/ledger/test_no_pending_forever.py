"""No attempt stays pending for ever: every attempt has a deadline (the intent's timeout, else
the project's), and the same tool call asked again by a resumed run under another key puts
the earlier attempt in doubt."""

from __future__ import annotations

from datetime import timedelta

from durability.accounts import members
from durability.ledger import evidence
from durability.models import (
    DEFAULT_EFFECT_TIMEOUT_S,
    Attempt,
    AuditEntry,
    AuthorityPolicy,
    Case,
    Decision,
    Effect,
    State,
)
from tests.ledger.support import OPERATOR, intent, receipt


def test_an_intent_declaring_no_timeout_gets_the_projects_deadline(project):
    outcome = intent(project, "k1", run_id="run-1", worker="w1")

    effect = Effect.objects.get(pk=outcome.effect.pk)
    assert effect.timeout_s == DEFAULT_EFFECT_TIMEOUT_S
    attempt = Attempt.objects.get(effect=effect)
    assert effect.deadline == attempt.started + timedelta(seconds=DEFAULT_EFFECT_TIMEOUT_S)

    # Past it, the sweep times the attempt out with an uncertain case.
    moved = evidence.deadlines_sweep(now=effect.deadline + timedelta(seconds=1))
    assert [e.pk for e in moved] == [effect.pk]
    effect.refresh_from_db()
    assert effect.state == State.TIMED_OUT
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()


def test_a_project_sets_its_own_default_timeout_and_the_audit_says_so(project):
    changed = members.project_policy_set(
        project=project, actor=OPERATOR, policy=AuthorityPolicy.AUDIT, timeout_s=120
    )

    assert changed
    entry = AuditEntry.objects.get(project=project, action="effect_timeout_set")
    assert entry.data == {"was": DEFAULT_EFFECT_TIMEOUT_S, "timeout_s": 120}
    effect = Effect.objects.get(pk=intent(project, "k1").effect.pk)
    assert effect.timeout_s == 120
    declared = Effect.objects.get(pk=intent(project, "k2", timeout_s=30).effect.pk)
    assert declared.timeout_s == 30


def test_the_same_tool_call_asked_again_under_a_new_key_puts_the_earlier_attempt_in_doubt(
    project,
):
    request = {"order": 7}
    first = intent(project, "run-1:call_a", run_id="run-1", worker="w1", request=request)
    assert first.decision == Decision.PROCEED

    # The process died; the restarted run's model gave the call a new id, and the key named it.
    again = intent(project, "run-1:call_b", run_id="run-1", worker="w2", request=request)

    assert again.decision == Decision.PROCEED
    assert "'run-1:call_a'" in again.reason and "in doubt" in again.reason
    earlier = Effect.objects.get(pk=first.effect.pk)
    assert earlier.state == State.TIMED_OUT
    case = Case.objects.get(effect=earlier, reason="uncertain", closed=None)
    assert "run-1:call_b" in case.summary


def test_another_tool_call_of_the_run_or_the_same_worker_leaves_the_earlier_attempt_alone(
    project,
):
    first = intent(project, "run-1:call_a", run_id="run-1", worker="w1", request={"order": 7})

    # Other arguments, another run, or the same process (a deliberate second call).
    intent(project, "run-1:call_b", run_id="run-1", worker="w2", request={"order": 8})
    intent(project, "run-2:call_c", run_id="run-2", worker="w2", request={"order": 7})
    intent(project, "run-1:call_d", run_id="run-1", worker="w1", request={"order": 7})
    intent(
        project, "run-1:call_e", run_id="run-1", worker="w2", request={"order": 7}, target="other"
    )

    assert Effect.objects.get(pk=first.effect.pk).state == State.PENDING
    assert not Case.objects.filter(effect=first.effect, reason="uncertain").exists()


def test_an_earlier_attempt_with_its_receipt_is_not_put_in_doubt(project):
    first = intent(project, "run-1:call_a", run_id="run-1", worker="w1", request={"order": 7})
    receipt(project, "run-1:call_a")

    intent(project, "run-1:call_b", run_id="run-1", worker="w2", request={"order": 7})

    assert Effect.objects.get(pk=first.effect.pk).state == State.SUCCEEDED
    assert not Case.objects.filter(effect=first.effect, reason="uncertain").exists()
