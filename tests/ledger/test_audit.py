"""The audit trail: every state change recorded with it, hash-chained, append-only."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from durability.audit import entry_hash, first_broken_entry
from durability.ledger.machine import Event
from durability.models import AuditAction, AuditEntry, Effect, Project, State
from tests.ledger.support import audit_of, effect_in, intent, receipt, timeout


def _moves(effect: Effect) -> list[tuple[str, str, str]]:
    return [(e.action, e.from_state, e.to_state) for e in audit_of(effect) if e.to_state]


def test_every_state_change_of_an_effect_has_its_entry_in_order(api, project):
    api.intent("k1", replay="safe", run_id="r", worker="w1")
    api.timeout("k1")
    api.intent("k1", replay="safe", run_id="r", worker="w2")
    api.failure("k1", definitive=True)
    api.receipt("k1", "re_1")
    effect = Effect.objects.get()
    assert _moves(effect) == [
        ("intent", "", "pending"),
        ("timeout", "pending", "timed_out"),
        ("retry", "timed_out", "pending"),
        ("failure", "pending", "failed"),
        ("receipt", "failed", "succeeded"),
    ]
    assert effect.state == _moves(effect)[-1][2]


def test_cases_are_audited_when_opened_and_closed(api):
    api.intent("k1")
    api.timeout("k1")
    api.receipt("k1", "re_1")
    actions = [e.action for e in audit_of(Effect.objects.get())]
    assert actions == [
        "intent",
        "timeout",
        "case_opened",
        "receipt",
        "case_closed",
        "case_opened",
    ]


def test_entries_name_the_key_that_made_the_change(api):
    api.intent("k1")
    (entry,) = audit_of(Effect.objects.get())
    assert entry.actor == f"api:{api.key[:11]}"


# Every audit entry refused from here on, in this session (its function is a temporary one).
AUDIT_UNAVAILABLE = """
    CREATE FUNCTION pg_temp.refuse_insert() RETURNS trigger AS $$
    BEGIN RAISE EXCEPTION 'audit unavailable'; END; $$ LANGUAGE plpgsql;
    CREATE TRIGGER audit_unavailable BEFORE INSERT ON durability_auditentry
        FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_insert();
"""


def test_a_state_change_whose_audit_entry_fails_is_not_committed(project):
    """The audit entry shares the state change's transaction: no entry, no change."""
    effect = effect_in(project, State.PENDING)
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_UNAVAILABLE)
    entries = AuditEntry.objects.count()
    with pytest.raises(DatabaseError, match="audit unavailable"):
        timeout(project)
    effect.refresh_from_db()
    assert effect.state == "pending"
    assert not effect.cases.exists()
    assert AuditEntry.objects.count() == entries


@pytest.mark.django_db(transaction=True)
def test_a_new_effect_whose_audit_entry_fails_at_its_own_commit_leaves_nothing(project):
    """In its own transaction the trail sends the writes and the COMMIT in one pipeline: an
    entry refused there fails the request, and the effect and attempt before it are gone."""
    with connection.cursor() as cursor:
        cursor.execute(AUDIT_UNAVAILABLE)
    try:
        assert not connection.in_atomic_block
        with pytest.raises(DatabaseError, match="audit unavailable"):
            intent(project, "k1")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER audit_unavailable ON durability_auditentry")
    assert not Effect.objects.exists()
    assert not AuditEntry.objects.exists()
    # The connection is usable again, outside any transaction.
    assert intent(project, "k1").decision == "proceed"
    assert first_broken_entry(project) is None


def test_the_chain_verifies_after_a_mixed_history(api, project):
    api.receipt("orphan", "re_0")
    for i in range(5):
        api.intent(f"k{i}", replay="safe")
        api.timeout(f"k{i}")
        api.intent(f"k{i}", replay="safe")
        api.receipt(f"k{i}", f"re_{i}")
    api.intent("orphan")
    assert first_broken_entry(project) is None


def test_a_stale_project_object_does_not_make_the_chain_look_broken(project):
    receipt(project, "orphan")  # an entry on the project's own chain
    assert first_broken_entry(project) is None


def test_each_chain_links_every_entry_to_the_one_before(api, project):
    api.intent("k1")
    api.timeout("k1")
    entries = audit_of(Effect.objects.get())
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert entries[0].prev_hash == "0" * 64
    for before, after in zip(entries, entries[1:], strict=False):
        assert after.prev_hash == before.hash
    assert all(entry_hash(e) == e.hash for e in entries)


# -- tampering ---------------------------------------------------------------------------


def _raw(sql: str) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE durability_auditentry SET actor = 'mallory'",
        "UPDATE durability_auditentry SET data = '{}'::jsonb WHERE seq = 1",
        "DELETE FROM durability_auditentry",
        "DELETE FROM durability_auditentry WHERE seq = 1",
    ],
)
def test_the_database_refuses_to_update_or_delete_audit_entries(project, sql):
    intent(project)
    before = list(AuditEntry.objects.values_list("pk", "actor", "data", "hash"))
    with pytest.raises(DatabaseError, match="append-only"):
        _raw(sql)
    assert list(AuditEntry.objects.values_list("pk", "actor", "data", "hash")) == before


def test_the_orm_cannot_rewrite_the_trail_either(project):
    intent(project)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.update(actor="mallory")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.filter(actor="test:agent").count() == 1


def _forge(after: AuditEntry, **changes: object) -> AuditEntry:
    """An entry inserted behind the services' back, as someone with SQL access could."""
    forged = AuditEntry(
        project_id=after.project_id,
        seq=after.seq + 1,
        at=after.at,
        actor="mallory",
        action="receipt",
        effect_id=after.effect_id,
        from_state="pending",
        to_state="succeeded",
        data={},
        prev_hash=after.hash,
    )
    forged.hash = entry_hash(forged)
    for name, value in changes.items():
        setattr(forged, name, value)
    forged.save(force_insert=True)
    return forged


def test_an_inserted_entry_with_a_wrong_hash_is_found(project):
    intent(project)
    forged = _forge(AuditEntry.objects.get(), hash="f" * 64)
    assert first_broken_entry(project) == forged


def test_an_inserted_entry_with_a_correct_hash_is_found_past_the_recorded_head(project):
    intent(project)
    forged = _forge(AuditEntry.objects.get())
    assert first_broken_entry(project) == forged


def test_an_entry_that_does_not_link_to_the_one_before_is_found(project):
    intent(project)
    forged = _forge(AuditEntry.objects.get(), prev_hash="0" * 64)
    assert first_broken_entry(project) == forged


def test_verifying_one_project_ignores_another_projects_chain(project):
    other = Project.objects.create(name="beta")
    intent(other)
    _forge(AuditEntry.objects.get(project=other), hash="f" * 64)
    intent(project)
    assert first_broken_entry(project) is None
    assert first_broken_entry(other) is not None


def test_every_state_machine_event_is_an_audit_action():
    assert {event.value for event in Event} <= set(AuditAction.values)
