"""API keys are cached in each web process and checked against the keys version: a request
with a cached key reads one row by primary key, and any change to a key or its project that
a request could see (a revocation above all) reaches the very next request."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.accounts.members import apikey_revoke, member_add, project_policy_set
from durability.models import ApiKey, AuthorityPolicy, KeysVersion, Project, Role, keys


def _statements(api, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        assert api.get(path).status_code == 404
    return [query["sql"] for query in captured.captured_queries]


def test_a_cached_key_costs_one_primary_key_read_and_no_key_lookup(api):
    keys._authenticated.clear()
    first = _statements(api, "effects?key=nope")
    again = _statements(api, "effects?key=nope")
    # The first request looks the key up by digest with its project and the keys version,
    # and records its use; the next reads the version alone, by primary key. The effect's
    # lookup follows each.
    assert "durability_apikey" in first[0] and "durability_keysversion" in first[0]
    assert first[1].startswith('UPDATE "durability_apikey" SET "last_used_at"')
    assert again[0] == 'SELECT version FROM "durability_keysversion" WHERE id = 1'
    assert not any("durability_apikey" in sql or "durability_project" in sql for sql in again)
    assert (len(first), len(again)) == (3, 2)


def test_a_key_revoked_by_the_service_is_refused_on_the_next_request(api, project):
    assert api.get("effects", key="nope").status_code == 404
    apikey_revoke(project=project, actor="user:admin", key_id=ApiKey.objects.get().pk)
    assert api.get("effects", key="nope").status_code == 401


def test_a_key_revoked_by_any_update_is_refused_on_the_next_request(api):
    # The admin, a shell, or SQL: the database's trigger bumps the version, not a service.
    assert api.get("effects", key="nope").status_code == 404
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durability_apikey SET revoked_at = now()")
    assert api.get("effects", key="nope").status_code == 401


def test_a_deleted_key_is_refused_on_the_next_request(api):
    assert api.get("effects", key="nope").status_code == 404
    ApiKey.objects.all().delete()
    assert api.get("effects", key="nope").status_code == 401


def test_a_key_of_a_deleted_project_is_refused_on_the_next_request(api, project):
    assert api.get("effects", key="nope").status_code == 404
    project.delete()
    assert api.get("effects", key="nope").status_code == 401


def test_a_key_moved_to_another_project_answers_for_that_project(api, other_api):
    ours = api.intent("k1").json()["effect"]["id"]
    assert api.get(f"effects/{ours}").status_code == 200
    ApiKey.objects.filter(pk=ApiKey.objects.get(prefix=api.key[:11]).pk).update(
        project=Project.objects.get(name="beta")
    )
    assert api.get(f"effects/{ours}").status_code == 404


def test_the_projects_policy_reaches_the_next_request(api, project):
    assert api.intent("k1", authority=None).json()["decision"] == "proceed"
    project_policy_set(project=project, actor="user:admin", policy=AuthorityPolicy.ENFORCE)
    assert api.intent("k2", authority=None).json()["decision"] == "denied"


def test_use_times_and_audit_heads_keep_the_cache(api, project, mallory):
    api.get("effects", key="nope")
    version = KeysVersion.current()
    ApiKey.objects.update(last_used_at=None)
    api.get("effects", key="nope")  # writes last_used_at again
    member_add(
        project=project, actor="user:admin", username="nina", email="nina@example.com",
        role=Role.VIEWER,
    )  # fmt: skip
    assert Project.objects.get().audit_seq == 1
    assert KeysVersion.current() == version


def test_a_new_key_needs_no_bump(api, project):
    version = KeysVersion.current()
    _, raw = ApiKey.issue(project)
    assert ApiKey.authenticate(raw) is not None
    assert KeysVersion.current() == version


def test_each_request_gets_its_own_key_and_project(api_key):
    first = ApiKey.authenticate(api_key)
    assert first is not None
    first.name = "changed"
    first.project.authority_policy = AuthorityPolicy.ENFORCE
    again = ApiKey.authenticate(api_key)
    assert again is not None and again is not first and again.project is not first.project
    assert (again.name, again.project.authority_policy) == ("", AuthorityPolicy.AUDIT)
