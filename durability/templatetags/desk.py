"""The desk's template tags: the header's project switcher, and JSON for people to read."""

from __future__ import annotations

import json
from typing import Any

from django import template

from durability.accounts.access import current_membership
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
