"""Authority pages: grants (/authority/), webhook sources, the authority report, and the
approvals inbox (/approvals/). The policy for intents without a grant is set with the
project's settings.

Everything is in the user's current project (durability.accounts.access). Reading needs a
membership; approving needs the operator's right to resolve cases; grants and webhook
sources are for admins. Services do the changes and write the audit entries.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError
from django.db.models import Count, FilteredRelation, Q
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from durability import exports, inbound
from durability.accounts.access import AuthedRequest, actor_of, object_access, project_access
from durability.accounts.roles import Access, Perm
from durability.authority import approvals, grants, report
from durability.authority import webhook_sources as webhook_source_services
from durability.authority.forms import (
    GrantForm,
    ReportForm,
    RevokeForm,
    SignoffForm,
    WebhookSourceForm,
)
from durability.models import Approval, Grant, SignoffVerdict, WebhookKind, WebhookSource

RECENT_EFFECTS = 20


# -- grants and policy -----------------------------------------------------------------


@login_required
@require_GET
def authority(request: AuthedRequest) -> HttpResponse:
    """The project's grants (current versions unless `?status=` says otherwise) and policy."""
    access = project_access(request, Perm.VIEW)
    query = grants.GrantQuery.parse(request.GET.dict())
    if isinstance(query, dict):
        query = grants.GrantQuery()
    rows = query.apply(Grant.objects.filter(project=access.project))
    if not query.status:
        rows = rows.filter(superseded_at=None)
    return render(
        request,
        "durability/authority/grants.html",
        {
            "access": access,
            "grants": list(rows[:500]),
            "status": query.status,
            "statuses": grants.GRANT_STATUSES,
            "can_manage": access.can(Perm.MANAGE),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def grant_new(request: AuthedRequest) -> HttpResponse:
    access = project_access(request, Perm.MANAGE)
    form = GrantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        grant = grants.grant_create(
            project=access.project, actor=actor_of(request), terms=form.terms()
        )
        messages.success(request, f"Grant {grant.pk} created.")
        return redirect(grant)
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "durability/authority/grant_form.html",
        {"form": form, "access": access},
        status=status,
    )


def _grant_page(
    request: AuthedRequest,
    access: Access,
    grant: Grant,
    form: GrantForm | None = None,
    revoke: RevokeForm | None = None,
    status: int = 200,
) -> HttpResponse:
    versions = list(Grant.objects.filter(lineage=grant.lineage).order_by("-version"))
    effects = list(
        grant.effects.select_related("grant").order_by("-id")[:RECENT_EFFECTS] if grant.pk else []
    )
    context: dict[str, Any] = {
        "access": access,
        "grant": grant,
        "versions": versions,
        "effects": effects,
        "can_manage": access.can(Perm.MANAGE),
        "form": form or GrantForm.of(grant),
        "revoke_form": revoke or RevokeForm(),
        "current": grant.superseded_at is None and grant.revoked is None,
    }
    return render(request, "durability/authority/grant.html", context, status=status)


@login_required
@require_GET
def grant(request: AuthedRequest, grant_id: int) -> HttpResponse:
    found, access = object_access(request, Perm.VIEW, Grant.objects.all(), grant_id, current=True)
    return _grant_page(request, access, found)


@login_required
@require_POST
def grant_supersede(request: AuthedRequest, grant_id: int) -> HttpResponse:
    old, access = object_access(request, Perm.MANAGE, Grant.objects.all(), grant_id, current=True)
    form = GrantForm(request.POST)
    if not form.is_valid():
        return _grant_page(request, access, old, form=form, status=400)
    try:
        new = grants.grant_supersede(grant=old, actor=actor_of(request), terms=form.terms())
    except grants.GrantClosed as exc:
        messages.error(request, str(exc))
        return redirect(old)
    messages.success(request, f"Version {new.version} supersedes version {old.version}.")
    return redirect(new)


@login_required
@require_POST
def grant_revoke(request: AuthedRequest, grant_id: int) -> HttpResponse:
    grant, access = object_access(request, Perm.MANAGE, Grant.objects.all(), grant_id, current=True)
    form = RevokeForm(request.POST)
    if not form.is_valid():
        return _grant_page(request, access, grant, revoke=form, status=400)
    try:
        grants.grant_revoke(grant=grant, actor=actor_of(request), note=form.cleaned_data["note"])
    except grants.GrantClosed as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Grant {grant.pk} revoked: intents naming it are denied.")
    return redirect(grant)


# -- webhook sources ---------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def webhook_sources(request: AuthedRequest) -> HttpResponse:
    """The project's webhook sources; admins add them and see their secrets."""
    access = project_access(request, Perm.MANAGE)
    form = WebhookSourceForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            source = webhook_source_services.webhook_source_create(
                project=access.project,
                actor=actor_of(request),
                name=data["name"],
                kind=WebhookKind(data["kind"]),
                system=data["system"],
                mapping=data["mapping"],
                tolerance_s=data["tolerance_s"],
            )
        except IntegrityError:
            # A new source can break one constraint, its name's; any other refusal (its
            # project's foreign key: the project deleted under the write) is not the form's
            # to explain, and the access middleware answers it.
            if not WebhookSource.objects.filter(name=data["name"]).exists():
                raise
            form.add_error("name", "A webhook source of that name exists already.")
        else:
            messages.success(request, f"Webhook source {source.name} created.")
            return redirect("webhook-sources")
    sources = list(
        WebhookSource.objects.filter(project=access.project)
        # Joined by project too: the deliveries' indexes lead with it (webhook_delivery_*).
        .annotate(
            own=FilteredRelation("deliveries", condition=Q(deliveries__project=access.project))
        )
        .annotate(delivery_count=Count("own"))
        .order_by("name")
    )
    return render(
        request,
        "durability/authority/webhooks.html",
        {
            "access": access,
            "sources": sources,
            "form": form,
            "base_url": request.build_absolute_uri("/hooks/"),
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_POST
def webhook_source_toggle(request: AuthedRequest, source_id: int) -> HttpResponse:
    source, _ = object_access(
        request, Perm.MANAGE, WebhookSource.objects.all(), source_id, current=True
    )
    webhook_source_services.webhook_source_enable(
        source=source, actor=actor_of(request), enabled=not source.enabled
    )
    return redirect("webhook-sources")


# -- the authority report ------------------------------------------------------------------


def _report_query(request: AuthedRequest) -> tuple[ReportForm, report.ReportQuery]:
    form = ReportForm(request.GET)
    query = form.query() if form.is_valid() else report.ReportQuery.default()
    return form, query


@login_required
@require_GET
def authority_report(request: AuthedRequest) -> HttpResponse:
    """The four quadrants for a time range and filters, and the effects behind them."""
    access = project_access(request, Perm.VIEW)
    form, query = _report_query(request)
    before = inbound.number_param(request.GET.get("before"))
    effects, next_before = report.page(access.project, query, before)
    counts = report.quadrant_counts(access.project, query)
    params = request.GET.copy()
    params.pop("before", None)
    params.pop("quadrant", None)
    quadrants = [
        {
            "name": name,
            "label": label,
            "count": counts[name],
            "current": name == query.quadrant,
            "qs": f"{params.urlencode()}&quadrant={name}".lstrip("&"),
        }
        for name, label in report.QUADRANTS
    ]
    following = request.GET.copy()
    following["before"] = str(next_before)
    context = {
        "access": access,
        "form": form,
        "query": query,
        "quadrants": quadrants,
        "header": report.HEADER,
        "rows": [(effect, report.line(effect)) for effect in effects],
        "orphans": report.orphan_rows(access.project, query) if before is None else [],
        "next_query": following.urlencode() if next_before else "",
        "filters": params.urlencode(),
        "here": request.GET.urlencode(),
    }
    return render(request, "durability/authority/report.html", context)


@login_required
@require_GET
def authority_report_csv(request: AuthedRequest) -> StreamingHttpResponse:
    """The table as CSV: the same filter, columns and order as the page; the page's rows
    when the link carries its cursor (`before`) and `page=1`, else every matching row."""
    access = project_access(request, Perm.VIEW)
    _, query = _report_query(request)
    before = inbound.number_param(request.GET.get("before"))
    effects = report.rows(access.project, query, before)
    page = request.GET.get("page") == "1"
    if page:
        effects = effects[: report.PAGE_SIZE]
    response = StreamingHttpResponse(
        exports.csv_lines(report.lines(effects)),
        content_type="text/csv; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="{_csv_name(query, before, page)}"'
    return response


def _csv_name(query: report.ReportQuery, before: int | None, page: bool) -> str:
    """A file name that tells one export from another: the range, the quadrant, and the
    page (and its cursor) or "all"."""
    since, until = query.since.astimezone(UTC), query.until.astimezone(UTC)
    parts = ["authority-audit", f"{since:%Y%m%d%H%M}-{until:%Y%m%d%H%M}"]
    if query.quadrant:
        parts.append(query.quadrant.replace("_", "-"))
    if page:
        parts.append(f"page-before-{before}" if before is not None else "page-1")
    else:
        parts.append("all")
    return "-".join(parts) + ".csv"


# -- approvals -----------------------------------------------------------------------------


@login_required
@require_GET
def approvals_inbox(request: AuthedRequest) -> HttpResponse:
    access = project_access(request, Perm.VIEW)
    return render(
        request,
        "durability/authority/approvals.html",
        {
            "access": access,
            "open": approvals.inbox(access.project),
            "decided": approvals.recently_decided(access.project),
        },
    )


def _approval_page(
    request: AuthedRequest,
    access: Access,
    approval: Approval,
    form: SignoffForm | None = None,
    status: int = 200,
) -> HttpResponse:
    signed = any(s.user_id == request.user.pk for s in approval.signoffs.all())
    context = {
        "access": access,
        "approval": approval,
        "effect": approval.effect,
        "form": form or SignoffForm(),
        "can_sign": access.can(Perm.RESOLVE) and approval.status == "open" and not signed,
        "signed": signed,
        "approved": sum(s.verdict == SignoffVerdict.APPROVE for s in approval.signoffs.all()),
    }
    return render(request, "durability/authority/approval.html", context, status=status)


@login_required
@require_GET
def approval(request: AuthedRequest, approval_id: int) -> HttpResponse:
    found, access = object_access(
        request, Perm.VIEW, approvals.approvals_shown(), approval_id, current=True
    )
    return _approval_page(request, access, found)


@login_required
@require_POST
def approval_sign(request: AuthedRequest, approval_id: int) -> HttpResponse:
    found, access = object_access(
        request, Perm.RESOLVE, approvals.approvals_shown(), approval_id, current=True
    )
    form = SignoffForm(request.POST)
    if not form.is_valid():
        return _approval_page(request, access, found, form=form, status=400)
    try:
        outcome = approvals.approval_sign(
            project=access.project,
            approval_id=found.pk,
            user=request.user,
            verdict=SignoffVerdict(form.cleaned_data["verdict"]),
            reason=form.cleaned_data["reason"],
        )
    except approvals.SignoffRefused as exc:
        form.add_error(None, str(exc))
        found = approvals.approvals_of(access.project).get(pk=found.pk)
        return _approval_page(request, access, found, form, status=409)
    if outcome.final:
        messages.success(request, f"Approval {found.pk} {outcome.approval.status}.")
    else:
        left = outcome.approval.needed - 1
        messages.success(request, f"Signed; {left} more approval from someone else is needed.")
    return redirect("approval", approval_id=found.pk)
