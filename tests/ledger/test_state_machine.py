"""The effect state machine: every allowed transition through the services, every other refused.

docs/concepts.md ("The effect's states", "Decision") is the specification;
`machine.TRANSITIONS` is its table.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from durability.audit import Trail
from durability.authority import approvals
from durability.ledger import evidence, machine
from durability.ledger.decisions import decide
from durability.ledger.machine import TRANSITIONS, Event, IllegalTransition
from durability.ledger.settling import EVIDENCE_STRENGTH, SETTLING_EVENTS
from durability.models import Approval, AuditEntry, Case, Effect, Project, SignoffVerdict, State
from tests.ledger.support import (
    audit_of,
    effect_in,
    failure,
    intent,
    later,
    needs_approval,
    receipt,
    refusing,
    row_counts,
    settle,
    timeout,
)

S, E = State, Event
Row = tuple[State | None, Event]

DRIVERS: dict[Row, Callable[[Project], None]] = {}


def drives(*rows: Row) -> Callable[[Callable[[Project], None]], Callable[[Project], None]]:
    """Register a function that fires a row's event through the services at key "k1"."""

    def register(fire: Callable[[Project], None]) -> Callable[[Project], None]:
        for row in rows:
            assert row not in DRIVERS, row
            DRIVERS[row] = fire
        return fire

    return register


@drives((None, E.INTENT))
def _new_intent(project):
    intent(project)


@drives((None, E.REQUIRE_APPROVAL))
def _new_intent_under_a_grant_requiring_approval(project):
    intent(project, authority={"grant": needs_approval(project).pk})


@drives((None, E.REFUSE))
def _new_intent_the_grant_refuses(project):
    intent(project, authority={"grant": refusing(project).pk})


def _signed(verdict: SignoffVerdict) -> Callable[[Project], None]:
    """A person's verdict on the approval an effect awaits, through the approvals service."""

    def fire(project):
        effect_in(project, S.AWAITING_APPROVAL)
        approvals.approval_sign(
            project=project,
            approval_id=Approval.objects.get(effect__key="k1").pk,
            user=User.objects.create_user("ada"),
            verdict=verdict,
            reason="checked the order",
        )

    return fire


drives((S.AWAITING_APPROVAL, E.APPROVE))(_signed(SignoffVerdict.APPROVE))
drives((S.AWAITING_APPROVAL, E.DENY))(_signed(SignoffVerdict.DENY))


@drives((S.PENDING, E.RECEIPT))
def _receipt_while_pending(project):
    effect_in(project, S.PENDING)
    receipt(project)


@drives((S.PENDING, E.FAILURE))
def _definitive_failure(project):
    effect_in(project, S.PENDING)
    failure(project, definitive=True)


@drives((S.PENDING, E.TIMEOUT))
def _reported_timeout(project):
    effect_in(project, S.PENDING)
    timeout(project)


@drives((S.PENDING, E.DEADLINE))
def _deadline_passed(project):
    effect_in(project, S.PENDING, timeout_s=30)
    evidence.deadlines_sweep(now=later(31))


@drives((S.PENDING, E.INTERRUPTION))
def _same_run_resumed_elsewhere(project):
    effect_in(project, S.PENDING, run_id="run-1", worker="w1")
    intent(project, run_id="run-1", worker="w2")


@drives((S.TIMED_OUT, E.RECEIPT))
def _late_receipt(project):
    effect_in(project, S.TIMED_OUT)
    receipt(project)


@drives((S.FAILED, E.RECEIPT))
def _receipt_after_failure(project):
    effect_in(project, S.FAILED)
    receipt(project)


@drives((S.NOT_HAPPENED, E.RECEIPT))
def _receipt_after_not_happened(project):
    effect_in(project, S.NOT_HAPPENED)
    receipt(project)


@drives((S.ABANDONED, E.RECEIPT))
def _receipt_after_abandon(project):
    effect_in(project, S.ABANDONED)
    receipt(project)


@drives((S.TIMED_OUT, E.RETRY))
def _retry_after_timeout_when_replay_allows(project):
    effect_in(project, S.TIMED_OUT, replay="idempotent")
    intent(project, replay="idempotent")


@drives((S.FAILED, E.RETRY))
def _retry_after_failure(project):
    effect_in(project, S.FAILED)
    intent(project)


@drives((S.NOT_HAPPENED, E.RETRY))
def _retry_after_not_happened(project):
    effect_in(project, S.NOT_HAPPENED)
    intent(project)


