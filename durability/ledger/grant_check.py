"""Authority in the ledger: the grant check an intent gets, and evidence compared with its grant.

The ledger asks `authority_check` before it records a new effect (ledger.intents) and
`evidence_finding` after it stores a receipt (ledger.evidence), and applies what they
answer; nothing here changes an effect. Grants themselves change only through the
audited services of durability.authority.grants: a grant is never edited in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from babel.numbers import format_currency, format_decimal
from django.db.models import Count, Q, Sum
from django.utils import timezone

from durability.ledger.commands import Intent
from durability.ledger.decisions import UNREAD, Unread
from durability.models import (
    AuthorityPolicy,
    Effect,
    Grant,
    Project,
    Reason,
    Receipt,
    Severity,
    State,
)

DAY = timedelta(days=1)
# Effects that never touched the world do not count against a grant's limits.
UNSPENT = (State.DENIED, State.FAILED, State.NOT_HAPPENED)


class Rule(StrEnum):
    """Every rule a grant check can refuse by; the answer's reason names it."""

    NO_GRANT = "no_grant"
    UNKNOWN_GRANT = "unknown_grant"
    REVOKED = "revoked"
    EXPIRED = "expired"
    PRINCIPAL = "principal"
    KIND = "kind"
    TARGET = "target"
    AMOUNT_MISSING = "amount_missing"
    CURRENCY = "currency"
    MAX_AMOUNT = "max_amount"
    DAILY_AMOUNT = "daily_amount"
    COUNT = "count"


class Ruling(StrEnum):
    PROCEED = "proceed"
    APPROVAL = "approval"
    DENY = "deny"


@dataclass(frozen=True)
class Check:
    """What the grant check rules for a new intent, and why, in one sentence."""

    ruling: Ruling
    reason: str
    grant: Grant | None = None
    rule: Rule | None = None
    # For Ruling.APPROVAL: how many different people must approve.
    approvers: int = 0
    # Proceeds with no grant at all: the audit policy (`audit` or `audit_cases`) that let it.
    policy: AuthorityPolicy | None = None


def matches(patterns: list[str], value: str) -> bool:
    return any(fnmatchcase(value, pattern) for pattern in patterns)


def money(value: Decimal, currency: str) -> str:
    """An amount for people to read, with its currency's minor units from CLDR (Babel):
    `893.20 EUR`, `1,200 JPY`; digits beyond them are kept, never rounded away."""
    if not currency:
        return format_decimal(value, format="#,##0.##########", locale="en_US")
    return format_currency(
        value, currency, format="#,##0.00 ¤¤", locale="en_US", decimal_quantization=False
    )


def claimed_amount(value: Decimal, currency: str) -> str:
    """An amount as a claim holds it (`40 EUR`): its digest must not change with how pages
    show money, or every recorded key would conflict with its next intent."""
    return f"{value.normalize():f} {currency}"


def _principals(intent: Intent) -> list[str]:
    """The names an intent acts under: its context's agent and workflow."""
    context = intent.context
    return [v for k in ("agent", "workflow") if isinstance(v := context.get(k), str) and v]


def _current(named: Grant) -> Grant:
    if named.superseded_at is None:
        return named
    return Grant.objects.get(lineage=named.lineage, superseded_at=None)


def _spent(grant: Grant, now: datetime) -> tuple[Decimal, int]:
    """The amount spent in the last day and the count in the count period, over every
    version of the grant."""
    period = timedelta(seconds=grant.count_period_s or 0)
    since = now - max(DAY, period)
    # The versions' ids first, so that the sum is a range of effect_grant_created_idx.
    versions = list(Grant.objects.filter(lineage=grant.lineage).values_list("pk", flat=True))
    totals = (
        Effect.objects.filter(project_id=grant.project_id, grant__in=versions, created__gte=since)
        .exclude(state__in=UNSPENT)
        .aggregate(
            amount=Sum("amount", filter=Q(created__gte=now - DAY)),
            count=Count("id", filter=Q(created__gte=now - period)),
        )
    )
    return totals["amount"] or Decimal(0), totals["count"]


def _deny(rule: Rule, why: str, grant: Grant | None = None) -> Check:
    by = f"Grant {grant.pk} ({grant.name!r}, v{grant.version})" if grant else "The ledger"
    return Check(Ruling.DENY, f"{by} refuses this effect, rule `{rule}`: {why}.", grant, rule)


