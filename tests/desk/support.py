"""Helpers for the desk's specifications: members, logged-in clients, cases to work on."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from durability.ledger import evidence
from durability.ledger.commands import Amount, ReceiptEvidence
from durability.models import Case, Grant, Membership, Project, Reason, Role, State
from tests.ledger import support as ledger

# Not operator pages: machine endpoints with their own authentication, the login itself,
# and an invitation's one-time link (its token is the authentication).
NOT_PAGES = ("api/", "v1/", "hooks/", "admin/", "login/", "logout/", "static/", "welcome/")


def operator_pages(
    patterns: list[URLPattern | URLResolver] | None = None, prefix: str = ""
) -> list[str]:
    """Every operator page the URLconf routes to, each argument written as 1."""
    found = []
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found += operator_pages(pattern.url_patterns, route)
        elif not route.startswith(NOT_PAGES):
            found.append("/" + re.sub(r"<(?:\w+:)?\w+>", "1", route))
    return found


def member(project: Project, username: str, role: Role) -> User:
    user = User.objects.create_user(username, password="password")
    Membership.objects.create(project=project, user=user, role=role)
    return user


def search(pattern: str, text: str) -> re.Match[str]:
    """The first match of `pattern` in `text`, which must be there."""
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not found"
    return found


def logged_in(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def uncertain_case(project: Project, key: str = "k1", **intent_fields: Any) -> Case:
    """An effect that timed out, and its open `uncertain` case."""
    ledger.intent(project, key, **intent_fields)
    ledger.timeout(project, key)
    return Case.objects.get(effect__key=key, reason=Reason.UNCERTAIN, closed=None)


def late_success_case(project: Project, key: str = "k1") -> Case:
    """An effect that succeeded after its timeout, and its open `late_success` case."""
    ledger.intent(project, key)
    ledger.timeout(project, key)
    ledger.receipt(project, key, "late-1")
    return Case.objects.get(effect__key=key, reason=Reason.LATE_SUCCESS, closed=None)


def exceeding_case(project: Project, key: str = "refund:42") -> Case:
    """A refund of 40 EUR asked under a grant of at most 50 EUR per effect, whose receipt
    shows 400 EUR: its open `authority_exceeded` case."""
    grant = Grant.objects.create(
        project=project,
        name="small refunds",
        kinds=["*"],
        targets=["*"],
        currency="EUR",
        max_amount="50",
        granted_by="test",
    )
    amount = {"value": "40", "currency": "EUR"}
    ledger.intent(project, key, authority={"grant": grant.pk}, amount=amount)
    evidence.receipt_record(
        project=project,
        actor=ledger.ACTOR,
        receipt=ReceiptEvidence(
            key=key,
            system="stripe",
            external_id="re_400",
            amount=Amount(Decimal("400"), "EUR"),
        ),
    )
    return Case.objects.get(effect__key=key, reason=Reason.AUTHORITY_EXCEEDED)


def case_of(project: Project, reason: Reason, key: str = "k1") -> Case:
    """An open case of `reason`, brought about through the services as an agent would."""
    if reason == Reason.UNCERTAIN:
        return uncertain_case(project, key)
    if reason == Reason.LATE_SUCCESS:
        return late_success_case(project, key)
    if reason == Reason.DUPLICATE_EFFECT:
        ledger.intent(project, key)
        ledger.receipt(project, key, "re_a")
        ledger.receipt(project, key, "re_b")
    elif reason == Reason.KEY_REUSE_CONFLICT:
        ledger.intent(project, key)
        ledger.intent(project, key, request={"amount": 2})
    elif reason == Reason.ORPHAN_RECEIPT:
        ledger.receipt(project, key, "re_9")
        return Case.objects.get(reason=reason, closed=None)
    elif reason == Reason.VERSION_DRIFT:
        ledger.intent(project, key, replay="safe", context={"workflow_version": "1"})
        ledger.timeout(project, key)
        ledger.intent(project, key, replay="safe", context={"workflow_version": "2"})
    elif reason == Reason.APPROVAL_REQUIRED:
        ledger.effect_in(project, State.AWAITING_APPROVAL, key)
    elif reason == Reason.AUTHORITY_DENIED:
        ledger.effect_in(project, State.DENIED, key)
    elif reason == Reason.UNAUTHORIZED_EFFECT:
        ledger.cases_asked(project)
        ledger.intent(project, key, authority=None)
        ledger.receipt(project, key, "re_1")
    elif reason == Reason.AUTHORITY_EXCEEDED:
        return exceeding_case(project, key)
    return Case.objects.get(effect__key=key, reason=reason, closed=None)
