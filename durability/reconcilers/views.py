"""The case page's probe panel: the probe history and an operator's "probe now"."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from durability import jobs
from durability.accounts.access import AuthedRequest, actor_of, object_access
from durability.accounts.roles import Perm
from durability.models import Effect
from durability.reconcilers import jobs as reconciler_jobs
from durability.reconcilers.reconciling import PANEL, panel_context


def _requested(value: str) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        return None


@login_required
@require_GET
def probes(request: AuthedRequest, effect_id: int) -> HttpResponse:
    """The panel alone: htmx polls it while a requested probe has not answered."""
    effect, access = object_access(request, Perm.VIEW, Effect.objects.all(), effect_id)
    requested = _requested(request.GET.get("requested", ""))
    return render(request, PANEL, panel_context(effect, access, requested))


@login_required
@require_POST
def probe_now(request: AuthedRequest, effect_id: int) -> HttpResponse:
    """An operator asks the reconciler now; the answer lands in the panel (and the audit)."""
    effect, access = object_access(request, Perm.RESOLVE, Effect.objects.all(), effect_id)
    context = panel_context(effect, access)
    requested = timezone.now()
    if context["can_probe"]:
        jobs.enqueue(
            reconciler_jobs.probe,
            effect.pk,
            actor_of(request),
            retry=reconciler_jobs.probe_retry(),
        )
        notice = ""
    elif context["config"] is None:
        notice = f"No reconciler is configured for {effect.target}."
    else:
        notice = f"The effect is {effect.state}, not timed out: there is nothing to probe."
    if request.htmx:
        effect.refresh_from_db()
        context = panel_context(effect, access, None if notice else requested)
        return render(request, PANEL, {**context, "notice": notice})
    if notice:
        messages.error(request, notice)
    else:
        messages.success(request, "Probe requested; its answer appears under Reconciler probes.")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = effect.get_absolute_url()
    return redirect(back)
