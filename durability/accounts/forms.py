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
