"""{% probe_panel effect %}: the reconciler probe panel of the case page."""

from __future__ import annotations

from typing import Any

from django import template

from durability.accounts.roles import Access, access_of
from durability.models import Effect
from durability.reconcilers.services import PANEL, panel_context

register = template.Library()


@register.inclusion_tag(PANEL, takes_context=True)
def probe_panel(context: template.Context, effect: Effect) -> dict[str, Any]:
    request = context["request"]
    # The case page has already looked up the user's access to the project.
    access = context.get("access")
    if not isinstance(access, Access) or access.project.pk != effect.project_id:
        access = access_of(request.user, effect.project_id)
    return {
        **panel_context(effect, access),
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }
