"""Selectors of the search page: effects, cases, approvals and runs of one project found by
what an operator has at hand — a key, an external id (order, message id, commit), a run or
trace id (a run's effects and cases too), an agent, a target, a reason, any text of a request
(as stored: redacted), of a verdict's reason, a comment or an approval's sign-off.

Each kind is found in tiers, best first (a whole key before a key that contains the text,
a key before a request that mentions it); a tier is one SELECT of the newest rows it
matches, limited, and a kind's tiers are one UNION ALL statement, so a page costs the same
few queries whatever matches. On PostgreSQL the text tiers use `ILIKE`, served by the
trigram indexes named `search_*` (migrations durability 0025 and 0038, trajectories 0004); SQLite
(the demo) scans with `LIKE`, which its small tables allow, a statement per tier (it takes
no LIMIT inside a UNION).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.db import connection, connections, router, transaction
from django.db.models import F, IntegerField, Q, QuerySet, TextField, Value
from django.db.models.functions import Cast
from django.db.models.lookups import IContains

from durability.models import (
    Approval,
    Case,
    Comment,
    Effect,
    Project,
    Reason,
    Receipt,
    Resolution,
    Signoff,
)
from trajectories.models import Run, RunTrace

# The longest text searched for: longer than any key or id, short enough to stay cheap.
MAX_LENGTH = 200
# Trigram indexes need three characters: a shorter text matches whole values only.
MIN_TEXT = 3
# Results per kind on the page, and on a kind's own page ("more").
TOP = 10
MORE = 100
# Rows each effect tier contributes: the cases found through effects come from these.
CANDIDATES = 50
KINDS = ("effects", "cases", "approvals", "runs")
# The rank of a row found by its own text (a verdict's reason, a comment, a sign-off's
# reason), after every row found through an effect.
TEXT_RANK = 100


class SearchForm(forms.Form):
    q = forms.CharField(
        max_length=MAX_LENGTH,
        strip=True,
        error_messages={
            "required": "Type what to look for: a key, an external id, a run id, an agent, "
            "a target or any text of a request.",
            "max_length": f"Search for at most {MAX_LENGTH} characters "
            "(%(show_value)d were given).",
        },
    )
    kind = forms.ChoiceField(
        choices=[("", "everything"), *((k, k) for k in KINDS)],
        required=False,
        error_messages={"invalid_choice": f"Search one of {', '.join(KINDS)}, or everything."},
    )


class Ilike(IContains):
    """`lhs ILIKE '%text%'` on PostgreSQL, which a trigram index serves (Django's
    `icontains` there is `UPPER(lhs::text) LIKE UPPER(…)`, which none does); `icontains`
    (`LIKE … ESCAPE`) elsewhere. The text's `%`, `_` and `\\` are escaped by IContains."""

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs_sql, lhs_params = compiler.compile(self.lhs)
        rhs_sql, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs_sql} ILIKE {rhs_sql}", [*lhs_params, *rhs_params]


def _contains(name: str, text: str) -> Ilike:
    return Ilike(F(name), text)


def _request_text() -> Cast:
    # The stored request as text: (request)::text, the expression search_effect_text_idx has.
    return Cast("request", TextField())


@dataclass
class Found:
    """One row found, why (the tier's words), and its rank (lower is better)."""

    row: Any
    matched: str
    rank: int


@dataclass
class Results:
    """What one kind found: the best rows, whether there are more, where they are."""

    found: list[Found] = field(default_factory=list)
    more: bool = False
    # A list page that holds every row of this kind the text names, when there is one:
    # (its filter's field, the value).
    filtered: tuple[str, str] | None = None
    # Every effect the tiers found, the best first: its id, and its rank and why (Found's).
    # The cases' candidates.
    candidates: dict[int, tuple[int, str]] = field(default_factory=dict)


def _ranked(
    tiers: list[tuple[str, QuerySet[Any]]], limit: int
) -> tuple[list[tuple[int, int]], bool]:
    """(id, tier) of the best `limit` distinct ids of the tiers, each tier's newest first,
    in one statement (on SQLite, one per tier); and whether more matched."""
    parts = [
        qs.annotate(tier=Value(n, output_field=IntegerField()))
        .values_list("id", "tier")
        .order_by("-id")[: limit + 1]
        for n, (_, qs) in enumerate(tiers)
    ]
    if connection.features.supports_slicing_ordering_in_compound:
        rows = list(parts[0].union(*parts[1:], all=True))
    else:  # SQLite: a statement per tier
        rows = [row for part in parts for row in part]
    full = any(sum(1 for _, t in rows if t == n) > limit for n in range(len(parts)))
    best: dict[int, int] = {}
    for pk, tier in sorted(rows, key=lambda row: (row[1], -row[0])):
        best.setdefault(pk, tier)
    ranked = list(best.items())
    return ranked[:limit], full or len(ranked) > limit


