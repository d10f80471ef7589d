"""{% project_switcher %}: the header's current project, and the others to switch to."""

from __future__ import annotations

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
