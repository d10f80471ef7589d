"""The desk's template tags: the header's project switcher, and JSON and words for people to
read."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import template

from durability import models
from durability.accounts.access import current_membership
from durability.ledger import authority
from durability.models import Membership

register = template.Library()


def _current(context: template.Context) -> tuple[Membership | None, list[Membership]]:
    """The user's current membership and all of theirs, looked up once per page render."""
    cache = context.render_context
    if "tallybook_current" not in cache:
        cache["tallybook_current"] = current_membership(context["request"])
    found: tuple[Membership | None, list[Membership]] = cache["tallybook_current"]
    return found


@register.simple_tag(takes_context=True)
def current_role(context: template.Context) -> str:
    """The user's role in their current project ("" without one), for the header's links."""
    current, _ = _current(context)
    return current.role if current else ""


@register.inclusion_tag("durability/accounts/_project_switcher.html", takes_context=True)
def project_switcher(context: template.Context) -> dict[str, Any]:
    request = context["request"]
    current, memberships = _current(context)
    return {
        "current": current,
        "memberships": memberships,
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }


@register.filter
def as_json(value: Any) -> str:
    """A stored JSON value as JSON (never as Python's repr), keys sorted, indented: the one
    way every page shows request, context, authority and audit data (in `<pre class="json">`
    where it spans lines)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, default=str)


@register.filter
def actor_named(actor: str) -> str:
    """Who an audit actor is, for a person (`user:alice` is alice)."""
    return models.actor_named(actor)


@register.filter
def closed_status(action: str) -> str:
    """How a case closed by `action` reads ("Closed: it did not happen")."""
    return models.closed_status(action)


@register.filter
def money(value: Decimal | None, currency: str) -> str:
    """An amount with its currency, as the grant check words it ("40 EUR")."""
    return "" if value is None else authority.money(value, currency)
