"""Two operators resolving one case at once: exactly one wins, the other is told plainly.

Real threads, each with its own PostgreSQL connection, released together by a barrier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.db import connection

from durability.desk import case_actions
from durability.models import AuditEntry, Case, Effect, Resolution
from tests.desk.support import logged_in, uncertain_case

pytestmark = pytest.mark.django_db(transaction=True)


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads released together; their results (or exceptions), in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=60)
            results[i] = call()
        except Exception as exc:  # the loser's exception is the result under test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a call did not return"
    return results


def _resolver(client, case, verdict, note):
    """A call that posts a verdict on the case as its page showed it."""
    data = {"version": case.version, "verdict": verdict, "note": note}
    return lambda: client.post(f"/cases/{case.pk}/resolve/", data)


def test_two_operators_resolving_through_the_page_one_wins_one_is_told(project, alice, admin):
    for round_ in range(3):
        case = uncertain_case(project, f"race-{round_}")
        clients = [logged_in(alice), logged_in(admin)]
        responses = _at_once(
            [
                _resolver(clients[0], case, "not_happened", "not in Stripe"),
                _resolver(clients[1], case, "abandoned", "giving up"),
            ]
        )
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [302, 303]  # made, and refused: back to the case with why
        lost = next(i for i, r in enumerate(responses) if r.status_code == 303)
        loser = clients[lost].get(responses[lost]["Location"]).content.decode()
        assert "changed while you were looking at it" in loser
        assert "Your action was not applied" in loser
        resolution = Resolution.objects.get(case=case)
        winner = "attest_not_happened" if responses[0].status_code == 302 else "abandon"
        assert resolution.action == winner
        effect = Effect.objects.get(cases=case)
        assert effect.state == ("not_happened" if winner == "attest_not_happened" else "abandoned")
        assert AuditEntry.objects.filter(effect=effect, action=winner).count() == 1


def test_eight_concurrent_verdicts_leave_exactly_one_resolution(project):
    case = uncertain_case(project)
    verdicts = [case_actions.Verdict.NOT_HAPPENED, case_actions.Verdict.ABANDONED] * 4
    results = _at_once(
        [
            partial(
                case_actions.case_resolve,
                project=project,
                case_id=case.pk,
                version=case.version,
                actor=f"user:op{i}",
                verdict=verdict,
                note="mine",
            )
            for i, verdict in enumerate(verdicts)
        ]
    )
    won = [r for r in results if isinstance(r, Case)]
    lost = [r for r in results if isinstance(r, case_actions.CaseChanged)]
    assert (len(won), len(lost)) == (1, 7)
    assert Resolution.objects.filter(case=case).count() == 1
    assert AuditEntry.objects.filter(case=case, action="case_closed").count() == 1


def test_an_assignment_and_a_resolution_at_once_do_not_both_apply_to_one_version(project, admin):
    case = uncertain_case(project)
    results = _at_once(
        [
            lambda: case_actions.case_assign(
                project=project,
                case_id=case.pk,
                version=case.version,
                actor="user:ada",
                assignee=admin,
            ),
            lambda: case_actions.case_resolve(
                project=project,
                case_id=case.pk,
                version=case.version,
                actor="user:alice",
                verdict=case_actions.Verdict.NOT_HAPPENED,
                note="checked",
            ),
        ]
    )
    assert sum(isinstance(r, Case) for r in results) == 1
    assert sum(isinstance(r, case_actions.CaseChanged) for r in results) == 1