def authority_check(
    *,
    project: Project,
    intent: Intent,
    now: datetime | None = None,
    named: Grant | None | Unread = UNREAD,
) -> Check:
    """Rule on a new intent's authority; call inside the transaction that records it.

    `named` is the grant the intent names, if the caller read it (None: no such grant in
    the project).

    An intent naming a superseded version is checked against the current version. A
    grant with count or daily limits is locked (its first version's row) so concurrent
    intents under it are counted one after the other.
    """
    now = now or timezone.now()
    grant_id = (intent.authority or {}).get("grant")
    if grant_id is None:
        if project.authority_policy == AuthorityPolicy.ENFORCE:
            return _deny(
                Rule.NO_GRANT, "the intent names no grant and the project's policy is enforce"
            )
        policy = AuthorityPolicy(project.authority_policy)
        return Check(
            Ruling.PROCEED,
            "No grant named; the project's audit policy lets it proceed and "
            + (
                "opens a case to review it."
                if policy == AuthorityPolicy.AUDIT_CASES
                else "lists it in the authority report."
            ),
            policy=policy,
        )
    if isinstance(named, Unread):
        named = Grant.objects.filter(project=project, pk=grant_id).first()
    if named is None:
        return _deny(Rule.UNKNOWN_GRANT, f"no grant {grant_id} exists in this project")
    grant = _current(named)
    if grant.max_count is not None or grant.max_daily_amount is not None:
        Grant.objects.select_for_update().filter(lineage=grant.lineage, version=1).exists()
    if grant.revoked is not None:
        return _deny(Rule.REVOKED, f"it was revoked by {grant.revoked_by}", grant)
    if grant.expires is not None and grant.expires <= now:
        return _deny(Rule.EXPIRED, f"it expired at {grant.expires:%Y-%m-%d %H:%M UTC}", grant)
    if grant.principal != "*":
        names = _principals(intent)
        if not any(fnmatchcase(name, grant.principal) for name in names):
            who = " or ".join(repr(n) for n in names) if names else "an unnamed agent"
            return _deny(
                Rule.PRINCIPAL, f"it is for {grant.principal!r}, the intent comes from {who}", grant
            )
    if not matches(grant.kinds, intent.kind):
        return _deny(
            Rule.KIND,
            f"kind {intent.kind!r} is outside {', '.join(grant.kinds) or 'nothing'}",
            grant,
        )
    if not matches(grant.targets, intent.target):
        allowed = ", ".join(grant.targets) or "nothing"
        return _deny(Rule.TARGET, f"target {intent.target!r} is outside {allowed}", grant)
    limited = (
        grant.max_amount is not None
        or grant.max_daily_amount is not None
        or grant.second_approval_above is not None
    )
    value = intent.amount.value if intent.amount else None
    if limited and intent.amount is None:
        return _deny(Rule.AMOUNT_MISSING, "it limits amounts and the intent names none", grant)
    if limited and intent.amount is not None and intent.amount.currency != grant.currency:
        return _deny(
            Rule.CURRENCY,
            f"it is in {grant.currency}, the intent asks in {intent.amount.currency}",
            grant,
        )
    if value is not None and grant.max_amount is not None and value > grant.max_amount:
        return _deny(
            Rule.MAX_AMOUNT,
            f"{money(value, grant.currency)} is over its limit of "
            f"{money(grant.max_amount, grant.currency)} per effect",
            grant,
        )
    if grant.max_daily_amount is not None or grant.max_count is not None:
        spent, count = _spent(grant, now)
        if grant.max_daily_amount is not None and spent + (value or 0) > grant.max_daily_amount:
            return _deny(
                Rule.DAILY_AMOUNT,
                f"{money(spent, grant.currency)} spent in the last 24 hours plus "
                f"{money(value or Decimal(0), grant.currency)} is over its limit of "
                f"{money(grant.max_daily_amount, grant.currency)} a day",
                grant,
            )
        if grant.max_count is not None and count >= grant.max_count:
            return _deny(
                Rule.COUNT,
                f"{count} effects in the last {grant.count_period_s} s reach its limit of "
                f"{grant.max_count}",
                grant,
            )
    if grant.requires_approval:
        threshold = grant.second_approval_above
        # An amount limit makes the amount required, so a threshold always has one to compare.
        two = threshold is not None and value is not None and value > threshold
        return Check(
            Ruling.APPROVAL,
            f"Grant {grant.pk} ({grant.name!r}) requires "
            + (
                f"two people's approval above {money(threshold, grant.currency)}"
                if two and threshold is not None
                else "a person's approval"
            )
            + " before the effect is performed.",
            grant,
            approvers=2 if two else 1,
        )
    return Check(Ruling.PROCEED, f"Authorized by grant {grant.pk} ({grant.name!r}).", grant)


# -- the claim an intent makes -------------------------------------------------------------