def _verdict(state: State, event: Event) -> Callable[[Project], None]:
    """An operator's or a reconciler's verdict, with evidence when the event needs it."""

    def fire(project):
        effect_in(project, state)
        proof = "re_verdict" if event in EVIDENCE_STRENGTH else ""
        settle(project, "k1", event, evidence=proof)

    return fire


for _row in TRANSITIONS:
    if _row[1] in SETTLING_EVENTS and _row[0] is not None:
        drives(_row)(_verdict(_row[0], _row[1]))


def test_every_row_of_the_table_is_driven_by_a_service():
    assert set(DRIVERS) == set(TRANSITIONS)


def _name(row: Row) -> str:
    return f"{row[0] or 'new'}-{row[1]}"


DRIVEN: list[Row] = sorted(DRIVERS, key=_name)


@pytest.mark.parametrize("row", DRIVEN, ids=_name)
def test_each_allowed_transition_moves_the_effect_and_is_audited(project, row):
    before, event = row
    DRIVERS[row](project)
    effect = Effect.objects.get(project=project, key="k1")
    assert effect.state == TRANSITIONS[row]
    moves = [e for e in audit_of(effect) if e.action == event.value]
    assert [(m.from_state, m.to_state) for m in moves] == [(before or "", TRANSITIONS[row])]


def test_every_audited_move_is_a_row_of_the_table(project):
    for i, state in enumerate(State):
        effect_in(project, state, key=f"k{i}", replay="safe")
        intent(project, f"k{i}", replay="safe")
    moves = AuditEntry.objects.filter(project=project).exclude(to_state="")
    assert moves.exists()
    for entry in moves:
        assert (State(entry.from_state) if entry.from_state else None, Event(entry.action)) in (
            TRANSITIONS
        ), entry
        before = State(entry.from_state) if entry.from_state else None
        assert TRANSITIONS[(before, Event(entry.action))] == entry.to_state


# -- every other (state, event) pair is refused -----------------------------------------

STATES_AND_NEW: list[State | None] = [None, *State]
ILLEGAL = sorted(
    (
        (state, event)
        for state in STATES_AND_NEW
        for event in Event
        if (state, event) not in TRANSITIONS
    ),
    key=_name,
)


def test_the_illegal_pairs_are_everything_outside_the_table():
    assert len(ILLEGAL) == len(STATES_AND_NEW) * len(Event) - len(TRANSITIONS)


@pytest.mark.parametrize("row", ILLEGAL, ids=_name)
def test_the_machine_refuses_every_pair_outside_the_table_and_changes_nothing(project, row):
    state, event = row
    if state is None:
        effect = Effect(project=project, key="k1", kind="payment", target="stripe")
    else:
        effect = effect_in(project, state)
    counts, audit = row_counts(), AuditEntry.objects.count()
    trail = Trail(project.pk, "test")
    with pytest.raises(IllegalTransition), transaction.atomic():
        machine.apply(effect, event, trail)
    assert trail.entries == []
    assert row_counts() == counts and AuditEntry.objects.count() == audit
    if state is None:
        assert not Effect.objects.filter(key="k1").exists()
    else:
        assert Effect.objects.get(pk=effect.pk).state == state


# -- the services that may refuse: the API's 409, or IllegalTransition ------------------

# Reports the agent makes about an attempt, and the state each leads to.
REPORTS = {
    "definitive failure": (lambda api: api.failure(definitive=True), E.FAILURE, S.FAILED),
    "uncertain failure": (lambda api: api.failure(definitive=False), E.TIMEOUT, S.TIMED_OUT),
    "timeout": (lambda api: api.timeout(), E.TIMEOUT, S.TIMED_OUT),
}


# Allowed moves and repeats (a no-op) are specified elsewhere in this file.
REFUSED_REPORTS = [
    (report, state)
    for report, (_, event, target) in REPORTS.items()
    for state in State
    if (state, event) not in TRANSITIONS and state != target
]


@pytest.mark.parametrize(("report", "state"), REFUSED_REPORTS)
def test_a_report_the_state_does_not_allow_is_a_409_that_changes_nothing(
    api, project, report, state
):
    send, event, target = REPORTS[report]
    effect = effect_in(project, state)
    counts, updated = row_counts(), effect.updated
    r = send(api)
    assert r.status_code == 409
    assert r.json()["error"] == (f"effect 'k1' is {state}; {event} is not allowed from there")
    effect.refresh_from_db()
    assert (effect.state, effect.updated) == (state, updated)
    assert row_counts() == counts


