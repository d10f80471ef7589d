"""Authority: the grant check an intent gets, evidence compared with its grant, grant changes.

The state machine (durability.machine) asks `authority_check` before it records a new
effect and `evidence_findings` after it stores a receipt, and applies what they answer;
nothing here changes an effect. Grants themselves change only through `grant_create`,
`grant_supersede` and `grant_revoke`, each audited: a grant is never edited in place.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from durability.audit import Trail
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
from durability.schemas import IntentIn

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
    # Proceeds with no grant at all, under the project's `audit` policy.
    unauthorized: bool = False


def matches(patterns: list[str], value: str) -> bool:
    return any(fnmatchcase(value, pattern) for pattern in patterns)


def _money(value: Decimal, currency: str) -> str:
    return f"{value.normalize():f} {currency}"


def _principals(intent: IntentIn) -> list[str]:
    """The names an intent acts under: its context's agent and workflow."""
    context = intent.context.model_dump(exclude_none=True) if intent.context else {}
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
        Effect.objects.filter(grant__in=versions, created__gte=since)
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


def authority_check(*, project: Project, intent: IntentIn, now: datetime | None = None) -> Check:
    """Rule on a new intent's authority; call inside the transaction that records it.

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
        return Check(
            Ruling.PROCEED,
            "No grant named; the project's audit policy lets it proceed and flags it for review.",
            unauthorized=True,
        )
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
    value = Decimal(intent.amount.value) if intent.amount else None
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
            f"{_money(value, grant.currency)} is over its limit of "
            f"{_money(grant.max_amount, grant.currency)} per effect",
            grant,
        )
    if grant.max_daily_amount is not None or grant.max_count is not None:
        spent, count = _spent(grant, now)
        if grant.max_daily_amount is not None and spent + (value or 0) > grant.max_daily_amount:
            return _deny(
                Rule.DAILY_AMOUNT,
                f"{_money(spent, grant.currency)} spent in the last 24 hours plus "
                f"{_money(value or Decimal(0), grant.currency)} is over its limit of "
                f"{_money(grant.max_daily_amount, grant.currency)} a day",
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
                f"two people's approval above {_money(threshold, grant.currency)}"
                if two and threshold is not None
                else "a person's approval"
            )
            + " before the effect is performed.",
            grant,
            approvers=2 if two else 1,
        )
    return Check(Ruling.PROCEED, f"Authorized by grant {grant.pk} ({grant.name!r}).", grant)


# -- evidence compared with authority ------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A case that a piece of evidence calls for."""

    reason: Reason
    severity: Severity
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)


def evidence_finding(effect: Effect, receipt: Receipt) -> Finding | None:
    """What a new receipt for an effect says about its authority.

    Effects awaiting approval or denied are left to the state machine, which flags any
    evidence for them as unauthorized.
    """
    if effect.state in (State.AWAITING_APPROVAL, State.DENIED):
        return None
    what = f"{receipt.system}:{receipt.external_id}"
    grant = effect.grant
    if grant is None:
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
        moved = _money(receipt.amount, receipt.currency or grant.currency)
        if grant.max_amount is not None and receipt.amount > grant.max_amount:
            limit = _money(grant.max_amount, grant.currency)
            beyond[Rule.MAX_AMOUNT] = f"{moved} is over the grant's {limit} per effect"
        if effect.amount is not None and receipt.amount > effect.amount:
            asked = _money(effect.amount, effect.currency)
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


# -- reading grants ---------------------------------------------------------------------------

GRANT_STATUSES = ("live", "expired", "revoked", "superseded")


