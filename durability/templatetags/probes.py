"""{% probe_panel effect %}: the reconciler probe panel of the case page."""

from __future__ import annotations

from typing import Any

from django import template

from durability.accounts.roles import Access
from durability.models import Effect
from durability.reconcilers.reconciling import PANEL, panel_context

register = template.Library()


@register.inclusion_tag(PANEL, takes_context=True)
def probe_panel(context: template.Context, effect: Effect) -> dict[str, Any]:
    """The panel, with the `access` the case page's view looked up (the one access helper)."""
    access: Access = context["access"]
    return {
        **panel_context(effect, access),
        "request": context["request"],
        "csrf_token": context.get("csrf_token"),
    }
