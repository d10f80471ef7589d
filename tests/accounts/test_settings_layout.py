"""The settings forms (members, keys, retention, redaction) lay out alike: each field's label
above it, its help under it, the form's button at its end."""

from __future__ import annotations

import re

import pytest

from tests.desk.support import logged_in


@pytest.mark.parametrize("action", ["retention", "redaction", "members", "keys"])
def test_each_field_has_its_label_above_and_its_help_under_and_the_button_last(
    project, admin, action
):
    html = logged_in(admin).get("/settings/").content.decode()
    form = re.search(
        rf'<form method="post" action="/settings/{project.pk}/{action}/"[^>]*>(.*?)</form>',
        html,
        re.S,
    )
    assert form, f"no {action} form"
    body = form.group(1)
    fields = re.findall(r'<div class="field">(.*?)\n  </div>', body, re.S)
    assert fields
    for field in fields:
        label = field.index("<label")
        control = min(
            field.index(tag) for tag in ("<input", "<textarea", "<select") if tag in field
        )
        assert label < control, field
        if 'class="helptext"' in field:
            assert control < field.index('class="helptext"'), field
    assert body.rstrip().endswith("</button>")
