"""The desk's forms: what an operator may send, checked field by field."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.http import QueryDict

from durability.desk.case_actions import (
    Evidence,
    Verdict,
    can_acknowledge,
    verdict_refusal,
    verdicts_for,
)
from durability.desk.queue import QueueQuery
from durability.models import BulkVerb, Case, Reason

ACKNOWLEDGE = "acknowledge"
RESOLVE_CHOICES = [
    (Verdict.HAPPENED.value, "It happened"),
    (Verdict.NOT_HAPPENED.value, "It did not happen"),
    (Verdict.COMPENSATED.value, "Compensated"),
    (Verdict.ABANDONED.value, "Abandoned"),
    (ACKNOWLEDGE, "Acknowledge"),
]


def offered(case: Case) -> list[str]:
    """The verdicts (and acknowledging) the case's page offers now, as the form's values."""
    values = [v.value for v in verdicts_for(case)]
    return [*values, ACKNOWLEDGE] if can_acknowledge(case) else values


class ResolveForm(forms.Form):
    verdict = forms.ChoiceField(choices=RESOLVE_CHOICES, widget=forms.RadioSelect)
    version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    note = forms.CharField(
        label="Reason",
        max_length=2000,
        strip=True,
        help_text="Why: what you checked, or what was done.",
    )
    # Evidence, for "it happened".
    system = forms.CharField(max_length=100, required=False, strip=True)
    external_id = forms.CharField(label="External id", max_length=255, required=False, strip=True)
    link = forms.URLField(max_length=500, required=False, assume_scheme="https")
    evidence_note = forms.CharField(label="Evidence note", max_length=2000, required=False)
    # "next": once settled, go on to the next open case of the queue the case was opened from.
    then = forms.ChoiceField(choices=[("", "stay"), ("next", "next")], required=False)

    def __init__(self, *args: Any, case: Case | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.case = case

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        verdict, case = data.get("verdict"), self.case
        # Refused as the page the operator saw would not offer it. A page of an older
        # version is the services' to refuse, saying what changed since.
        seen = case is not None and data.get("version") == case.version
        if case is not None and seen and verdict and verdict not in offered(case):
            self.add_error("verdict", _refusal(case, verdict))
            return data
        if verdict == Verdict.HAPPENED:
            for name in ("system", "external_id"):
                if not data.get(name):
                    self.add_error(name, "Evidence needs this to say it happened.")
        return data

    def evidence(self) -> Evidence | None:
        data = self.cleaned_data
        if data["verdict"] != Verdict.HAPPENED:
            return None
        return Evidence(data["system"], data["external_id"], data["link"], data["evidence_note"])


class SavedViewForm(forms.Form):
    name = forms.CharField(max_length=80, strip=True)
    # The queue's filter, as a query string (QueueQuery.query_string()).
    filter = forms.CharField(max_length=1000, required=False)
    shared = forms.BooleanField(required=False, label="Share with the project")

    def clean_filter(self) -> QueueQuery:
        query = QueueQuery.from_params(QueryDict(self.cleaned_data["filter"]))
        if query.errors:
            raise forms.ValidationError(
                [f"{field}: {message}" for field, message in query.errors.items()]
            )
        if not query.query_string():
            raise forms.ValidationError("This is the whole queue: filter it first, then save.")
        return query


def _refusal(case: Case, verdict: str) -> str:
    if verdict == ACKNOWLEDGE and case.reason == Reason.APPROVAL_REQUIRED:
        return "An approval is decided in the approvals inbox, not acknowledged here."
    if verdict == ACKNOWLEDGE:
        return f"A case of reason {case.reason} needs a verdict, not an acknowledgement."
    return verdict_refusal(case, Verdict(verdict))


class AssignForm(forms.Form):
    version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    # "me", a member's username, or empty for nobody.
    assignee = forms.CharField(max_length=150, required=False)


# How long a case may be snoozed for: a time from now, or until a new case joins its group.
SNOOZE_RECURS = "recurs"
SNOOZE_CHOICES = [
    ("1h", "1 hour"),
    ("8h", "8 hours"),
    ("1d", "1 day"),
    ("7d", "1 week"),
    (SNOOZE_RECURS, "until it happens again"),
    ("until", "until a time…"),
]
SNOOZE_SPANS = {
    "1h": timedelta(hours=1),
    "8h": timedelta(hours=8),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}


class SnoozeForm(forms.Form):
    version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    snooze = forms.ChoiceField(label="Snooze", choices=SNOOZE_CHOICES)
    # In the member's time zone (the one pages show), for "until a time…".
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("snooze") == "until" and not data.get("until"):
            self.add_error("until", "Until when? Give a date and time.")
        return data

    def until_time(self, now: datetime) -> datetime | None:
        """When the snooze ends; None for "until it happens again"."""
        choice = self.cleaned_data["snooze"]
        if choice == SNOOZE_RECURS:
            return None
        if choice == "until":
            until: datetime = self.cleaned_data["until"]
            return until
        return now + SNOOZE_SPANS[choice]


class CommentForm(forms.Form):
    body = forms.CharField(label="Comment", max_length=4000, strip=True, widget=forms.Textarea)


class CaseIds(forms.Field):
    """Case ids, as many as were ticked; the project scope decides which are acted on."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        try:
            return [int(v) for v in value or []]
        except (TypeError, ValueError):
            raise forms.ValidationError("Not a list of case ids.") from None


class GroupKeys(forms.Field):
    """Groups of similar cases (Case.group_key), as many as were ticked in the grouped queue."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[str]:
        keys = [str(v) for v in value or []]
        if not all(re.fullmatch(r"[0-9a-f]{32}", key) for key in keys):
            raise forms.ValidationError("Not a list of groups.")
        return keys


class BulkForm(forms.Form):
    verb = forms.ChoiceField(choices=BulkVerb.choices)
    scope = forms.ChoiceField(choices=[("selected", "selected"), ("matching", "all matching")])
    case = CaseIds(required=False)
    # Named apart from the queue filter's `group`, which the same request may carry.
    case_group = GroupKeys(required=False)
    note = forms.CharField(label="Reason", max_length=2000, required=False, strip=True)
    # Named apart from the queue filter's `assignee`, which the same request carries.
    assign_to = forms.CharField(max_length=150, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not (data.get("case") or data.get("case_group")):
            self.add_error("case", "Select at least one case or group, or act on all matching.")
        verb = data.get("verb")
        if verb in (BulkVerb.NOT_HAPPENED, BulkVerb.ACKNOWLEDGE) and not data.get("note"):
            self.add_error("note", "Give the reason: it is recorded on every case.")
        if verb == BulkVerb.ASSIGN and not data.get("assign_to"):
            self.add_error("assign_to", "Assign to whom? (me, or a username)")
        return data


class AuditFilter(forms.Form):
    actor = forms.CharField(
        label="User", max_length=150, required=False, help_text="a username, or system:…"
    )
    effect = forms.CharField(
        label="Effect", max_length=255, required=False, help_text="its key, or its id"
    )
    action = forms.CharField(max_length=32, required=False)
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    before = forms.IntegerField(min_value=1, required=False, widget=forms.HiddenInput)

    def clean_actor(self) -> str:
        actor: str = self.cleaned_data["actor"]
        # People are recorded as user:<username>; other actors are named in full.
        return actor if not actor or ":" in actor else f"user:{actor}"
