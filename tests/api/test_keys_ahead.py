"""The ledger's writes use a cached API key at once and check the keys version in their first
round trip (`rows.ahead`): a key revoked or a project changed before that read is refused or
seen, with nothing written under the stale answer; a version moved by anything else costs a
second look and the request is answered once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from durability import rows
from durability.accounts.members import project_policy_set
from durability.models import ApiKey, AuditEntry, AuthorityPolicy, Effect, KeysVersion, Project
from tests.conftest import Api


def _elsewhere(sql: str) -> None:
    """Run `sql` on a connection of its own, committed, as another web process would."""
    database = settings.DATABASES["default"]
    with psycopg.connect(
        dbname=connection.settings_dict["NAME"],
        host=database["HOST"],
        port=database["PORT"] or 5432,
        user=database["USER"],
        autocommit=True,
    ) as other:
        other.execute(sql)


def test_a_key_revoked_after_it_was_cached_is_refused_by_the_next_intent(api: Api) -> None:
    assert api.intent("k1").status_code == 201
    ApiKey.objects.update(revoked_at="2026-01-01T00:00:00Z")

    refused = api.intent("k2")

    assert refused.status_code == 401
    assert not Effect.objects.filter(key="k2").exists()


def test_a_key_revoked_between_the_cache_and_the_first_read_writes_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch, transactional_db: None
) -> None:
    """The cache answered before the revocation committed; the version read in the intent's
    first round trip is after it, so the intent rolls back, looks again and is refused."""
    assert api.intent("k1").status_code == 201
    cached = ApiKey.cached

    def revoked_meanwhile(raw: str, **kwargs: Any) -> Any:
        answer = cached(raw, **kwargs)
        _elsewhere("UPDATE durability_apikey SET revoked_at = now()")
        return answer

    monkeypatch.setattr(ApiKey, "cached", revoked_meanwhile)

    for send in (lambda: api.intent("k2"), lambda: api.receipt("k1", external_id="e-2")):
        assert send().status_code == 401
    assert list(Effect.objects.values_list("key", flat=True)) == ["k1"]
    assert not Effect.objects.get().receipts.exists()


def test_a_project_policy_changed_after_the_cache_is_the_one_the_intent_is_checked_under(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch, transactional_db: None
) -> None:
    assert api.intent("k1", authority=None).json()["decision"] == "proceed"
    cached = ApiKey.cached

    def enforced_meanwhile(raw: str, **kwargs: Any) -> Any:
        answer = cached(raw, **kwargs)
        _elsewhere(
            f"UPDATE durability_project SET authority_policy = 'enforce' WHERE id = {project.pk}"
        )
        return answer

    monkeypatch.setattr(ApiKey, "cached", enforced_meanwhile)

    assert api.intent("k2", authority=None).json()["decision"] == "denied"


def test_a_version_moved_by_another_project_answers_the_intent_once(
    api: Api, other_api: Api, transactional_db: None
) -> None:
    assert api.intent("k1").status_code == 201
    other = Project.objects.get(name="beta")
    before = KeysVersion.current()
    project_policy_set(project=other, actor="user:admin", policy=AuthorityPolicy.ENFORCE)
    assert KeysVersion.current() != before

    assert api.intent("k2").json()["decision"] == "proceed"

    effect = Effect.objects.get(key="k2")
    assert effect.attempts.count() == 1
    assert AuditEntry.objects.filter(effect_id=effect.pk).count() == 1


def test_the_statement_ahead_runs_before_a_first_statement_that_is_no_batch(db: None) -> None:
    KeysVersion.objects.get_or_create(pk=KeysVersion.ONE)
    seen: list[str] = []

    def holds(now: rows.Result) -> bool:
        seen.append("checked")
        return False

    refused = rows.ahead(KeysVersion.CURRENT, (), holds)
    with pytest.raises(rows.Stale), refused:
        Project.objects.exists()
        seen.append("ran")  # the check refuses first: never reached

    assert seen == ["checked"]


def test_the_statement_ahead_rides_in_the_first_batch_and_runs_once(db: None) -> None:
    KeysVersion.objects.get_or_create(pk=KeysVersion.ONE)
    checks: list[Any] = []

    def holds(now: rows.Result) -> bool:
        checks.append(now.scalar())
        return True

    with rows.ahead(KeysVersion.CURRENT, (), holds):
        batch = rows.Batch()
        answer = batch.add("SELECT 41 + 1")
        batch.run()
        Project.objects.exists()

    assert answer.scalar() == 42
    assert checks == [KeysVersion.current()]
