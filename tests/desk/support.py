"""Helpers for the desk's specifications: members, logged-in clients, cases to work on."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from durability.models import Case, Membership, Project, Reason, Role
from tests.ledger import support as ledger


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
