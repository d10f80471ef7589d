"""The reconciliation desk's pages: the queue, a case, bulk actions, the audit log.

Every view needs a login, and its first line asks the access helper (durability.accounts.access)
for the project and the permission; every action is carried out by a service
(durability.desk.case_actions), which writes the audit entry with the user as actor
`user:<username>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpResponse, HttpResponseBase, HttpResponseRedirect, QueryDict
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from durability import inbound, jobs
from durability.accounts.access import (
    AuthedRequest,
    NoProject,
    actor_of,
    object_access,
    project_access,
    require,
)
from durability.accounts.roles import Access, Perm
from durability.desk import case_actions, saved_views
from durability.desk import jobs as desk_jobs
from durability.desk.effect_filter import EffectFilter, EffectQuery
from durability.desk.forms import (
    ACKNOWLEDGE,
    RESOLVE_CHOICES,
    AssignForm,
    AuditFilter,
    BulkForm,
    CommentForm,
    ResolveForm,
    SavedViewForm,
    SnoozeForm,
    offered,
)
from durability.desk.queue import (
    TREND_HOURS,
    QueueFilter,
    QueueQuery,
    counts_by_reason,
    group_count,
    groups_page,
    is_snoozed,
    next_case,
    open_cases,
    page_of,
    rows_of,
)
from durability.desk.story import effect_story, failure_of, story_of
from durability.ledger import decisions, grant_check, machine
from durability.models import (
    ApiKey,
    AuditAction,
    AuditEntry,
    BulkAction,
    BulkVerb,
    Case,
    Effect,
    Reason,
    Receipt,
    State,
)
from durability.paging import Keyset

AUDIT_PAGE_SIZE = 100
EFFECTS_PAGE_SIZE = 50
# The audit log and the effects list: newest first, keyset on id (`?before=<id>`).
NEWEST = Keyset("-id")
# Audit actions that change what a queue row shows.
PULSE_ACTIONS = (AuditAction.CASE_OPENED, AuditAction.CASE_CLOSED, AuditAction.CASE_ASSIGNED)
# The queue page and its fragments, each a partial of the page.
QUEUE = "durability/desk/queue.html"
BULK_PREVIEW = f"{QUEUE}#bulk_preview"
BULK_PROGRESS = f"{QUEUE}#bulk_progress"
# What a case page and an effect page show, loaded with the object.
CASE_PAGE = Case.objects.select_related(
    "effect", "effect__grant", "project", "assignee", "receipt", "resolution"
)
# The effects list's open-cases column: a subquery of the list's one query, not one per row.
OPEN_CASES = Coalesce(
    Subquery(
        Case.objects.filter(project=OuterRef("project_id"), effect=OuterRef("pk"), closed=None)
        .order_by()
        .values("effect")
        .annotate(n=Count("id"))
        .values("n")
    ),
    0,
)
# Its attempts, receipts and cases are read by its story (story.effect_parts).
EFFECT_PAGE = Effect.objects.select_related("project", "grant")


# -- the queue ---------------------------------------------------------------------------


def _latest_audit_id(access: Access) -> int:
    return AuditEntry.objects.filter(project=access.project).aggregate(m=Max("id"))["m"] or 0


@login_required
@require_GET
def queue(request: AuthedRequest) -> HttpResponse:
    """Open cases, filtered from the URL, keyset-paginated, one row each or (`grouped`) one
    row per group of similar cases; htmx fetches further pages and a group's cases."""
    access = project_access(request, Perm.VIEW)
    return _queue_page(request, access, QueueQuery.from_params(request.GET))


