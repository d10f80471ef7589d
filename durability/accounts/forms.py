"""The project settings page's forms: members and API keys, checked field by field."""

from __future__ import annotations

from django import forms

from durability.models import AuthorityPolicy, Role


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150, strip=True, help_text="an existing user")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


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
