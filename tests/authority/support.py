"""Helpers for the authority specifications: grants, and intents that name them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from durability.authority import grants
from durability.models import Grant, Project

ADMIN = "user:ada"


def grant(project: Project, **terms: Any) -> Grant:
    """A grant created the way an admin creates one; every kind and target unless told."""
    terms.setdefault("name", "test grant")
    terms.setdefault("kinds", ["*"])
    terms.setdefault("targets", ["*"])
    for name in ("max_amount", "max_daily_amount", "second_approval_above"):
        if isinstance(terms.get(name), str):
            terms[name] = Decimal(terms[name])
    return grants.grant_create(project=project, actor=ADMIN, terms=grants.Terms(**terms))


def under(
    g: Grant, amount: str | None = None, currency: str = "EUR", **fields: Any
) -> dict[str, Any]:
    """Intent fields naming grant `g`, with an amount when given."""
    fields["authority"] = {"grant": g.pk}
    if amount is not None:
        fields["amount"] = {"value": amount, "currency": currency}
    return fields


def supersede(g: Grant, **changes: Any) -> Grant:
    """The next version of `g`, with `changes` to its terms."""
    terms = grants.Terms(**(grants.Terms.of(g).__dict__ | changes))
    return grants.grant_supersede(grant=g, actor=ADMIN, terms=terms)