@pytest.mark.parametrize("report", list(REPORTS))
def test_repeating_a_report_is_a_no_op(api, project, report):
    send, _, target = REPORTS[report]
    effect_in(project, target)
    counts = row_counts()
    r = send(api)
    assert r.status_code == 200
    assert r.json()["changed"] is False
    assert r.json()["effect"]["state"] == target
    assert row_counts() == counts


REFUSED_VERDICTS = [
    (event, state)
    for event in sorted(SETTLING_EVENTS)
    for state in State
    if (state, event) not in TRANSITIONS
]


@pytest.mark.parametrize(("event", "state"), REFUSED_VERDICTS)
def test_an_operator_verdict_the_state_does_not_allow_is_refused(project, event, state):
    effect = effect_in(project, state)
    counts = row_counts()
    with pytest.raises(IllegalTransition):
        settle(project, "k1", event, evidence="re_x" if event in EVIDENCE_STRENGTH else "")
    assert Effect.objects.get(pk=effect.pk).state == state
    assert row_counts() == counts


def test_a_verdict_that_needs_evidence_is_refused_without_it(project):
    effect_in(project, S.TIMED_OUT)
    for event in EVIDENCE_STRENGTH:
        with pytest.raises(ValueError, match="needs evidence"):
            settle(project, "k1", event)


def test_reports_for_an_unknown_key_are_404(api):
    counts = row_counts()
    for r in (api.failure("nope"), api.timeout("nope")):
        assert r.status_code == 404
        assert r.json()["fields"] == {"key": "No effect has this key"}
    assert row_counts() == counts


# -- the decision table (docs/concepts.md, "Decision") -----------------------------------

DECISIONS = [
    (S.PENDING, "never", "wait"),
    (S.SUCCEEDED, "never", "completed"),
    (S.FAILED, "never", "proceed"),
    (S.NOT_HAPPENED, "never", "proceed"),
    (S.TIMED_OUT, "never", "wait"),
    (S.TIMED_OUT, "reconcile", "wait"),
    (S.TIMED_OUT, "safe", "proceed"),
    (S.TIMED_OUT, "idempotent", "proceed"),
    (S.AWAITING_APPROVAL, "never", "wait"),
    (S.DENIED, "never", "denied"),
    # An operator closed these for good: the agent must not perform them again.
    (S.COMPENSATED, "never", "denied"),
    (S.ABANDONED, "never", "denied"),
]


def test_the_decision_table_covers_every_state():
    assert {state for state, _, _ in DECISIONS} == set(State)


@pytest.mark.parametrize(("state", "replay", "decision"), DECISIONS)
def test_the_decision_for_each_state(api, project, settings, state, replay, decision):
    # With SITE_URL set, the dry run and the API's answer give the same approval link.
    settings.SITE_URL_CONFIGURED = True
    effect = effect_in(project, state, replay=replay)
    outcome = decide(effect)
    assert outcome.decision == decision
    if state == S.AWAITING_APPROVAL:
        # A sentence, then where to approve.
        approval = Approval.objects.get(effect=effect)
        where = f"{settings.SITE_URL}{approval.get_absolute_url()}"
        assert outcome.reason.endswith(f". Wait for approval {approval.pk}: {where}")
    else:
        assert outcome.reason.endswith(".")
    if decision == "completed":
        assert outcome.receipt is not None and outcome.receipt.external_id == "ext-1"
    if state == S.TIMED_OUT:
        assert outcome.case is not None and outcome.case.reason == "uncertain"
    counts = row_counts()
    r = api.get(f"effects/{effect.pk}")
    assert r.status_code == 200
    assert (r.json()["decision"], r.json()["reason"]) == (decision, outcome.reason)
    assert row_counts() == counts, "asking for the decision records nothing"


def test_a_new_key_is_proceed_and_creates_attempt_one(project):
    outcome = intent(project, "fresh")
    assert (outcome.decision, outcome.created) == ("proceed", True)
    assert outcome.effect.attempts.get().number == 1


def test_a_case_is_never_opened_twice_for_the_same_reason_while_open(project):
    effect_in(project, S.PENDING, run_id="r", worker="w1")
    intent(project, run_id="r", worker="w2")  # interruption: timed out, uncertain
    timeout(project)  # already timed out: no new case
    failure(project, definitive=False)
    assert Case.objects.filter(reason="uncertain", closed=None).count() == 1
