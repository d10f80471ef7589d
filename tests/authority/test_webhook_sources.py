"""Webhook sources: the form takes only a mapping the intake can follow."""

from __future__ import annotations

from typing import Any

import pytest

from durability.authority.forms import WebhookSourceForm
from durability.models import Project, WebhookSource
from tests.api.support import stripe_source
from tests.desk.support import logged_in


def _form(mapping: Any) -> WebhookSourceForm:
    return WebhookSourceForm(
        {
            "name": "alpha-stripe",
            "kind": "generic",
            "system": "stripe",
            "mapping": mapping,
            "tolerance_s": 300,
        }
    )


def test_a_mapping_of_dotted_paths_with_an_exponent_is_taken():
    form = _form('{"key": "data.metadata.key", "external_id": "data.id", "exponent": 2}')
    assert form.is_valid(), form.errors
    assert form.cleaned_data["mapping"]["exponent"] == 2


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ('{"key": "k", "external_id": "id", "exponent": "2"}', "exponent"),
        ('{"key": "k", "external_id": "id", "exponent": 99}', "exponent"),
        ('{"key": "k", "external_id": "id", "exponent": true}', "exponent"),
        ('{"key": 5, "external_id": "id"}', "dotted path"),
        ('{"key": "k", "external_id": ""}', "dotted path"),
        ('["key"]', "object"),
    ],
    ids=["text-exponent", "huge-exponent", "bool-exponent", "numeric-path", "empty-path", "list"],
)
def test_a_mapping_the_intake_could_not_follow_is_refused(mapping, message):
    form = _form(mapping)
    assert not form.is_valid()
    assert message in " ".join(form.errors["mapping"])


def test_a_name_another_projects_source_has_is_refused_on_the_form(admin, project):
    taken = stripe_source(Project.objects.create(name="beta"))
    form = {"name": taken.name, "kind": "generic", "system": "stripe", "tolerance_s": 300}
    form["mapping"] = '{"key": "data.key", "external_id": "data.id"}'
    r = logged_in(admin).post("/authority/webhooks/", form)
    assert r.status_code == 400
    assert "A webhook source of that name exists already." in r.content.decode()
    assert not WebhookSource.objects.filter(project=project).exists()
