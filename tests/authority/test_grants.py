"""Managing grants: admins create, supersede and revoke them in the browser, every change
audited and no version edited in place; the API reads them. (The policy for intents
without a grant is set in the project's settings: test_project_settings.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from durability.authority import grants
from durability.models import AuditEntry, Grant, Project
from tests.authority.support import grant, supersede
from tests.desk.support import logged_in

FORM = {
    "name": "refunds",
    "principal": "refund-bot",
    "kinds": "payment, refund.*",
    "targets": "stripe",
    "currency": "EUR",
    "max_amount": "50",
    "max_daily_amount": "500",
    "max_count": "100",
    "count_period_s": "86400",
    "requires_approval": "on",
    "second_approval_above": "20",
    "expires": "",
    "note": "Support refunds, Q4",
}


def _grant_entries(project: Project) -> list[AuditEntry]:
    return list(
        AuditEntry.objects.filter(project=project, action__startswith="grant_").order_by("id")
    )


def test_an_admin_creates_a_grant_and_the_change_is_audited(project, admin: User):
    response = logged_in(admin).post("/authority/grants/new/", FORM)
    g = Grant.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/authority/grants/{g.pk}/"
    assert (g.name, g.principal, g.kinds, g.targets) == (
        "refunds",
        "refund-bot",
        ["payment", "refund.*"],
        ["stripe"],
    )
    assert (g.version, g.granted_by, g.requires_approval) == (1, "user:ada", True)
    [entry] = _grant_entries(project)
    assert (entry.actor, entry.action, entry.data["grant"]) == ("user:ada", "grant_created", g.pk)
    assert entry.data["terms"]["max_amount"] == "50"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"currency": ""}, "currency"),
        ({"max_count": ""}, "count_period_s"),
        ({"requires_approval": ""}, "second_approval_above"),
        ({"kinds": " , "}, "kinds"),
        ({"currency": "euro"}, "currency"),
    ],
)
def test_an_inconsistent_grant_is_refused_field_by_field(project, admin, change, field):
    form: dict[str, Any] = {**FORM, **change}
    response = logged_in(admin).post("/authority/grants/new/", form)
    assert response.status_code == 400
    assert field in response.context["form"].errors
    assert not Grant.objects.exists()


def test_operators_and_viewers_read_grants_but_cannot_change_them(project, alice, viewer):
    g = grant(project, name="refunds")
    for user in (alice, viewer):
        client = logged_in(user)
        assert "refunds" in client.get("/authority/").content.decode()
        assert client.get(f"/authority/grants/{g.pk}/").status_code == 200
        assert client.post("/authority/grants/new/", FORM).status_code == 403
        assert client.post(f"/authority/grants/{g.pk}/revoke/", {"note": "x"}).status_code == 403
    assert Grant.objects.get().revoked is None


def test_a_grant_of_another_project_is_not_found(project, outsider):
    g = grant(project)
    assert logged_in(outsider).get(f"/authority/grants/{g.pk}/").status_code == 404
    assert (
        logged_in(outsider).post(f"/authority/grants/{g.pk}/revoke/", {"note": "x"}).status_code
        == 404
    )


def test_a_change_is_a_new_version_and_the_old_one_stays_as_it_was(project, admin):
    v1 = grant(project, name="refunds", targets=["stripe"])
    before = Grant.objects.filter(pk=v1.pk).values().get()
    response = logged_in(admin).post(
        f"/authority/grants/{v1.pk}/supersede/",
        {**FORM, "requires_approval": "", "second_approval_above": "", "targets": "stripe, adyen"},
    )
    v2 = Grant.objects.get(supersedes=v1)
    assert response["Location"] == f"/authority/grants/{v2.pk}/"
    assert (v2.version, v2.lineage, v2.targets) == (2, v1.lineage, ["stripe", "adyen"])
    after = Grant.objects.filter(pk=v1.pk).values().get()
    assert after.pop("superseded_at") is not None and before.pop("superseded_at") is None
    assert after == before
    entry = _grant_entries(project)[-1]
    assert entry.action == "grant_superseded" and entry.actor == "user:ada"
    assert entry.data["changed"]["targets"] == [["stripe"], ["stripe", "adyen"]]


def test_only_the_current_version_can_change(project, admin):
    v1 = grant(project)
    supersede(v1, name="v2")
    client = logged_in(admin)
    client.post(f"/authority/grants/{v1.pk}/supersede/", FORM)
    client.post(f"/authority/grants/{v1.pk}/revoke/", {"note": "too late"})
    assert Grant.objects.count() == 2
    assert Grant.objects.get(pk=v1.pk).revoked is None


def test_revoking_needs_a_reason_and_is_audited(project, admin):
    g = grant(project)
    client = logged_in(admin)
    assert client.post(f"/authority/grants/{g.pk}/revoke/", {"note": ""}).status_code == 400
    client.post(f"/authority/grants/{g.pk}/revoke/", {"note": "key leaked"})
    g.refresh_from_db()
    assert g.revoked is not None and g.revoked_by == "user:ada" and g.status() == "revoked"
    entry = _grant_entries(project)[-1]
    assert (entry.action, entry.data["note"]) == ("grant_revoked", "key leaked")


def test_the_api_lists_every_version_newest_first_and_filters_by_status(api, project, other_api):
    v1 = grant(project, name="a")
    v2 = supersede(v1, name="a2")
    revoked = grant(project, name="b")
    grants.grant_revoke(grant=revoked, actor="user:ada", note="x")
    grant(Project.objects.get(name="beta"), name="elsewhere")
    body = api.get("grants").json()
    assert [g["id"] for g in body["grants"]] == [revoked.pk, v2.pk, v1.pk]
    assert body["next"] is None
    assert [g["status"] for g in body["grants"]] == ["revoked", "live", "superseded"]
    assert [g["id"] for g in api.get("grants", status="live").json()["grants"]] == [v2.pk]
    lineage = api.get("grants", lineage=str(v1.lineage)).json()["grants"]
    assert [(g["id"], g["version"], g["supersedes"]) for g in lineage] == [
        (v2.pk, 2, v1.pk),
        (v1.pk, 1, None),
    ]
    bad = api.get("grants", status="sideways", before="x")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"status", "before"}


def test_the_api_reads_one_grant_of_its_own_project(api, project, other_api):
    g = grant(project, name="refunds", currency="EUR", max_amount="12.50")
    body = api.get(f"grants/{g.pk}").json()
    assert body["name"] == "refunds" and body["max_amount"] == "12.5"
    assert body["url"].endswith(f"/authority/grants/{g.pk}/")
    assert other_api.get(f"grants/{g.pk}").status_code == 404
    assert api.client.get(f"/api/v1/grants/{g.pk}").status_code == 401


def test_the_openapi_document_describes_grants_and_amounts(client):
    doc = client.get("/api/v1/openapi.json").json()
    assert {"/api/v1/grants", "/api/v1/grants/{grant_id}"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert "amount" in schemas["IntentIn"]["properties"]
    assert "GrantOut" in schemas and "AmountIn" in schemas


def test_a_grant_without_limits_says_no_limit(project, admin):
    g = grant(project, name="large refunds")
    for url in ("/authority/", f"/authority/grants/{g.pk}/"):
        page = logged_in(admin).get(url).content.decode()
        assert '<span class="muted">no limit</span>' in page
        assert '<span class="muted">none</span>' not in page