def _effect_tiers(project: Project, q: str) -> list[tuple[str, QuerySet[Any]]]:
    effects = Effect.objects.filter(project=project)
    receipts = Receipt.objects.filter(project=project)
    tiers: list[tuple[str, QuerySet[Any]]] = [
        ("key", effects.filter(key=q)),
        ("external id", _receipt_effects(effects, receipts.filter(external_id=q))),
        # An agent's run: the effects it made (effect_of_run_idx).
        ("run id", effects.filter(run_id=q)),
    ]
    if len(q) >= MIN_TEXT:
        tiers += [
            ("key", effects.filter(_contains("key", q))),
            (
                "external id",
                _receipt_effects(effects, receipts.filter(_contains("external_id", q))),
            ),
            ("target or agent", effects.filter(_contains("target", q) | _contains("agent", q))),
            ("request", effects.annotate(text=_request_text()).filter(_contains("text", q))),
        ]
    return tiers


def _receipt_effects(effects: QuerySet[Effect], receipts: QuerySet[Receipt]) -> QuerySet[Any]:
    """The effects (of the project's `effects`) of `receipts`, as a tier."""
    return effects.filter(pk__in=receipts.values("effect_id"))


def search_effects(project: Project, q: str, limit: int) -> Results:
    """The effects whose key, receipts' external ids, target, agent or stored request
    name `q`. Two queries."""
    tiers = _effect_tiers(project, q)
    ranked, more = _ranked(tiers, max(limit, CANDIDATES))
    shown = ranked[:limit]
    rows = Effect.objects.in_bulk([pk for pk, _ in shown])
    results = Results(
        [Found(rows[pk], tiers[tier][0], tier) for pk, tier in shown if pk in rows],
        more or len(ranked) > limit,
        candidates={pk: (tier, tiers[tier][0]) for pk, tier in ranked},
    )
    for name in ("target", "agent"):
        if any(getattr(f.row, name) == q for f in results.found):
            results.filtered = (name, q)
            break
    return results


def reason_of(q: str) -> str | None:
    """The case reason `q` names (`late success`, `Late-Success`), if it names one."""
    name = q.strip().lower().replace(" ", "_").replace("-", "_")
    return name if name in Reason.values else None


def _case_tiers(project: Project, q: str) -> list[tuple[str, QuerySet[Any]]]:
    """The cases found by what is theirs: their run (case_of_run_idx), the reason of the
    verdict that closed them, their comments (the trigram indexes search_resolution_note_idx,
    search_comment_body_idx)."""
    cases = Case.objects.filter(project=project)
    tiers: list[tuple[str, QuerySet[Any]]] = [("run id", cases.filter(run_id=q))]
    if len(q) >= MIN_TEXT:
        notes = Resolution.objects.filter(project=project).filter(_contains("note", q))
        comments = Comment.objects.filter(project=project).filter(_contains("body", q))
        tiers += [
            ("verdict's reason", cases.filter(pk__in=notes.values("case_id"))),
            ("comment", cases.filter(pk__in=comments.values("case_id"))),
        ]
    return tiers


def search_cases(project: Project, q: str, limit: int, effects: Results) -> Results:
    """The cases of the effects found (ranked as their effect), those found by their own run,
    verdict reason or comments, then those of the reason `q` names, open before closed. Two
    queries (the cases' tiers, the rows), three with a reason."""
    found: list[Found] = []
    tiers = _case_tiers(project, q)
    ranked, more = _ranked(tiers, limit)
    own = dict(ranked)
    cases = Case.objects.filter(project=project).select_related("effect")
    if effects.candidates or own:
        named = cases.filter(Q(effect_id__in=list(effects.candidates)) | Q(pk__in=list(own)))
        for case in named:
            ranks = []
            if case.pk in own:
                tier = own[case.pk]
                # A case's own run ranks with an effect's key; its texts after every effect.
                ranks.append((tier and TEXT_RANK + tier, tiers[tier][0]))
            if case.effect_id in effects.candidates:
                tier, matched = effects.candidates[case.effect_id]
                ranks.append((tier, f"effect's {matched}"))
            rank, matched = min(ranks)
            found.append(Found(case, matched, rank))
    reason = reason_of(q)
    if reason:
        latest = list(
            cases.filter(reason=reason, closed=None).order_by("-opened", "-id")[: limit + 1]
        )
        more = more or len(latest) > limit
        seen = {f.row.pk for f in found}
        found += [Found(c, "reason", -1) for c in latest if c.pk not in seen]
    found.sort(key=lambda f: (f.rank, not f.row.is_open, -f.row.opened.timestamp(), -f.row.pk))
    results = Results(found[:limit], more or len(found) > limit)
    if reason:
        results.filtered = ("reason", reason)
    else:
        for name in ("target", "agent"):
            if any(getattr(f.row, name) == q for f in results.found):
                results.filtered = ("workflow" if name == "agent" else name, q)
                break
    return results


