"""The effects list's filter: it lives in the URL, so every number on the overview can link
to exactly the effects it counts.

An invalid field is ignored (and reported by the form), never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.db.models import Exists, OuterRef, QuerySet
from django.urls import reverse

from durability.models import Case, Effect, Reason, Receipt, State, Strength

# The filter's fields, in the order a query string names them.
FIELDS = (
    "project",
    "state",
    "kind",
    "target",
    "agent",
    "workflow",
    "run",
    "case",
    "strength",
    "since",
)
# The fields that name one column's value exactly, and that column.
EXACT = {
    "project": "project_id",
    "state": "state",
    "kind": "kind",
    "target": "target",
    "agent": "agent",
    "workflow": "workflow",
    "run": "run_id",
}


class EffectFilter(forms.Form):
    project = forms.IntegerField(min_value=1, required=False)
    state = forms.ChoiceField(choices=[("", "any state"), *State.choices], required=False)
    kind = forms.CharField(max_length=100, required=False, help_text="payment, email, deploy…")
    target = forms.CharField(max_length=255, required=False)
    agent = forms.CharField(
        max_length=255, required=False, help_text="The agent (or workflow) the latest intent named."
    )
    workflow = forms.CharField(
        max_length=255, required=False, help_text="The workflow the latest intent named."
    )
    run = forms.CharField(
        label="Run id", max_length=255, required=False, help_text="The run's id the agent sent."
    )
    case = forms.ChoiceField(
        choices=[("", "any"), *Reason.choices],
        required=False,
        help_text="Effects that had a case of this reason.",
    )
    strength = forms.ChoiceField(
        choices=[("", "any"), *Strength.choices],
        required=False,
        help_text="Effects with a receipt of this strength.",
    )
    since = forms.DateTimeField(
        required=False,
        help_text="Effects created since then; with `case`, whose case was opened since then.",
    )

    # The fields the effects page's form shows; the others come from links (the overview).
    IN_PAGE = ("kind", "target", "agent", "workflow", "run")


@dataclass
class EffectQuery:
    """A validated effects filter, and how to link to it."""

    values: dict[str, Any]
    # What was wrong with each field left out, for the page to say.
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Any) -> EffectQuery:
        form = EffectFilter(params)
        form.is_valid()
        values = {k: v for k, v in form.cleaned_data.items() if v not in ("", None)}
        errors = {name: " ".join(str(e) for e in errs) for name, errs in form.errors.items()}
        return cls(values, errors)

    def params(self, **override: Any) -> list[tuple[str, str]]:
        """The filter's fields as (name, value), in FIELDS order; an override of None drops one."""
        merged = {k: self.values.get(k) for k in FIELDS} | override
        return [(k, _param(v)) for k, v in merged.items() if v not in ("", None)]

    def query_string(self, **override: Any) -> str:
        return urlencode(self.params(**override))

    def described(self) -> list[tuple[str, Any]]:
        """The active fields besides project and state, as (name, value) for the page (which
        shows `since`, a datetime, with {% when %})."""
        return [
            (k, self.values[k])
            for k in FIELDS
            if k in self.values and k not in ("project", "state")
        ]

    def apply(self, qs: QuerySet[Effect]) -> QuerySet[Effect]:
        v = self.values
        qs = qs.filter(**{column: v[name] for name, column in EXACT.items() if name in v})
        since: datetime | None = v.get("since")
        if "case" in v:
            cases = Case.objects.filter(
                project=OuterRef("project_id"), effect=OuterRef("pk"), reason=v["case"]
            )
            if since is not None:
                cases = cases.filter(opened__gte=since)
            qs = qs.filter(Exists(cases))
        elif since is not None:
            qs = qs.filter(created__gte=since)
        if "strength" in v:
            qs = qs.filter(
                Exists(
                    Receipt.objects.filter(
                        project=OuterRef("project_id"),
                        effect=OuterRef("pk"),
                        strength=v["strength"],
                    )
                )
            )
        return qs


def effects_url(**values: Any) -> str:
    """The effects list filtered by `values` (see EffectFilter)."""
    query = EffectQuery({k: v for k, v in values.items() if v not in ("", None)})
    return f"{reverse('effects')}?{query.query_string()}"


def _param(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)
