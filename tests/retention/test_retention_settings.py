"""The retention policy on the project settings page: admins set it, field by field
checked and audited; a project that set none keeps the environment's defaults."""

from __future__ import annotations

import pytest

from durability.models import AuditAction, AuditEntry, Project, RetentionPolicy
from tests.desk.support import logged_in


def _post(user, project, **data):
    return logged_in(user).post(f"/settings/{project.pk}/retention/", data)


def test_a_project_without_a_policy_keeps_the_environments_defaults(project, settings):
    settings.TALLYBOOK_SPAN_RETENTION_DAYS = 14
    settings.TALLYBOOK_PAYLOAD_RETENTION_DAYS = None
    policy = RetentionPolicy.of(project)
    assert (policy.span_days, policy.payload_days, policy.require_archive) == (14, None, False)


def test_the_page_shows_the_policy_in_force(project, admin, settings):
    settings.TALLYBOOK_SPAN_RETENTION_DAYS = 30
    page = logged_in(admin).get("/settings/").content.decode()
    assert 'name="span_days" value="30"' in page
    assert 'name="payload_days"' in page and "for ever" in page


def test_an_admin_sets_the_policy_and_it_is_audited(project, admin):
    r = _post(admin, project, span_days="7", payload_days="90", require_archive="on")
    assert r.status_code == 302
    policy = RetentionPolicy.objects.get(project=project)
    assert (policy.span_days, policy.payload_days, policy.require_archive) == (7, 90, True)
    entry = AuditEntry.objects.filter(project=project).latest("id")
    assert entry.action == AuditAction.RETENTION_SET and entry.actor == "user:ada"
    assert entry.data["was"]["span_days"] == 30
    assert (entry.data["span_days"], entry.data["payload_days"]) == (7, 90)


def test_an_empty_payload_field_keeps_payloads_for_ever(project, admin):
    assert _post(admin, project, span_days="30", payload_days="").status_code == 302
    assert RetentionPolicy.objects.get(project=project).payload_days is None


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"span_days": "", "payload_days": "5"}, "span_days", "This field is required."),
        ({"span_days": "0"}, "span_days", "greater than or equal to 1"),
        ({"span_days": "ten"}, "span_days", "Enter a whole number."),
        ({"span_days": "30", "payload_days": "-1"}, "payload_days", "greater than or equal to 1"),
        ({"span_days": "30", "payload_days": "99999"}, "payload_days", "less than or equal to"),
        (
            {"span_days": "30", "payload_days": "", "require_archive": "on"},
            "require_archive",
            "nothing to archive first",
        ),
    ],
)
def test_bad_input_is_refused_with_a_message_at_its_field(project, admin, data, field, message):
    r = _post(admin, project, **data)
    assert r.status_code == 400
    form = r.context["retention_form"]
    assert message in " ".join(form.errors[field])
    page = r.content.decode()
    assert message.replace("'", "&#x27;") in page
    assert not RetentionPolicy.objects.filter(project=project).exists()


@pytest.mark.parametrize(
    ("persona", "status"), [("alice", 403), ("viewer", 403), ("outsider", 404)]
)
def test_only_the_projects_admins_set_it(request, project, persona, status):
    r = _post(request.getfixturevalue(persona), project, span_days="1", payload_days="1")
    assert r.status_code == status
    assert not RetentionPolicy.objects.exists()


def test_an_admin_of_another_project_cannot_set_this_ones(project, outsider):
    theirs = Project.objects.get(name="gamma")
    assert _post(outsider, theirs, span_days="3").status_code == 302
    assert _post(outsider, project, span_days="3").status_code == 404
    assert list(RetentionPolicy.objects.values_list("project__name", flat=True)) == ["gamma"]