def claim_of(intent: Intent) -> dict[str, Any]:
    """What an intent claims besides its request: everything the grant check and an
    approval read of it but the principal (a resumed attempt may run under another context).

    The effect keeps a digest of the first intent's claim (`Effect.claim`), taken from the
    claim as sent like the request's fingerprint; a later intent for the key must claim the
    same, or what was approved and checked is not what it would perform.
    """
    amount = intent.amount
    return {
        "kind": intent.kind,
        "target": intent.target,
        "authority": intent.authority,
        "amount": claimed_amount(amount.value, amount.currency) if amount else None,
    }


def claim_recorded(effect: Effect) -> dict[str, Any]:
    """The claim an effect was recorded with, as its columns hold it (`claim_of`'s shape)."""
    return {
        "kind": effect.kind,
        "target": effect.target,
        "authority": effect.authority,
        "amount": (
            None if effect.amount is None else claimed_amount(effect.amount, effect.currency)
        ),
    }


# -- evidence compared with authority ------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A case that a piece of evidence calls for."""

    reason: Reason
    severity: Severity
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)


def evidence_finding(effect: Effect, receipt: Receipt, policy: str) -> Finding | None:
    """What a new receipt for an effect says about its authority, under the project's
    policy for intents that name no grant.

    Effects awaiting approval or denied are left to ledger.evidence, which flags any
    evidence for them as unauthorized, whatever the policy.
    """
    if effect.state in (State.AWAITING_APPROVAL, State.DENIED):
        return None
    what = str(receipt)
    grant = effect.grant
    if grant is None:
        # Under `audit` the project lets ungranted effects happen and reviews them in the
        # authority report, where this receipt moves the effect to "evidence without
        # authority": a case (and its alert) for each would be the row per effect the
        # policy exists to avoid. Under `audit_cases` the project asked for one, and under
        # `enforce` (set after the intent) nothing ungranted may happen any more: a
        # person looks at evidence that it did.
        if policy == AuthorityPolicy.AUDIT:
            return None
        return Finding(
            Reason.UNAUTHORIZED_EFFECT,
            Severity.HIGH,
            f"A receipt ({what}) shows that {effect.key!r} happened with no grant behind it.",
            {"evidence": receipt.pk},
        )
    beyond: dict[str, str] = {}
    if receipt.currency and grant.currency and receipt.currency != grant.currency:
        beyond[Rule.CURRENCY] = f"paid in {receipt.currency}, the grant is in {grant.currency}"
    elif receipt.amount is not None:
        moved = money(receipt.amount, receipt.currency or grant.currency)
        if grant.max_amount is not None and receipt.amount > grant.max_amount:
            limit = money(grant.max_amount, grant.currency)
            beyond[Rule.MAX_AMOUNT] = f"{moved} is over the grant's {limit} per effect"
        if effect.amount is not None and receipt.amount > effect.amount:
            asked = money(effect.amount, effect.currency)
            beyond["intent_amount"] = f"{moved} is more than the {asked} the intent asked for"
    if receipt.target and not matches(grant.targets, receipt.target):
        beyond[Rule.TARGET] = f"it landed on {receipt.target!r}, outside the grant's targets"
    if not beyond:
        return None
    return Finding(
        Reason.AUTHORITY_EXCEEDED,
        Severity.CRITICAL,
        f"A receipt ({what}) goes beyond grant {grant.pk} ({grant.name!r}): "
        + "; ".join(beyond.values())
        + ".",
        {"evidence": receipt.pk, "grant": grant.pk, "rules": beyond},
    )


@dataclass(frozen=True)
class Figures:
    """An `authority_exceeded` case's figures side by side, as `evidence_finding` compared
    them: the grant's limits, what the intent asked, what each receipt shows."""

    grant: Grant | None
    limit: str  # the grant's amount limits, in words
    targets: str
    asked: str
    target: str
    receipts: list[tuple[Receipt, str, str]]  # (receipt, its amount, its target)


def exceeded_figures(effect: Effect, receipts: list[Receipt]) -> Figures:
    """The figures of an effect and the receipts its `authority_exceeded` case names."""
    grant = effect.grant
    currency = grant.currency if grant else effect.currency
    limits = []
    if grant is not None and grant.max_amount is not None:
        limits.append(f"{money(grant.max_amount, grant.currency)} per effect")
    if grant is not None and grant.max_daily_amount is not None:
        limits.append(f"{money(grant.max_daily_amount, grant.currency)} a day")
    none = "none given"
    return Figures(
        grant=grant,
        limit=", ".join(limits) or "no amount limit",
        targets=", ".join(grant.targets) if grant else "",
        asked=money(effect.amount, effect.currency) if effect.amount is not None else none,
        target=effect.target,
        receipts=[
            (
                r,
                money(r.amount, r.currency or currency) if r.amount is not None else none,
                r.target or effect.target,
            )
            for r in receipts
        ],
    )
