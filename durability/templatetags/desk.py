"""The desk's template tags: the header's project switcher, and JSON for people to read."""

from __future__ import annotations

import json
from typing import Any

from django import template

from durability.desk import current_membership

register = template.Library()


@register.inclusion_tag("durability/_project_switcher.html", takes_context=True)
def project_switcher(context: template.Context) -> dict[str, Any]:
    request = context["request"]
    current, memberships = current_membership(request)
    return {
        "current": current,
        "memberships": memberships,
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }


@register.filter
def as_json(value: Any) -> str:
    """A stored JSON value as JSON (not as Python's repr), keys sorted."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