def search_approvals(project: Project, q: str, limit: int, effects: Results) -> Results:
    """The approvals of the effects found (ranked as their effect), then those whose sign-offs'
    reasons contain `q` (search_signoff_reason_idx). One query."""
    named = Q(effect_id__in=list(effects.candidates))
    if len(q) >= MIN_TEXT:
        signed = Signoff.objects.filter(_contains("reason", q)).values("approval_id")
        named |= Q(pk__in=signed)
    rows = (
        Approval.objects.filter(named, project=project)
        .select_related("effect")
        .order_by("-id")[: max(limit, CANDIDATES) + 1]
    )
    found = []
    for approval in rows:
        tier = effects.candidates.get(approval.effect_id)
        if tier is not None:
            found.append(Found(approval, f"effect's {tier[1]}", tier[0]))
        else:
            found.append(Found(approval, "sign-off's reason", TEXT_RANK))
    found.sort(key=lambda f: (f.rank, -f.row.pk))
    return Results(found[:limit], len(found) > limit)


def _run_tiers(project: Project, q: str) -> list[tuple[str, QuerySet[Any]]]:
    runs = Run.objects.filter(project=project)
    traces = RunTrace.objects.filter(project=project)
    tiers: list[tuple[str, QuerySet[Any]]] = [
        ("run id", runs.filter(run_id=q)),
        ("trace id", runs.filter(pk__in=traces.filter(trace_id=q).values("run_id"))),
    ]
    if len(q) >= MIN_TEXT:
        tiers += [
            ("run id", runs.filter(_contains("run_id", q))),
            (
                "trace id",
                runs.filter(pk__in=traces.filter(_contains("trace_id", q)).values("run_id")),
            ),
            ("agent or workflow", runs.filter(_contains("agent", q) | _contains("workflow", q))),
        ]
    return tiers


def search_runs(project: Project, q: str, limit: int) -> Results:
    """The runs whose run id, trace ids, agent or workflow name `q`. Two queries."""
    tiers = _run_tiers(project, q)
    ranked, more = _ranked(tiers, limit)
    rows = Run.objects.in_bulk([pk for pk, _ in ranked])
    results = Results([Found(rows[pk], tiers[t][0], t) for pk, t in ranked if pk in rows], more)
    if any(f.row.agent == q for f in results.found):
        results.filtered = ("agent", q)
    return results


@contextmanager
def _planned_for_their_values() -> Iterator[None]:
    """On PostgreSQL, each statement planned for the text it has: a prepared statement gets
    a generic plan after its fifth run, which cannot know how rare the text is, and read
    a million effects newest first for a text that none has (0.1 ms planned for the text,
    137 ms generic, at 20,000). One statement more, in the transaction it is LOCAL to, on
    the database the router reads effects from: the replica for a page that may read it (a
    transaction on the primary would keep every read of the search there)."""
    using = router.db_for_read(Effect)
    if connections[using].vendor != "postgresql":
        yield
        return
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        yield


def search(project: Project, q: str, kind: str = "") -> dict[str, Results]:
    """What each kind (or the one `kind`) finds for `q`: the best `TOP` of each, or `MORE`
    of one kind. At most seven queries, whatever matches, in one transaction."""
    limit = MORE if kind else TOP
    wanted = [kind] if kind else list(KINDS)
    with _planned_for_their_values():
        return _search(project, q, limit, wanted)


def _search(project: Project, q: str, limit: int, wanted: list[str]) -> dict[str, Results]:
    found: dict[str, Results] = {}
    if {"effects", "cases", "approvals"} & set(wanted):
        found["effects"] = search_effects(project, q, limit)
    if "cases" in wanted:
        found["cases"] = search_cases(project, q, limit, found["effects"])
    if "approvals" in wanted:
        found["approvals"] = search_approvals(project, q, limit, found["effects"])
    if "runs" in wanted:
        found["runs"] = search_runs(project, q, limit)
    return {k: found[k] for k in wanted}


def by_id(project: Project, q: str) -> list[tuple[str, Any]]:
    """The case, effect and approval of the project a number names (`24`, `#24`), each as
    (kind, row). Three queries for a number, none otherwise."""
    text = q.strip().removeprefix("#")
    if not text.isdigit() or len(text) > 18:
        return []
    pk = int(text)
    found: list[tuple[str, Any]] = []
    for kind, model in (("case", Case), ("effect", Effect), ("approval", Approval)):
        row = model.objects.filter(project=project, pk=pk).first()
        if row is not None:
            found.append((kind, row))
    return found
