"""Operator pages. Every page needs a login and shows only the user's projects."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db.models import Prefetch, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

from durability import machine
from durability.effect_filter import EffectQuery
from durability.models import Case, Effect, State

PAGE_SIZE = 50


class AuthedRequest(HttpRequest):
    """What the middleware adds to a request that `login_required` let through."""

    user: User
    htmx: HtmxDetails


def _effects_of(request: AuthedRequest) -> QuerySet[Effect]:
    return Effect.objects.filter(project__members=request.user)


@login_required
def effects(request: AuthedRequest) -> HttpResponse:
    """Effects newest first, filtered from the URL (durability.effect_filter), keyset-paginated
    on id (`?before=<id>`)."""
    query = EffectQuery.from_params(request.GET)
    qs = query.apply(_effects_of(request).select_related("project").order_by("-id"))
    state = query.values.get("state", "")
    before = request.GET.get("before", "")
    if before.isdigit():
        qs = qs.filter(id__lt=int(before))
    page = list(qs[: PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    context = {
        "effects": page,
        "state": state,
        "states": State.values,
        "query": query,
        "next_before": page[-1].pk if more else None,
    }
    template = "durability/effects.html"
    if request.htmx and before:
        template += "#rows"
    return render(request, template, context)


@login_required
def effect(request: AuthedRequest, effect_id: int) -> HttpResponse:
    found = (
        _effects_of(request)
        .select_related("project")
        .prefetch_related(
            "attempts",
            "receipts",
            Prefetch(
                "cases", queryset=Case.objects.select_related("resolution").order_by("opened")
            ),
        )
        .filter(pk=effect_id)
        .first()
    )
    if found is None:
        raise Http404("No such effect in your projects")
    outcome = machine.decide(found)
    return render(request, "durability/effect.html", {"effect": found, "outcome": outcome})
