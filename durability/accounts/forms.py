"""The project settings page's forms: members and API keys, checked field by field."""

from __future__ import annotations

from django import forms
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.db import models

from durability.models import MAX_EFFECT_TIMEOUT_S, AuthorityPolicy, Membership, Role, zone_names


class MemberAddForm(forms.Form):
    username = forms.CharField(
        max_length=150,
        strip=True,
        validators=[UnicodeUsernameValidator()],
        help_text="an existing user to invite, or a new one",
    )
    email = forms.EmailField(
        required=False,
        help_text="for a new user: where their one-time link to choose a password goes; "
        "for someone who has not chosen one yet, their own address",
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


def _notify_field(name: str) -> forms.BooleanField:
    field = Membership._meta.get_field(name)
    assert isinstance(field, models.BooleanField)
    label = str(field.verbose_name).capitalize()
    return forms.BooleanField(required=False, initial=True, label=label)


class NotificationsForm(forms.Form):
    """Which emails a member receives; an unticked box is a "no"."""

    notify_assigned = _notify_field("notify_assigned")
    notify_mentioned = _notify_field("notify_mentioned")
    notify_overdue = _notify_field("notify_overdue")


def _zone_choices() -> list[tuple[str, str]]:
    return [("", "My browser's"), *((name, name) for name in sorted(zone_names()))]


class TimeZoneForm(forms.Form):
    """The zone pages show moments in: one of the zoneinfo database's, or the browser's."""

    time_zone = forms.ChoiceField(
        label="Show times in",
        choices=_zone_choices,
        required=False,
        error_messages={"invalid_choice": "%(value)s is not a time zone of the zoneinfo database."},
    )


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class ApiKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, strip=True, help_text="what will use it, so it can be told apart"
    )


class PolicyForm(forms.Form):
    authority_policy = forms.ChoiceField(
        label="Intents that name no grant", choices=AuthorityPolicy.choices
    )
    effect_timeout_s = forms.IntegerField(
        label="Deadline of an attempt whose intent declares no timeout (seconds)",
        min_value=1,
        max_value=MAX_EFFECT_TIMEOUT_S,
        required=False,  # left empty: unchanged
        help_text="past it without a receipt, the sweep times the attempt out and opens an "
        "uncertain case",
    )


# Ten years: a longer retention is "for ever", said by leaving the payload field empty.
RETENTION_MAX_DAYS = 3650


class RetentionForm(forms.Form):
    """How long the project keeps what retention may remove (durability.retention)."""

    span_days = forms.IntegerField(
        label="Keep runs and spans for (days)",
        min_value=1,
        max_value=RETENTION_MAX_DAYS,
        help_text="then they are dropped",
    )
    payload_days = forms.IntegerField(
        label="Keep request and receipt data of settled effects for (days)",
        required=False,
        min_value=1,
        max_value=RETENTION_MAX_DAYS,
        help_text="after the effect last changed; empty: for ever. The effect, its"
        " fingerprint, its receipts' external ids, its cases and the audit chain stay",
    )
    require_archive = forms.BooleanField(
        label="Require an archive first",
        required=False,
        help_text="prune only what an archive (manage.py archive) holds",
    )

    def clean(self) -> dict[str, object] | None:
        data = super().clean()
        if data and data.get("require_archive") and data.get("payload_days") is None:
            self.add_error(
                "require_archive",
                "Payloads are kept for ever, so there is nothing to archive first: give the"
                " days to keep them, or untick this.",
            )
        return data


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class RedactionForm(forms.Form):
    """One entry per line; the service checks each pattern."""

    patterns = forms.CharField(
        label="Extra secret patterns",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Python regular expressions, one per line; each match is redacted",
    )
    keys = forms.CharField(
        label="Extra secret key names",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="field or attribute names whose values are redacted, one per line",
    )

    def clean_patterns(self) -> list[str]:
        return _lines(self.cleaned_data["patterns"])

    def clean_keys(self) -> list[str]:
        return _lines(self.cleaned_data["keys"])
