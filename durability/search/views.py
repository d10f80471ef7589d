"""The search page: one box in the header, results grouped by kind, the current project's
only."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from durability.accounts.access import AuthedRequest, project_access
from durability.accounts.roles import Access, Perm
from durability.search.queries import MIN_TEXT, SearchForm, by_id
from durability.search.queries import search as search_for

# Where each kind's "all of them" link leads, with its filter (Results.filtered).
LISTS = {"effects": "effects", "cases": "queue", "approvals": "approvals", "runs": "runs"}


@login_required
@require_GET
def search(request: AuthedRequest) -> HttpResponse:
    """`?q=` (and `kind=` for one kind's longer list): effects, cases and runs, ranked."""
    access = project_access(request, Perm.VIEW)
    context: dict[str, Any] = {"access": access, "min_text": MIN_TEXT}
    if request.htmx and request.GET.get("palette"):
        return _palette(request, access)
    if "q" not in request.GET:
        return render(request, "durability/search/search.html", context | {"form": SearchForm()})
    form = SearchForm(request.GET)
    context["form"] = form
    if not form.is_valid():
        return render(request, "durability/search/search.html", context, status=400)
    q, kind = form.cleaned_data["q"], form.cleaned_data["kind"]
    groups = []
    for name, results in search_for(access.project, q, kind).items():
        filtered = ""
        if results.filtered:
            params = dict([results.filtered])
            if name == "effects":
                params["project"] = str(access.project.pk)
            filtered = f"{reverse(LISTS[name])}?{urlencode(params)}"
        groups.append(
            {
                "kind": name,
                "results": results,
                "more": f"?{urlencode({'q': q, 'kind': name})}"
                if results.more and not kind
                else "",
                "filtered": filtered,
            }
        )
    context |= {"q": q, "kind": kind, "groups": groups, "short": len(q) < MIN_TEXT}
    return render(request, "durability/search/search.html", context)


# Rows of each kind the command palette lists.
PALETTE_ROWS = 5


def _palette(request: AuthedRequest, access: Access) -> HttpResponse:
    """The command palette's list (static/durability/palette.js): the pages and saved views
    whose names hold the text (durability.templatetags.desk.palette_places), the case, effect
    and approval a number names, and the search's best rows of each kind."""
    form = SearchForm(request.GET)
    q = form.cleaned_data["q"] if form.is_valid() else ""
    context: dict[str, Any] = {"access": access, "q": q, "by_id": [], "groups": []}
    if q:
        context["by_id"] = by_id(access.project, q)
        context["groups"] = [
            {"kind": name, "found": results.found[:PALETTE_ROWS]}
            for name, results in search_for(access.project, q).items()
        ]
    return render(request, "durability/search/search.html#palette", context)
