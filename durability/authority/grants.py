"""Grant versions: reading them, and changing them only through audited services."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from durability import audit
from durability.inbound import decimal_digits
from durability.models import (
    AuditAction,
    Grant,
    Project,
)
from durability.paging import Keyset

# -- reading grants ---------------------------------------------------------------------------

GRANT_STATUSES = ("live", "expired", "revoked", "superseded")
# Grant versions newest first, keyset on id (`?before=<id>`).
NEWEST = Keyset("-id")
# A UUID as the API writes it; uuid.UUID() would also take braces, "urn:uuid:" and no dashes.
LINEAGE = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


@dataclass(frozen=True)
class GrantQuery:
    """A filter over grant versions from URL parameters: `status`, `lineage`, `before`."""

    status: str = ""
    lineage: uuid.UUID | None = None
    before: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> GrantQuery | dict[str, str]:
        """The query, or {parameter: message} for each bad parameter; a parameter that is
        given is checked even when empty (`?lineage=` is no lineage, not every grant)."""
        problems: dict[str, str] = {}
        status = params.get("status")
        if status is not None and status not in GRANT_STATUSES:
            problems["status"] = f"One of {', '.join(GRANT_STATUSES)}"
        lineage = None
        if "lineage" in params:
            if LINEAGE.fullmatch(params["lineage"]):
                lineage = uuid.UUID(params["lineage"])
            else:
                problems["lineage"] = "A grant lineage: a UUID, 8-4-4-4-12 hex digits"
        before = None
        if "before" in params:
            try:
                before = decimal_digits(params["before"], max_digits=18)
            except ValueError:
                problems["before"] = "A grant id"
        if problems:
            return problems
        return cls(status or "", lineage, before)

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
        return NEWEST.after(grants, (self.before,) if self.before else None)


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
    with audit.trail(project.pk, actor) as trail:
        grant = Grant.objects.create(project=project, granted_by=actor, **asdict(terms))
        trail.add(AuditAction.GRANT_CREATED, grant=grant.pk, version=1, terms=terms.audited())
    return grant


def _lock_current(grant: Grant) -> Grant:
    locked = Grant.objects.select_for_update().get(pk=grant.pk)
    if locked.superseded_at is not None or locked.revoked is not None:
        raise GrantClosed(f"grant {locked.pk} is {locked.status()}; change its current version")
    return locked


def grant_supersede(*, grant: Grant, actor: str, terms: Terms) -> Grant:
    """A new version with new terms; the old version stays on record, superseded."""
    with audit.trail(grant.project_id, actor) as trail:
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
            AuditAction.GRANT_SUPERSEDED,
            grant=new.pk,
            supersedes=old.pk,
            version=new.version,
            changed=changed,
        )
    return new


def grant_revoke(*, grant: Grant, actor: str, note: str) -> Grant:
    """Revoke the current version: every intent naming any version is denied from now on."""
    with audit.trail(grant.project_id, actor) as trail:
        locked = _lock_current(grant)
        locked.revoked, locked.revoked_by = timezone.now(), actor
        Grant.objects.filter(pk=locked.pk).update(
            revoked=locked.revoked, revoked_by=locked.revoked_by
        )
        trail.add(AuditAction.GRANT_REVOKED, grant=locked.pk, version=locked.version, note=note)
    return locked
