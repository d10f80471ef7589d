"""API keys: random, stored only as a digest, revocable, and scoped to one project."""

from __future__ import annotations

import hashlib
import math
import string
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from durability.models import API_KEY_PREFIX, ApiKey, Effect, Project

URLSAFE = set(string.ascii_letters + string.digits + "-_")


def test_a_key_starts_with_tb_and_carries_at_least_128_random_bits(project):
    raws = [ApiKey.issue(project)[1] for _ in range(20)]
    for raw in raws:
        assert raw.startswith(API_KEY_PREFIX) and raw.startswith("tb_")
        secret = raw.removeprefix(API_KEY_PREFIX)
        assert set(secret) <= URLSAFE
        assert len(secret) * math.log2(len(URLSAFE)) >= 128
    assert len(set(raws)) == len(raws)


def test_only_the_digest_is_stored_and_the_raw_key_is_in_no_column(project):
    key, raw = ApiKey.issue(project, name="ci")
    secret = raw.removeprefix(API_KEY_PREFIX)
    assert key.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert secret not in key.prefix
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT t::text FROM {connection.ops.quote_name(table)} t")
            for (row,) in cursor.fetchall():
                assert secret not in row, table


def test_the_prefix_tells_keys_apart_without_giving_them_away(project):
    key, raw = ApiKey.issue(project)
    assert raw.startswith(key.prefix)
    assert len(key.prefix) <= 11
    assert str(key).startswith(key.prefix)


def test_a_key_authenticates_to_its_project(project):
    _, raw = ApiKey.issue(project)
    found = ApiKey.authenticate(raw)
    assert found is not None and found.project == project


def test_a_wrong_key_or_a_lookalike_does_not_authenticate(project):
    _, raw = ApiKey.issue(project)
    for attempt in (raw[:-1], raw + "x", raw.upper(), raw.removeprefix("tb_"), "", "tb_"):
        assert ApiKey.authenticate(attempt) is None


def test_a_revoked_key_no_longer_authenticates(api, project):
    key = ApiKey.objects.get()
    key.revoke()
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert api.intent("k1").status_code == 401
    _, other = ApiKey.issue(project)
    assert ApiKey.authenticate(other) is not None, "revoking one key leaves the others"


def test_revoking_twice_keeps_the_first_revocation_time(project):
    key, _ = ApiKey.issue(project)
    key.revoke()
    first = ApiKey.objects.get().revoked_at
    key.revoke()
    assert ApiKey.objects.get().revoked_at == first


def test_using_a_key_records_when_it_was_last_used(api):
    assert ApiKey.objects.get().last_used_at is None
    before = timezone.now()
    api.intent("k1")
    used = ApiKey.objects.get().last_used_at
    assert used is not None and before <= used <= timezone.now()


def test_last_used_is_refreshed_at_most_once_a_minute(api_key):
    start = timezone.now()
    ApiKey.authenticate(api_key, now=start)
    assert ApiKey.objects.get().last_used_at == start
    ApiKey.authenticate(api_key, now=start + timedelta(seconds=59))
    assert ApiKey.objects.get().last_used_at == start
    ApiKey.authenticate(api_key, now=start + timedelta(seconds=60))
    assert ApiKey.objects.get().last_used_at == start + timedelta(seconds=60)


def test_a_key_used_by_several_processes_is_written_once_a_minute(api_key):
    start = timezone.now()
    ApiKey.authenticate(api_key, now=start)
    # Another process, whose own minute had passed, wrote it since.
    ApiKey.objects.update(last_used_at=start + timedelta(seconds=30))
    ApiKey.authenticate(api_key, now=start + timedelta(seconds=61))
    assert ApiKey.objects.get().last_used_at == start + timedelta(seconds=30)


def test_a_key_sees_only_its_own_projects_effects(api, other_api):
    effect_id = api.intent("k1").json()["effect"]["id"]
    assert other_api.get(f"effects/{effect_id}").status_code == 404
    assert other_api.get("effects", key="k1").status_code == 404
    assert other_api.timeout("k1").status_code == 404
    assert other_api.failure("k1").status_code == 404
    assert api.get(f"effects/{effect_id}").status_code == 200


def test_the_same_key_in_two_projects_is_two_effects(api, other_api):
    ours = api.intent("k1").json()
    theirs = other_api.intent("k1", request={"something": "else"}).json()
    assert (ours["decision"], theirs["decision"]) == ("proceed", "proceed")
    assert ours["effect"]["id"] != theirs["effect"]["id"]
    assert set(Effect.objects.values_list("project__name", flat=True)) == {"alpha", "beta"}
    assert Project.objects.count() == 2
