"""What an approval and a grant check approve: the request and the authority claim together.

A later intent for the key that claims otherwise (another amount, grant, kind or target)
is a `conflict` and opens `key_reuse_conflict` saying what differs; it is never `proceed`.
"""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth.models import User

from durability.models import Approval, Case, Effect, Project, Reason, Role, State
from tests.authority.support import grant, under
from tests.desk.support import logged_in, member

REQUEST = {"order": "o-1042", "refund": "full"}


@pytest.fixture
def refunds(project: Project):
    """One approver up to 100 EUR, two above it, nothing over 1000 EUR."""
    return grant(
        project,
        name="refunds",
        currency="EUR",
        max_amount="1000",
        requires_approval=True,
        second_approval_above="100",
    )


@pytest.fixture
def alice(project: Project) -> User:
    return member(project, "alice", Role.OPERATOR)


def _approve(user: User, key: str) -> None:
    approval = Approval.objects.get(effect__key=key)
    response = logged_in(user).post(
        f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "checked the order"}
    )
    assert response.status_code == 302


def test_an_approved_intent_sent_again_claiming_more_is_a_conflict_not_proceed(api, refunds, alice):
    assert api.intent("refund:1", request=REQUEST, **under(refunds, "50")).json()["decision"] == (
        "wait"
    )
    _approve(alice, "refund:1")

    r = api.intent("refund:1", request=REQUEST, **under(refunds, "900"))

    assert r.status_code == 409
    body = r.json()
    assert body["decision"] == "conflict"
    assert "amount" in body["reason"]
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert body["case"]["id"] == case.pk
    assert case.detail["differs"] == {"amount": ["50.00 EUR", "900.00 EUR"]}
    assert "amount" in case.summary
    effect = Effect.objects.get(key="refund:1")
    assert (effect.state, effect.attempt_count) == (State.PENDING, 0)
    # What was approved still proceeds, once.
    assert api.intent("refund:1", request=REQUEST, **under(refunds, "50")).json()["decision"] == (
        "proceed"
    )


def test_an_intent_awaiting_approval_sent_again_claiming_more_is_a_conflict(api, refunds):
    api.intent("refund:1", request=REQUEST, **under(refunds, "50"))
    assert api.intent("refund:1", request=REQUEST, **under(refunds, "900")).status_code == 409
    approval = Approval.objects.get()
    assert (approval.needed, approval.status) == (1, "open")


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"amount": {"value": "60", "currency": "EUR"}}, "amount"),
        ({"kind": "transfer"}, "kind"),
        ({"target": "paypal"}, "target"),
        ({"authority": None}, "authority"),
    ],
)
def test_a_retry_under_a_grant_with_another_claim_is_a_conflict(api, project, change, differs):
    g = grant(project, name="payments", currency="EUR", max_amount="100")
    first = {"request": REQUEST, **under(g, "50")}
    assert api.intent("pay:1", **first).json()["decision"] == "proceed"
    api.failure("pay:1", definitive=True)

    r = api.intent("pay:1", **(first | change))

    assert r.status_code == 409, r.json()
    assert list(Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT).detail["differs"]) == [differs]
    effect = Effect.objects.get(key="pay:1")
    assert (effect.state, effect.attempt_count) == (State.FAILED, 1)
    assert api.intent("pay:1", **first).json()["decision"] == "proceed"


def test_another_grant_named_for_the_same_request_is_a_conflict(api, project):
    small = grant(project, name="small", currency="EUR", max_amount="100")
    large = grant(project, name="large", currency="EUR", max_amount="5000")
    api.intent("pay:1", request=REQUEST, **under(small, "50"))
    api.timeout("pay:1")

    body = api.intent("pay:1", request=REQUEST, replay="safe", **under(large, "50")).json()

    assert body["decision"] == "conflict"
    differs = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT).detail["differs"]
    assert differs == {"authority": [{"grant": small.pk}, {"grant": large.pk}]}


def test_the_same_claim_written_differently_is_the_same_claim(api, project):
    g = grant(project, name="payments", currency="EUR", max_amount="100")
    api.intent("pay:1", request=REQUEST, **under(g, "50"))
    api.failure("pay:1", definitive=True)
    assert api.intent("pay:1", request=REQUEST, **under(g, "50.00")).json()["decision"] == (
        "proceed"
    )


def test_the_conflict_case_page_shows_what_differs(api, refunds, alice):
    api.intent("refund:1", request=REQUEST, **under(refunds, "50"))
    api.intent("refund:1", request=REQUEST, **under(refunds, "900"))
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)

    page = logged_in(alice).get(case.get_absolute_url()).content.decode()

    assert "data-differs" in page
    assert "50.00 EUR" in page and "900.00 EUR" in page


def test_effects_recorded_before_claims_were_kept_answer_a_repeat_as_before(api, refunds):
    """Migration 0011 gives recorded effects the claim their first intent made."""
    api.intent("refund:1", request=REQUEST, **under(refunds, "50"))
    Effect.objects.update(claim="")
    migration = importlib.import_module("durability.migrations.0011_effect_claim")

    migration.claims_fill(apps, None)

    assert api.intent("refund:1", request=REQUEST, **under(refunds, "50")).json()["decision"] == (
        "wait"
    )
    assert api.intent("refund:1", request=REQUEST, **under(refunds, "900")).status_code == 409