@dataclass(frozen=True)
class GrantQuery:
    """A filter over grant versions from URL parameters: `status`, `lineage`, `before`."""

    status: str = ""
    lineage: uuid.UUID | None = None
    before: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> GrantQuery | dict[str, str]:
        """The query, or {parameter: message} for each bad parameter."""
        problems: dict[str, str] = {}
        status = params.get("status", "")
        if status and status not in GRANT_STATUSES:
            problems["status"] = f"One of {', '.join(GRANT_STATUSES)}"
        lineage = None
        if params.get("lineage"):
            try:
                lineage = uuid.UUID(params["lineage"])
            except ValueError:
                problems["lineage"] = "A grant lineage, as a UUID"
        before = params.get("before", "")
        if before and not before.isdigit():
            problems["before"] = "A grant id"
        if problems:
            return problems
        return cls(status, lineage, int(before) if before else None)

    def apply(self, grants: QuerySet[Grant], now: datetime | None = None) -> QuerySet[Grant]:
        now = now or timezone.now()
        current = Q(revoked__isnull=True, superseded_at__isnull=True)
        unexpired = Q(expires__isnull=True) | Q(expires__gt=now)
        by_status = {
            "live": current & unexpired,
            "expired": current & ~unexpired,
            "revoked": Q(revoked__isnull=False),
            "superseded": Q(superseded_at__isnull=False),
        }
        if self.status:
            grants = grants.filter(by_status[self.status])
        if self.lineage:
            grants = grants.filter(lineage=self.lineage)
        if self.before:
            grants = grants.filter(pk__lt=self.before)
        return grants.order_by("-id")


# -- grant changes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Terms:
    """Everything a grant version says; a change to any of it is a new version."""

    name: str
    kinds: list[str]
    targets: list[str]
    principal: str = "*"
    currency: str = ""
    max_amount: Decimal | None = None
    max_daily_amount: Decimal | None = None
    max_count: int | None = None
    count_period_s: int | None = None
    requires_approval: bool = False
    second_approval_above: Decimal | None = None
    expires: datetime | None = None
    note: str = ""

    @classmethod
    def of(cls, grant: Grant) -> Terms:
        return cls(**{name: getattr(grant, name) for name in cls.__dataclass_fields__})

    def audited(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, Decimal | datetime) else v) for k, v in asdict(self).items()
        }


class GrantClosed(Exception):
    """The grant was revoked or superseded: only its current, unrevoked version changes."""


def grant_create(*, project: Project, actor: str, terms: Terms) -> Grant:
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        grant = Grant.objects.create(project=project, granted_by=actor, **asdict(terms))
        trail.add("grant_created", grant=grant.pk, version=1, terms=terms.audited())
        trail.append()
    return grant


def _lock_current(grant: Grant) -> Grant:
    locked = Grant.objects.select_for_update().get(pk=grant.pk)
    if locked.superseded_at is not None or locked.revoked is not None:
        raise GrantClosed(f"grant {locked.pk} is {locked.status()}; change its current version")
    return locked


def grant_supersede(*, grant: Grant, actor: str, terms: Terms) -> Grant:
    """A new version with new terms; the old version stays on record, superseded."""
    trail = Trail(grant.project_id, actor)
    with transaction.atomic():
        old = _lock_current(grant)
        now = timezone.now()
        Grant.objects.filter(pk=old.pk).update(superseded_at=now)
        new = Grant.objects.create(
            project_id=old.project_id,
            lineage=old.lineage,
            version=old.version + 1,
            supersedes=old,
            granted_by=actor,
            created=now,
            **asdict(terms),
        )
        changed = {
            k: [before, after]
            for k, before in Terms.of(old).audited().items()
            if (after := terms.audited()[k]) != before
        }
        trail.add(
            "grant_superseded",
            grant=new.pk,
            supersedes=old.pk,
            version=new.version,
            changed=changed,
        )
        trail.append()
    return new


def grant_revoke(*, grant: Grant, actor: str, note: str) -> Grant:
    """Revoke the current version: every intent naming any version is denied from now on."""
    trail = Trail(grant.project_id, actor)
    with transaction.atomic():
        locked = _lock_current(grant)
        locked.revoked, locked.revoked_by = timezone.now(), actor
        Grant.objects.filter(pk=locked.pk).update(
            revoked=locked.revoked, revoked_by=locked.revoked_by
        )
        trail.add("grant_revoked", grant=locked.pk, version=locked.version, note=note)
        trail.append()
    return locked


def project_policy_set(*, project: Project, actor: str, policy: AuthorityPolicy) -> bool:
    """Set what intents naming no grant get; True when it changed."""
    trail = Trail(project.pk, actor)
    with transaction.atomic():
        was = Project.objects.select_for_update().values_list("authority_policy", flat=True)
        before = was.get(pk=project.pk)
        if before == policy:
            return False
        Project.objects.filter(pk=project.pk).update(authority_policy=policy)
        project.authority_policy = policy
        trail.add("authority_policy_set", was=before, policy=policy.value)
        trail.append()
    return True
