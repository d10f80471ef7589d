"""The audit log stays provable after pruning: entries keep the digest their hash covers,
the database lets only the one pruning path change them, and retention refuses what would
leave a chain unverifiable."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from durability.audit import data_digest, entry_hash, first_broken_entry
from durability.models import AuditAction, AuditEntry, Effect
from durability.retention import services
from tests.retention.support import later, policy, succeeded


def _raw(sql: str) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.fixture
def pruned(project) -> AuditEntry:
    """The failure entry of an effect whose payloads retention pruned."""
    policy(project, payload_days=1)
    effect = succeeded(project, "k1")
    services.payloads_prune(project=project, now=later())
    return AuditEntry.objects.get(effect=effect, action=AuditAction.FAILURE)


def test_every_new_entry_names_its_data_by_a_digest_its_hash_covers(project):
    effect = succeeded(project, "k1")
    for entry in AuditEntry.objects.filter(effect=effect):
        assert entry.data_digest == data_digest(entry.data)
        assert entry.hash == entry_hash(entry)


def test_verifyaudit_holds_after_payload_pruning(pruned, capsys):
    assert pruned.data == {} and pruned.pruned is not None
    call_command("verifyaudit")
    assert "the chain holds" in capsys.readouterr().out


def _tamper(sql: str, params: list[Any] | None = None) -> None:
    """A change behind the services' back, as someone with the table owner's role could
    make it (a superuser's): the triggers, the append-only one among them, off for it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL session_replication_role = origin")


@pytest.mark.parametrize(
    "change",
    [
        "data_digest = repeat('0', 64)",  # another digest for the data that went
        'data = \'{"error": "forged"}\'::jsonb',  # data put back that the digest never named
        "pruned = NULL",  # unpruned again, its data gone
        "actor = 'mallory'",
    ],
)
def test_verifyaudit_fails_on_a_tampered_pruned_entry(pruned, change):
    _tamper(f"UPDATE durability_auditentry SET {change} WHERE id = %s", [pruned.pk])
    assert first_broken_entry(pruned.project) == pruned
    with pytest.raises(CommandError, match="Broken audit chain in: alpha"):
        call_command("verifyaudit")


@pytest.mark.parametrize(
    "sql",
    [
        # Without the pruning function's setting, no update at all.
        "UPDATE durability_auditentry SET data = '{}'::jsonb, pruned = now()",
        "DELETE FROM durability_auditentry",
        # With it, nothing but the pruning's own change: no other column, no other data.
        "SET LOCAL tallybook.audit_prune = 'on';"
        " UPDATE durability_auditentry SET data = '{}'::jsonb, pruned = now(), actor = 'x'",
        "SET LOCAL tallybook.audit_prune = 'on';"
        " UPDATE durability_auditentry SET data = '{\"a\": 1}'::jsonb, pruned = now()",
        "SET LOCAL tallybook.audit_prune = 'on'; UPDATE durability_auditentry SET pruned = NULL",
        "SET LOCAL tallybook.audit_prune = 'on'; DELETE FROM durability_auditentry",
        # Nor the pruning's change of an entry retention never prunes (an intent, a verdict,
        # a project's): only an effect's failure and timeout entries lose their data.
        "SET LOCAL tallybook.audit_prune = 'on';"
        " UPDATE durability_auditentry SET data = '{}'::jsonb, pruned = now()"
        " WHERE action NOT IN ('failure', 'timeout')",
    ],
)
def test_the_database_refuses_every_change_of_an_entry_but_the_pruning_path(pruned, sql):
    before = list(AuditEntry.objects.order_by("id").values_list("id", "actor", "data", "pruned"))
    with pytest.raises(DatabaseError, match="append-only"):
        _raw(sql)
    after = list(AuditEntry.objects.order_by("id").values_list("id", "actor", "data", "pruned"))
    assert after == before


def test_the_pruning_function_leaves_every_entry_but_failures_and_timeouts_whole(project):
    effect = succeeded(project, "k1")
    others = AuditEntry.objects.filter(effect=effect).exclude(
        action__in=[AuditAction.FAILURE, AuditAction.TIMEOUT]
    )
    assert others.exists()
    assert services.audit_entries_prune([e.pk for e in others], now=later()) == 0
    assert not AuditEntry.objects.filter(pruned__isnull=False).exists()


def test_the_pruning_function_empties_data_and_keeps_everything_the_hash_covers(project):
    effect = succeeded(project, "k1")
    entry = AuditEntry.objects.get(effect=effect, action=AuditAction.FAILURE)
    assert services.audit_entries_prune([entry.pk], now=later()) == 1
    after = AuditEntry.objects.get(pk=entry.pk)
    assert after.data == {} and after.data_digest == entry.data_digest
    assert after.hash == entry.hash and after.at == entry.at
    assert first_broken_entry(project) is None


def test_an_entry_hashed_over_its_whole_data_is_refused_with_why(project):
    """Entries written before digests were hashed over their data: emptying it would break
    their chain, so retention keeps it and says so."""
    effect = succeeded(project, "k1")
    old = AuditEntry.objects.get(effect=effect, action=AuditAction.FAILURE)
    _tamper(
        "UPDATE durability_auditentry SET data_digest = '', hash = %s WHERE id = %s",
        [entry_hash(_whole(old)), old.pk],
    )
    # (A chain rewritten from that entry on, as a database from before digests holds it.)
    _rechain(effect)
    assert first_broken_entry(project) is None
    with pytest.raises(services.Refused, match="hashed over their whole data"):
        services.audit_entries_prune([old.pk], now=later())
    policy(project, payload_days=1)
    done = services.payloads_prune(project=project, now=later())
    assert done.effects == 1 and done.entries == 0 and done.kept_whole == 1
    assert AuditEntry.objects.get(pk=old.pk).data == old.data
    assert first_broken_entry(project) is None


def _whole(entry: AuditEntry) -> AuditEntry:
    entry.data_digest = ""
    return entry


def _rechain(effect: Effect) -> None:
    """Re-link the chain's hashes after an entry changed, behind the trigger's back."""
    prev = "0" * 64
    for entry in AuditEntry.objects.filter(effect=effect).order_by("seq"):
        entry.prev_hash = prev
        entry.hash = prev = entry_hash(entry)
        _tamper(
            "UPDATE durability_auditentry SET prev_hash = %s, hash = %s WHERE id = %s",
            [entry.prev_hash, entry.hash, entry.pk],
        )
    Effect.objects.filter(pk=effect.pk).update(audit_head=prev)


def test_retention_refuses_an_effect_whose_chain_does_not_verify(project):
    """Pruning a tampered entry would make it verify again from its digest: refused."""
    policy(project, payload_days=1)
    effect = succeeded(project, "k1")
    failed = AuditEntry.objects.get(effect=effect, action=AuditAction.FAILURE)
    _tamper(
        'UPDATE durability_auditentry SET data = \'{"error": "forged"}\' WHERE id = %s',
        [failed.pk],
    )
    with pytest.raises(services.Refused, match="would hide the break"):
        services.payloads_prune(project=project, now=later())
    assert Effect.objects.get(pk=effect.pk).payload_pruned is None
    assert AuditEntry.objects.get(pk=failed.pk).data == {"error": "forged"}