def _queue_page(
    request: AuthedRequest,
    access: Access,
    query: QueueQuery,
    *,
    view_form: SavedViewForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context: dict[str, Any] = {"access": access, "query": query}
    if request.htmx and ("after" in query.values or "group" in query.values):
        # A further page, or the cases of a group the grouped queue expands.
        context |= _queue_list(request, access, query)
        return render(request, f"{QUEUE}#{'groups' if query.grouped else 'rows'}", context)
    context |= _queue_counted(request, access, query) | {
        "since": _latest_audit_id(access),
        "form": QueueFilter(initial=query.values),
        "reasons": Reason.choices,
        "members": case_actions.assignable_members(access.project),
        "bulk_verbs": BulkVerb.choices,
        "views": _saved_views(request, access, query),
        "view_form": view_form or SavedViewForm(),
        "can_share": access.can(saved_views.SHARE_PERM),
    }
    return render(request, QUEUE, context, status=status)


def _queue_list(request: AuthedRequest, access: Access, query: QueueQuery) -> dict[str, Any]:
    """The rows (or groups) of one page of the queue, and the query of the next."""
    shown = open_cases(access.project, query, request.user)
    context: dict[str, Any] = {}
    if query.grouped:
        groups, next_after = groups_page(shown, query)
        context |= {"groups": groups, "trend_hours": TREND_HOURS}
    else:
        rows, next_after = page_of(shown, query)
        context["rows"] = rows
    context["next_query"] = query.query_string(after=next_after) if next_after else ""
    return context


def _queue_counted(request: AuthedRequest, access: Access, query: QueueQuery) -> dict[str, Any]:
    """The queue's first page with its counts: what the page shows, and what a finished bulk
    action sends back to refresh it (heading, tab title, reason tabs and rows)."""
    counts, elsewhere = counts_by_reason(
        open_cases(access.project, query, request.user, reason=False, snooze="any"), query
    )
    reason = query.values.get("reason")
    return _queue_list(request, access, query) | {
        "tabs": _reason_tabs(query, counts),
        "total": counts[reason] if reason else sum(counts.values()),
        "group_total": (
            group_count(open_cases(access.project, query, request.user)) if query.grouped else None
        ),
        "all_groups_qs": query.query_string(group=None, grouped=True),
        # The Snoozed view's link counts the cases it would show.
        "snoozed_total": None if query.values.get("snoozed") else elsewhere,
        "unsnoozed_qs": query.query_string(snoozed=None),
        "snoozed_qs": query.query_string(snoozed=True),
    }


def _saved_views(request: AuthedRequest, access: Access, query: QueueQuery) -> list[dict[str, Any]]:
    """The user's views of this project, each marked if it is the filter shown now."""
    shown = query.query_string()
    return [
        {
            "view": view,
            "current": view.query == shown,
            "deletable": saved_views.may_delete(access, request.user, view),
        }
        for view in saved_views.views_for(access.project, request.user)
    ]


def _reason_tabs(query: QueueQuery, counts: dict[str, int]) -> list[dict[str, Any]]:
    """Links to the queue filtered by each reason that has open cases, with their counts."""
    current = query.values.get("reason")
    tabs = [
        {
            "label": "all",
            "count": sum(counts.values()),
            "current": not current,
            "qs": query.query_string(reason=None),
        }
    ]
    tabs += [
        {
            "label": reason,
            "count": n,
            "current": reason == current,
            "qs": query.query_string(reason=reason),
        }
        for reason, n in counts.items()
        if n or reason == current
    ]
    return tabs


@login_required
@require_GET
def queue_pulse(request: AuthedRequest) -> HttpResponse:
    """What changed since the page loaded: rows closed or reassigned elsewhere, new cases."""
    try:
        access = project_access(request, Perm.VIEW)
    except NoProject:
        return HttpResponse(status=204)  # the polling page's user has left every project
    query = QueueQuery.from_params(request.GET)
    since, fresh = (inbound.number_param(request.GET.get(name)) or 0 for name in ("since", "new"))
    latest = _latest_audit_id(access)
    changes = list(
        AuditEntry.objects.filter(
            project=access.project, id__gt=since, id__lte=latest, action__in=PULSE_ACTIONS
        ).values_list("action", "case_id")
    )
    opened = [case_id for action, case_id in changes if action == AuditAction.CASE_OPENED]
    if opened:
        # Only the new cases this filter shows: "Show" would find no other.
        fresh += open_cases(access.project, query, request.user).filter(pk__in=opened).count()
    # Rows only for the cases the page shows (`shown`, sent by static/durability/desk.js):
    # htmx has nowhere to put another, and logs an error for each.
    shown = _ids_param(request.GET.get("shown"))
    changed = sorted(
        {case_id for action, case_id in changes if action != AuditAction.CASE_OPENED} & shown
    )
    counts, _ = counts_by_reason(
        open_cases(access.project, query, request.user, reason=False, snooze="any"), query
    )
    context = {
        "access": access,
        "query": query,
        "since": latest,
        "fresh": fresh,
        "changed": rows_of(access.project, changed),
        "tabs": _reason_tabs(query, counts),
    }
    return render(request, f"{QUEUE}#pulse", context)


def _ids_param(value: str | None) -> set[int]:
    """The ids of a parameter like `3.17.42`; what is not an id is left out."""
    found = (inbound.number_param(part) for part in (value or "").split("."))
    return {n for n in found if n is not None}


# -- saved views -------------------------------------------------------------------------


@login_required
@require_POST
def view_save(request: AuthedRequest) -> HttpResponse:
    """Save the queue's filter under a name (sent with it): the user's, or shared."""
    access = project_access(request, Perm.VIEW)
    form = SavedViewForm(request.POST)
    shown = QueueQuery.from_params(QueryDict(request.POST.get("filter", "")))
    if form.is_valid() and form.cleaned_data["shared"] and not access.can(saved_views.SHARE_PERM):
        form.add_error(
            "shared", f"Your role ({access.role}) can save views for yourself, not share them."
        )
    if not form.is_valid():
        return _queue_page(request, access, shown, view_form=form, status=400)
    view = saved_views.view_save(
        access=access,
        owner=request.user,
        name=form.cleaned_data["name"],
        query=form.cleaned_data["filter"],
        shared=form.cleaned_data["shared"],
    )
    messages.success(request, f"View “{view.name}” saved.")
    return redirect(view.get_absolute_url())


@login_required
@require_POST
def view_delete(request: AuthedRequest, view_id: int) -> HttpResponse:
    """Delete a saved view: one's own, or (an admin) a shared one; back to the queue."""
    mine = saved_views.views_for_anyone(request.user)
    view, access = object_access(request, Perm.VIEW, mine, view_id, current=True)
    if not saved_views.may_delete(access, request.user, view):
        raise PermissionDenied("Only its owner or a project admin can delete a shared view.")
    view.delete()
    messages.success(request, f"View “{view.name}” deleted.")
    return redirect(QueueQuery.came_from(request.GET).url())


# -- bulk actions --------------------------------------------------------------------------


def _bulk_scope(request: AuthedRequest, access: Access, form: BulkForm) -> tuple[int, list[int]]:
    """How many cases the bulk form names, and the ids of those its verb can act on."""
    query = QueueQuery.from_params(request.POST if request.method == "POST" else request.GET)
    named = open_cases(access.project, query, request.user)
    if form.cleaned_data["scope"] == "selected":
        # The ticked cases, and the open cases under the filter of each ticked group.
        picked = Q(pk__in=form.cleaned_data["case"])
        if groups := form.cleaned_data["case_group"]:
            picked |= Q(pk__in=named.filter(group_key__in=groups).values("pk"))
        named = Case.objects.filter(picked, project=access.project)
    eligible = case_actions.bulk_eligible(named, BulkVerb(form.cleaned_data["verb"]))
    ids = list(eligible.order_by("opened", "id").values_list("id", flat=True))
    return named.count(), ids


def _member(access: Access, request: AuthedRequest, name: str) -> User | None:
    """The member "me" or a username stands for, if they may act on the project's cases."""
    if name == "me":
        return request.user
    return case_actions.assignable_members(access.project).filter(username=name).first()


BULK_PERMS = {
    BulkVerb.ASSIGN: Perm.ASSIGN,
    BulkVerb.NOT_HAPPENED: Perm.RESOLVE,
    BulkVerb.ACKNOWLEDGE: Perm.RESOLVE,
}


@login_required
@require_GET
def bulk_preview(request: AuthedRequest) -> HttpResponse:
    """How many cases a bulk action would touch, before anything is done."""
    access = project_access(request, Perm.VIEW)
    form = BulkForm(request.GET)
    context: dict[str, Any] = {"form": form, "access": access}
    if form.is_valid():
        verb = BulkVerb(form.cleaned_data["verb"])
        named, ids = _bulk_scope(request, access, form)
        context |= {
            "verb": verb,
            "named": named,
            "eligible": len(ids),
            "left_alone": named - len(ids),
            "allowed": access.can(BULK_PERMS[verb]),
            "background": len(ids) > settings.TALLYBOOK_BULK_INLINE,
        }
    return render(request, BULK_PREVIEW, context)


@login_required
@require_POST
def bulk_start(request: AuthedRequest) -> HttpResponse:
    """Confirm a bulk action: small ones run now, large ones as a job watched by progress."""
    access = project_access(request, Perm.VIEW)
    form = BulkForm(request.POST)
    if not form.is_valid():
        return render(request, BULK_PREVIEW, {"form": form}, status=400)
    verb = BulkVerb(form.cleaned_data["verb"])
    require(access, BULK_PERMS[verb])
    assignee = None
    if verb == BulkVerb.ASSIGN:
        assignee = _member(access, request, form.cleaned_data["assign_to"])
        if assignee is None:
            form.add_error("assign_to", "Not a member who can act on this project's cases.")
            return render(request, BULK_PREVIEW, {"form": form}, status=400)
    _, ids = _bulk_scope(request, access, form)
    bulk = case_actions.bulk_start(
        project=access.project,
        actor=actor_of(request),
        verb=verb,
        case_ids=ids,
        note=form.cleaned_data["note"],
        assignee=assignee,
    )
    if bulk.total <= settings.TALLYBOOK_BULK_INLINE:
        bulk = case_actions.bulk_run(bulk_id=bulk.pk)
    else:
        jobs.enqueue(desk_jobs.cases_bulk, bulk.pk)
    # The progress keeps the queue's filter, for the queue it leads back to.
    return _bulk_progress(request, access, bulk, QueueQuery.from_params(request.POST))


@login_required
@require_GET
def bulk_progress(request: AuthedRequest, bulk_id: int) -> HttpResponse:
    bulk, access = object_access(request, Perm.VIEW, BulkAction.objects.all(), bulk_id)
    return _bulk_progress(request, access, bulk, QueueQuery.from_params(request.GET))


def _bulk_progress(
    request: AuthedRequest, access: Access, bulk: BulkAction, query: QueueQuery
) -> HttpResponse:
    """A bulk action's progress; once finished, with the queue as it is now (its heading,
    tab title, reason tabs and rows, swapped in out of band): counts stay true."""
    context: dict[str, Any] = {"bulk": bulk, "query": query, "access": access}
    if bulk.finished:
        context |= _queue_counted(request, access, query) | {"refresh": True}
    return render(request, BULK_PROGRESS, context)


# -- a case ------------------------------------------------------------------------------


def _case_page(
    request: AuthedRequest,
    case: Case,
    access: Access,
    *,
    status: int = 200,
    **forms: Any,
) -> HttpResponse:
    effect = case.effect
    context = {
        "case": case,
        "queue": QueueQuery.came_from(request.GET),
        "effect": effect,
        "access": access,
        "story": story_of(case),
        "outcome": decisions.decide(effect) if effect else None,
        "verdict_options": _verdict_options(case),
        "attest": case_actions.Verdict.HAPPENED in case_actions.verdicts_for(case),
        "members": case_actions.assignable_members(access.project),
        "siblings": (
            effect.cases.filter(project_id=effect.project_id, closed=None)
            .exclude(pk=case.pk)
            .order_by("opened")
            if effect
            else []
        ),
        "figures": _figures(case),
        "resolve_form": forms.get("resolve_form") or ResolveForm(initial={"version": case.version}),
        "comment_form": forms.get("comment_form") or CommentForm(),
        "snooze_form": forms.get("snooze_form") or SnoozeForm(),
        "snoozed": case.is_open and is_snoozed(case),
    }
    return render(request, "durability/desk/case.html", context, status=status)


def _figures(case: Case) -> grant_check.Figures | None:
    """An `authority_exceeded` case's figures: the grant's limits, the intent's amount and
    those of the receipts that exceeded them (the case's, and any it repeated for)."""
    if case.reason != Reason.AUTHORITY_EXCEEDED or case.effect is None:
        return None
    named = [case.receipt_id, *(r.get("evidence") for r in case.detail.get("repeats", []))]
    found = Receipt.objects.in_bulk([pk for pk in named if pk is not None])
    receipts = [found[pk] for pk in dict.fromkeys(named) if pk in found]
    return grant_check.exceeded_figures(case.effect, receipts)


def _case_url(request: AuthedRequest, case: Case) -> str:
    """The case page, still leading back to the queue it was opened from."""
    return case.get_absolute_url() + QueueQuery.came_from(request.GET).origin


# The key that picks each verdict on the case page (static/durability/desk.js).
VERDICT_KEYS = {
    case_actions.Verdict.HAPPENED: "h",
    case_actions.Verdict.NOT_HAPPENED: "n",
    case_actions.Verdict.COMPENSATED: "c",
    case_actions.Verdict.ABANDONED: "b",
    ACKNOWLEDGE: "e",
}


def _verdict_options(case: Case) -> list[tuple[str, str, str]]:
    """(value, label, key) of each verdict the case allows now, acknowledging last."""
    allowed = set(offered(case))
    return [
        (value, str(label), VERDICT_KEYS[value])
        for value, label in RESOLVE_CHOICES
        if value in allowed
    ]


def _refused(request: AuthedRequest, case: Case, problem: str) -> HttpResponseRedirect:
    """A refused action: back to the case as it is now, with why (a message), so that the
    address is the case's and reloading it does not post the form again. 303 See Other, not
    the 302 of a change made."""
    messages.error(request, problem)
    return HttpResponseRedirect(_case_url(request, case), status=303)


@login_required
@require_GET
def case(request: AuthedRequest, case_id: int) -> HttpResponse:
    found, access = object_access(request, Perm.VIEW, CASE_PAGE, case_id)
    return _case_page(request, found, access)


@login_required
@require_POST
def case_resolve(request: AuthedRequest, case_id: int) -> HttpResponseBase:
    """A verdict (happened, did not happen, compensated, abandoned) or an acknowledgement."""
    found, access = object_access(request, Perm.RESOLVE, CASE_PAGE, case_id)
    form = ResolveForm(request.POST, case=found)
    if not form.is_valid():
        return _case_page(request, found, access, status=400, resolve_form=form)
    data = form.cleaned_data
    try:
        if data["verdict"] == ACKNOWLEDGE:
            case_actions.case_acknowledge(
                project=access.project,
                case_id=found.pk,
                version=data["version"],
                actor=actor_of(request),
                note=data["note"],
            )
        else:
            case_actions.case_resolve(
                project=access.project,
                case_id=found.pk,
                version=data["version"],
                actor=actor_of(request),
                verdict=case_actions.Verdict(data["verdict"]),
                note=data["note"],
                evidence=form.evidence(),
            )
    except (case_actions.CaseChanged, case_actions.NotApplicable, machine.IllegalTransition) as exc:
        return _refused(request, found, str(exc))
    choice = dict(form.fields["verdict"].choices)[data["verdict"]]  # type: ignore[attr-defined]
    messages.success(request, f"Case #{found.pk} closed: {str(choice).lower()}.")
    if data["then"] == "next":
        return _next_of(request, access, found)
    return redirect(_case_url(request, found))


def _next_of(request: AuthedRequest, access: Access, case: Case) -> HttpResponseRedirect:
    """To the open case after `case` in the queue it was opened from, still leading back to
    that queue; to the queue itself after its last."""
    queue = QueueQuery.came_from(request.GET)
    following = next_case(access.project, queue, request.user, case)
    if following is None:
        messages.info(request, "That was the last open case of this queue.")
        return HttpResponseRedirect(queue.url())
    return HttpResponseRedirect(following.get_absolute_url() + queue.origin)


@login_required
@require_GET
def case_next(request: AuthedRequest, case_id: int) -> HttpResponseRedirect:
    """Skip: the next open case of the queue this one was opened from (`?from=`)."""
    found, access = object_access(request, Perm.VIEW, Case.objects.all(), case_id)
    return _next_of(request, access, found)


@login_required
@require_POST
def case_assign(request: AuthedRequest, case_id: int) -> HttpResponseBase:
    """Assign a case (from its page, or from a queue row over htmx)."""
    found, access = object_access(request, Perm.ASSIGN, CASE_PAGE, case_id)
    form = AssignForm(request.POST)
    problem = ""
    if not form.is_valid():
        problem = "The assignment was incomplete; reload the page."
    else:
        name = form.cleaned_data["assignee"]
        assignee = _member(access, request, name) if name else None
        try:
            if name and assignee is None:
                raise case_actions.NotApplicable(f"{name} cannot act on this project's cases.")
            case_actions.case_assign(
                project=access.project,
                case_id=found.pk,
                version=form.cleaned_data["version"],
                actor=actor_of(request),
                assignee=assignee,
            )
        except (case_actions.CaseChanged, case_actions.NotApplicable) as exc:
            problem = str(exc)
    if request.htmx:
        # The queue row, changed or not, with the problem shown in it.
        row = rows_of(access.project, [found.pk])[0]
        return render(
            request,
            f"{QUEUE}#row",
            {
                "case": row,
                "access": access,
                "problem": problem,
                "query": QueueQuery.came_from(request.GET),
            },
        )
    if problem:
        return _refused(request, found, problem)
    messages.success(request, f"Case #{found.pk} assigned.")
    return redirect(_case_url(request, found))


@login_required
@require_POST
def case_snooze(request: AuthedRequest, case_id: int) -> HttpResponseBase:
    """Snooze a case until a time or until it happens again; or (`unsnooze`) bring it back."""
    found, access = object_access(request, Perm.RESOLVE, CASE_PAGE, case_id)
    form = SnoozeForm(request.POST)
    unsnooze = "unsnooze" in request.POST
    if not unsnooze and not form.is_valid():
        return _case_page(request, found, access, status=400, snooze_form=form)
    version = inbound.number_param(request.POST.get("version")) or 0
    try:
        if unsnooze:
            case_actions.case_unsnooze(
                project=access.project, case_id=found.pk, version=version, actor=actor_of(request)
            )
            messages.success(request, f"Case #{found.pk} is back in the queue.")
        else:
            now = timezone.now()
            case_actions.case_snooze(
                project=access.project,
                case_id=found.pk,
                version=version,
                actor=actor_of(request),
                until=form.until_time(now),
                now=now,
            )
            messages.success(request, f"Case #{found.pk} snoozed.")
    except (case_actions.CaseChanged, case_actions.NotApplicable) as exc:
        return _refused(request, found, str(exc))
    return redirect(_case_url(request, found))


@login_required
@require_POST
def case_comment(request: AuthedRequest, case_id: int) -> HttpResponseBase:
    found, access = object_access(request, Perm.COMMENT, CASE_PAGE, case_id)
    form = CommentForm(request.POST)
    if not form.is_valid():
        return _case_page(request, found, access, status=400, comment_form=form)
    case_actions.case_comment(
        project=access.project,
        case_id=found.pk,
        actor=actor_of(request),
        body=form.cleaned_data["body"],
    )
    messages.success(request, "Comment added.")
    return redirect(_case_url(request, found) + "#comment")


# -- the audit log -----------------------------------------------------------------------


@login_required
@require_GET
def audit(request: AuthedRequest) -> HttpResponse:
    """The current project's audit entries, newest first, filtered; keyset on id."""
    access = project_access(request, Perm.VIEW_AUDIT)
    form = AuditFilter(request.GET)
    form.is_valid()
    f = {k: v for k, v in form.cleaned_data.items() if v not in ("", None)}
    qs = AuditEntry.objects.filter(project=access.project)
    if "actor" in f:
        qs = qs.filter(actor=f["actor"])
    if "effect" in f:
        # A key, or an id (a key may be digits too: either matches).
        named = Q(effect__key=f["effect"])
        if (pk := inbound.number_param(f["effect"])) is not None:
            named |= Q(effect_id=pk)
        qs = qs.filter(named)
    if "action" in f:
        qs = qs.filter(action=f["action"])
    if "since" in f:
        qs = qs.filter(at__gte=f["since"])
    if "until" in f:
        qs = qs.filter(at__lt=f["until"])
    position = (f["before"],) if "before" in f else None
    page = NEWEST.page(qs.annotate(effect_key=F("effect__key")), position, AUDIT_PAGE_SIZE)
    params = request.GET.copy()
    params.pop("before", None)
    if next_before := page.next(lambda entry: entry.pk):
        params["before"] = str(next_before)
    context = {
        "access": access,
        "form": form,
        "entries": list(zip(page.rows, _actor_names(access, page.rows), strict=True)),
        "next_query": params.urlencode() if next_before else "",
        "filtered": bool(set(f) - {"before"}),
        "actions": AuditAction.values,
    }
    template = "durability/desk/audit.html"
    if request.htmx and "before" in f:
        template += "#entries"
    return render(request, template, context)


def _actor_names(access: Access, entries: Sequence[AuditEntry]) -> list[str]:
    """The actor of each entry as the page shows it: an API key by its name ("demo agents
    (key tb_…)"), any other as recorded (`user:alice`, the filter's words); one query for the
    page's keys."""
    keys = ApiKey.names(access.project.pk, (e.actor for e in entries))
    named = []
    for e in entries:
        kind, _, name = e.actor.partition(":")
        named.append(f"{keys[name]} (key {name}…)" if kind == "api" and name in keys else e.actor)
    return named


# -- effects ----------------------------------------------------------------------------


@login_required
def effects(request: AuthedRequest) -> HttpResponse:
    """Effects of all the user's projects newest first, filtered from the URL (`?project=`
    and more: durability.desk.effect_filter), keyset-paginated on id (`?before=<id>`)."""
    project_access(request, Perm.VIEW)
    query = EffectQuery.from_params(request.GET)
    mine = Effect.objects.filter(project__members=request.user)
    qs = query.apply(mine.select_related("project").annotate(open_cases=OPEN_CASES))
    state = query.values.get("state", "")
    before = inbound.number_param(request.GET.get("before"))
    page = NEWEST.page(qs, None if before is None else (before,), EFFECTS_PAGE_SIZE)
    next_before = page.next(lambda effect: effect.pk)
    context = {
        "effects": page.rows,
        "state": state,
        # Each state tab keeps every other filter (and drops the cursor).
        "tabs": [("all", query.query_string(state=None), not state)]
        + [(s, query.query_string(state=s), s == state) for s in State.values],
        "query": query,
        "form": EffectFilter(initial=query.values),
        # The filter's fields the form does not show, kept when it is applied.
        "kept": [(k, v) for k, v in query.params() if k not in EffectFilter.IN_PAGE],
        "next_before": next_before,
        "next_query": query.query_string(before=next_before) if next_before else "",
    }
    template = "durability/desk/effects.html"
    if request.htmx and before:
        template += "#rows"
    return render(request, template, context)


@login_required
def effect(request: AuthedRequest, effect_id: int) -> HttpResponse:
    """An effect: its facts, its story (the case page's), why it failed, its cases."""
    found, access = object_access(request, Perm.VIEW, EFFECT_PAGE, effect_id)
    story = effect_story(found)
    context = {
        "access": access,
        "effect": found,
        "outcome": decisions.decide(found),
        "story": story,
        "failure": failure_of(story),
    }
    return render(request, "durability/desk/effect.html", context)
