"""The story of a case or an effect: every recorded moment of the effect and of its cases, in
time order.

The audit trail gives the moments (who, when, which transition); the rows they name
(attempts, receipts, cases, comments) give the detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Prefetch, Q, prefetch_related_objects

from durability.ledger import intents
from durability.models import (
    ApiKey,
    Attempt,
    AuditAction,
    AuditEntry,
    Case,
    Comment,
    Effect,
    Receipt,
    action_label,
    actor_named,
)


@dataclass
class Moment:
    entry: AuditEntry
    attempt: Attempt | None = None
    # What changed in the attempt's context since the previous attempt: {key: [was, now]}.
    changes: dict[str, list[Any]] = field(default_factory=dict)
    receipt: Receipt | None = None
    case: Case | None = None
    comment: Comment | None = None
    # The names of the API keys among the story's actors, by prefix (ApiKey.names).
    key_names: dict[str, str] = field(default_factory=dict)

    @property
    def actor(self) -> str:
        """Who made this moment, for a person: an API key by its name."""
        return actor_named(self.entry.actor, self.key_names)

    @property
    def label(self) -> str:
        return action_label(self.entry.action)

    @property
    def evidence_link(self) -> str:
        """The receipt's evidence link, if it is a web address (never a script URL)."""
        data = self.receipt.data if self.receipt else None
        link = data.get("link") if isinstance(data, dict) else None
        return link if isinstance(link, str) and link.startswith(("https://", "http://")) else ""

    @property
    def raised(self) -> str:
        """How a repeat raised its case's severity, and why ("raised to high: a receipt shows
        the effect happened"); "" when it did not."""
        data = self.entry.data
        pair = data.get("raised")
        if not (isinstance(pair, list) and len(pair) == 2):
            return ""
        because = data.get("because")
        return f"raised to {pair[1]}" + (f": {because}" if because else "")

    @property
    def details(self) -> dict[str, Any]:
        """The entry's data that the rows shown beside it do not already say."""
        shown = {"attempt", "receipt", "comment", "note", "reason", "raised", "because"}
        return {k: v for k, v in self.entry.data.items() if k not in shown}


def story_of(case: Case) -> list[Moment]:
    """The case's effect's moments and the case's own, oldest first. Six queries (five when
    no API key acted)."""
    effect = case.effect
    about = Q(case=case)
    if effect is not None:
        about |= Q(effect=effect)
    elif case.receipt_id is not None:
        # An orphan receipt was recorded before any case or effect could name it.
        about |= Q(effect=None, action=AuditAction.RECEIPT, data__receipt=case.receipt_id)
    receipts = {case.receipt.pk: case.receipt} if case.receipt is not None else {}
    return _story(case.project_id, about, effect, {case.pk: case}, receipts)


def effect_story(effect: Effect) -> list[Moment]:
    """The effect's moments, its cases' among them, oldest first. Six queries (five when
    no API key acted)."""
    return _story(effect.project_id, Q(effect=effect), effect, {}, {})


def effect_parts(project_id: int) -> list[Prefetch[Any]]:
    """An effect's attempts, receipts and cases (oldest first, with their resolutions and
    receipts), each read by the effect's project as well as its id: on a table distributed
    by project, from the project's node alone."""
    return [
        Prefetch("attempts", Attempt.objects.filter(project_id=project_id)),
        Prefetch("receipts", Receipt.objects.filter(project_id=project_id)),
        Prefetch(
            "cases",
            Case.objects.filter(project_id=project_id)
            .select_related("resolution", "receipt")
            .order_by("opened"),
        ),
    ]


def _story(
    project_id: int,
    about: Q,
    effect: Effect | None,
    cases: dict[int, Case],
    receipts: dict[int, Receipt],
) -> list[Moment]:
    entries = list(AuditEntry.objects.filter(project_id=project_id).filter(about).order_by("id"))
    attempts: dict[int, Attempt] = {}
    if effect is not None:
        prefetch_related_objects([effect], *effect_parts(project_id))
        attempts = {a.number: a for a in effect.attempts.all()}
        receipts = {r.pk: r for r in effect.receipts.all()} | receipts
        cases = {c.pk: c for c in effect.cases.all()} | cases
    comment_ids = [e.data["comment"] for e in entries if "comment" in e.data]
    comments = Comment.objects.filter(project_id=project_id).in_bulk(comment_ids)
    key_names = ApiKey.names(project_id, (e.actor for e in entries))
    moments = []
    for entry in entries:
        case = cases.get(entry.case_id) if entry.case_id else None
        moment = Moment(entry, case=case, key_names=key_names)
        number = entry.data.get("attempt")
        if entry.action in (AuditAction.INTENT, AuditAction.RETRY) and number in attempts:
            moment.attempt = attempts[number]
            previous = attempts.get(number - 1)
            if previous is not None:
                moment.changes = intents.context_drift(previous, moment.attempt)
        if (receipt_id := entry.data.get("receipt")) is not None:
            moment.receipt = receipts.get(receipt_id)
        if (comment_id := entry.data.get("comment")) is not None:
            moment.comment = comments.get(comment_id)
        moments.append(moment)
    return moments


# The moments that say why an attempt did not succeed, and what each says without a reason.
FAILURES: dict[str, str] = {
    AuditAction.FAILURE: "it failed",
    AuditAction.TIMEOUT: "it timed out",
    AuditAction.DEADLINE: "its deadline passed with no receipt",
    AuditAction.INTERRUPTION: "its run resumed in another process while it was pending",
}


def failure_of(story: list[Moment]) -> tuple[Moment, str] | None:
    """The story's latest failure, and why it failed in the words it was reported with."""
    for moment in reversed(story):
        action = moment.entry.action
        if action in FAILURES:
            data = moment.entry.data
            said = data.get("error") or data.get("reason")
            return moment, said if isinstance(said, str) and said else FAILURES[action]
    return None
