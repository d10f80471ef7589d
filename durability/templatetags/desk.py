"""The desk's template tags: the header's navigation and project switcher, and JSON and
words for people to read."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import template
from django.http import QueryDict
from django.urls import reverse

from durability import models
from durability.accounts.access import current_membership
from durability.desk import saved_views
from durability.ledger import grant_check
from durability.models import Membership, Role

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


# The header's links: (label, URL name, the key after `g` that goes there, the paths of the
# pages that belong to it). The help overlay lists the same links with their keys
# (templates/durability/_keys.html); static/durability/desk.js follows them.
NAV = [
    ("Queue", "queue", "q", ("/queue/", "/cases/")),
    ("My cases", "queue", "m", ()),
    ("Effects", "effects", "e", ("/effects/",)),
    ("Runs", "runs", "r", ("/runs/",)),
    ("Approvals", "approvals", "a", ("/approvals/",)),
    ("Authority", "authority", "p", ("/authority/",)),
    ("Audit", "audit", "l", ("/audit/",)),
    ("Settings", "settings", "s", ("/settings/",)),
]
MINE = "assignee=me"


def _mine(request: Any) -> bool:
    """Whether the page is (or was opened from) the queue of the user's own cases."""
    params = request.GET
    if request.path.startswith("/cases/"):
        params = QueryDict(params.get("from", ""))
    return bool(params.get("assignee") == "me")


@register.simple_tag(takes_context=True)
def nav_links(context: template.Context) -> list[dict[str, str]]:
    """The header's links, the current one marked: `aria-current="page"` on the page it
    links to, `"true"` on the pages under it (a case under the queue it came from)."""
    request = context["request"]
    role = current_role(context)
    mine = _mine(request)
    links = []
    for label, name, key, paths in NAV:
        if name == "settings" and role != Role.ADMIN:
            continue
        url = reverse(name) + (f"?{MINE}" if key == "m" else "")
        if key == "m":
            paths = ("/queue/", "/cases/") if mine else ()
        elif key == "q" and mine:
            paths = ()
        current = ""
        if any(request.path.startswith(p) for p in paths):
            current = "page" if request.path == reverse(name) else "true"
        links.append({"label": label, "url": url, "key": key, "current": current})
    return links


# Pages the command palette offers beyond the header's links: (label, URL name).
PALETTE_PAGES = [
    ("Overview", "index"),
    ("Search", "search"),
    ("Your notifications", "settings-notifications"),
]


@register.simple_tag(takes_context=True)
def palette_places(context: template.Context, q: str) -> list[dict[str, str]]:
    """What the command palette offers for `q` besides rows found: the pages (the header's
    links and a few more) and the saved views of the current project whose names hold it."""
    words = q.strip().lower()
    places = [
        {"label": link["label"], "url": link["url"], "kind": "page"} for link in nav_links(context)
    ] + [{"label": label, "url": reverse(name), "kind": "page"} for label, name in PALETTE_PAGES]
    current, _ = _current(context)
    if current is not None:
        places += [
            {"label": view.name, "url": view.get_absolute_url(), "kind": "view"}
            for view in saved_views.views_for(current.project, context["request"].user)
        ]
    return [p for p in places if words in p["label"].lower()]


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
    return "" if value is None else grant_check.money(value, currency)
