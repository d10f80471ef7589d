"""Forms of the authority pages: grants, the project's policy, approvals, webhook sources,
and the authority report's filter."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from durability.authority.grants import Terms
from durability.authority.report import QUADRANTS, ReportQuery
from durability.models import Grant, SignoffVerdict, WebhookKind

PERIODS = [(3600, "hour"), (86400, "day"), (7 * 86400, "week"), (30 * 86400, "30 days")]


class Patterns(forms.CharField):
    """fnmatch patterns, separated by commas or spaces."""

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        return [p for p in re.split(r"[,\s]+", super().to_python(value) or "") if p]

    def prepare_value(self, value: Any) -> Any:
        return ", ".join(value) if isinstance(value, list) else value


def _money(label: str) -> forms.DecimalField:
    return forms.DecimalField(
        label=label, max_digits=20, decimal_places=6, min_value=0, required=False
    )


class DateTimeLocal(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class GrantForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    principal = forms.CharField(
        label="Agent or workflow",
        max_length=255,
        initial="*",
        strip=True,
        help_text="A pattern matched against the intent's context.agent or context.workflow.",
    )
    kinds = Patterns(help_text="Effect kinds, e.g. payment, email.*")
    targets = Patterns(help_text="Target systems, e.g. stripe, github:acme/*")
    currency = forms.RegexField(
        regex=r"^[A-Z]{3}$", required=False, help_text="ISO 4217, e.g. EUR. Needed by limits."
    )
    max_amount = _money("Max per effect")
    max_daily_amount = _money("Max per 24 h")
    max_count = forms.IntegerField(label="Max effects", min_value=1, required=False)
    count_period_s = forms.TypedChoiceField(
        label="per", choices=[("", "—"), *PERIODS], coerce=int, empty_value=None, required=False
    )
    requires_approval = forms.BooleanField(required=False)
    second_approval_above = _money("Second approver above")
    expires = forms.DateTimeField(required=False, widget=DateTimeLocal())
    note = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea, help_text="Why it is granted."
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        amounts = ("max_amount", "max_daily_amount", "second_approval_above")
        if any(data.get(name) is not None for name in amounts) and not data.get("currency"):
            self.add_error("currency", "Amount limits need a currency.")
        if (data.get("max_count") is None) != (data.get("count_period_s") is None):
            self.add_error("count_period_s", "A count limit needs both a number and a period.")
        if data.get("second_approval_above") is not None and not data.get("requires_approval"):
            self.add_error(
                "second_approval_above", "A second approver only applies with approval required."
            )
        return data

    def terms(self) -> Terms:
        return Terms(**{name: self.cleaned_data[name] for name in Terms.__dataclass_fields__})

    @classmethod
    def of(cls, grant: Grant) -> GrantForm:
        """A form holding the grant's terms, to be changed into its next version."""
        return cls(initial=Terms.of(grant).__dict__)


class RevokeForm(forms.Form):
    note = forms.CharField(label="Reason", max_length=2000, strip=True)


class SignoffForm(forms.Form):
    verdict = forms.ChoiceField(choices=SignoffVerdict.choices, widget=forms.RadioSelect)
    reason = forms.CharField(max_length=2000, strip=True, widget=forms.Textarea)


class WebhookSourceForm(forms.Form):
    name = forms.SlugField(
        max_length=50, help_text="Part of the URL: /hooks/<name>/. Unique over all projects."
    )
    kind = forms.ChoiceField(choices=WebhookKind.choices)
    system = forms.CharField(
        max_length=100, strip=True, help_text="The system its receipts come from, e.g. stripe."
    )
    mapping = forms.JSONField(
        required=False,
        initial=dict,
        help_text='Generic: dotted paths, e.g. {"key": "data.metadata.key", "external_id": '
        '"data.id"}. GitHub: optional {"trailer": "Tallybook-Key"}.',
    )
    tolerance_s = forms.IntegerField(
        label="Replay window (s)", min_value=10, max_value=86400, initial=300
    )

    def clean_mapping(self) -> dict[str, Any]:
        # Checked here, once: a mapping the intake could not follow would refuse every
        # delivery the provider sends.
        mapping = self.cleaned_data.get("mapping") or {}
        if not isinstance(mapping, dict):
            raise forms.ValidationError("An object of field names to dotted paths.")
        exponent = mapping.get("exponent", 0)
        if type(exponent) is not int or not 0 <= exponent <= 18:
            raise forms.ValidationError("The exponent is a whole number from 0 to 18 (2: cents).")
        if not all(isinstance(v, str) and v for k, v in mapping.items() if k != "exponent"):
            raise forms.ValidationError("Every field but the exponent names a dotted path.")
        return mapping

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        mapping = data.get("mapping") or {}
        if data.get("kind") == WebhookKind.GENERIC:
            missing = [name for name in ("key", "external_id") if not mapping.get(name)]
            if missing:
                self.add_error("mapping", f"A generic source must map {' and '.join(missing)}.")
        return data


class ReportForm(forms.Form):
    since = forms.DateTimeField(required=False, widget=DateTimeLocal())
    until = forms.DateTimeField(required=False, widget=DateTimeLocal())
    kind = forms.CharField(max_length=100, required=False, strip=True)
    target = forms.CharField(max_length=255, required=False, strip=True)
    grant = forms.IntegerField(min_value=1, required=False)
    quadrant = forms.ChoiceField(choices=[("", "all"), *QUADRANTS], required=False)

    def query(self) -> ReportQuery:
        """The query a valid form asks for; the default range fills what it leaves out."""
        default = ReportQuery.default()
        data = self.cleaned_data
        return ReportQuery(
            since=data.get("since") or default.since,
            until=data.get("until") or default.until,
            kind=data.get("kind") or "",
            target=data.get("target") or "",
            grant=data.get("grant"),
            quadrant=data.get("quadrant") or "",
        )
