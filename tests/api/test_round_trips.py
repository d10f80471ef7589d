"""What one intent and one receipt cost in PostgreSQL, pinned: each statement, and no round
trip beyond them (no health check `SELECT 1`, prepared statements already prepared)."""

from __future__ import annotations

import pytest
from django.db import close_old_connections, connection

from durability.models import Project
from tests.conftest import Api
from tests.ledger import support as ledger
from tests.round_trips import cost

pytestmark = pytest.mark.django_db(transaction=True)  # real BEGIN and COMMIT, as served

# The intent of a new key, as the ledger writes it today (issue 13 asks for <= 3 round trips).
INTENT = [
    "SELECT durability_keysversion",  # the key and its project cached here still hold
    "BEGIN",
    "SELECT durability_effect FOR UPDATE",  # the key's effect: none yet
    "SELECT pg_advisory_xact_lock",  # so lock the key itself
    "SELECT durability_effect FOR UPDATE",  # and look again under that lock
    "SELECT durability_grant",  # the grant named by the intent
    "SAVEPOINT",  # around the effect's insert
    "INSERT INTO durability_effect",
    "RELEASE SAVEPOINT",
    "INSERT INTO durability_attempt",  # attempt 1
    "SELECT durability_receipt",  # orphan receipts for the key, to adopt
    "SELECT durability_effect",  # the effect's audit chain head
    "UPDATE durability_effect",  # moved on
    "INSERT INTO durability_auditentry",
    "COMMIT",
]
# A receipt for a pending effect.
RECEIPT = [
    "SELECT durability_keysversion",
    "BEGIN",
    "SELECT durability_effect FOR UPDATE",
    "SELECT durability_receipt",  # the same receipt sent before?
    "INSERT INTO durability_receipt",
    "UPDATE durability_effect",  # pending -> succeeded
    "SELECT durability_grant",  # the evidence compared with the grant
    "SELECT durability_effect",  # the effect's audit chain head
    "UPDATE durability_effect",
    "INSERT INTO durability_auditentry",
    "COMMIT",
]


def _warmed(api: Api, project: Project) -> int:
    """Pairs first, until psycopg prepared every statement (after DB_PREPARE_THRESHOLD runs,
    preparing costs a round trip of its own once), on a connection of the test's own: one
    that earlier tests used could have a DEALLOCATE of psycopg's to send (its cache holds
    100 statements; a ROLLBACK empties it)."""
    connection.close()
    grant = ledger.everything(project).pk
    for n in range(connection.settings_dict["OPTIONS"]["prepare_threshold"] + 1):
        assert api.intent(f"warm-{n}", authority={"grant": grant}).status_code == 201
        assert api.receipt(f"warm-{n}", external_id=f"w-{n}").status_code == 201
    return grant


def test_an_intent_for_a_new_key_costs_its_statements_and_no_round_trip_more(
    api: Api, project: Project
) -> None:
    grant = _warmed(api, project)

    with cost() as spent:
        close_old_connections()  # as every request served starts (the test client skips it)
        assert api.intent("k1", authority={"grant": grant}).json()["decision"] == "proceed"

    assert spent.statements == INTENT
    assert spent.round_trips == len(INTENT)


def test_a_receipt_costs_its_statements_and_no_round_trip_more(api: Api, project: Project) -> None:
    grant = _warmed(api, project)
    api.intent("k1", authority={"grant": grant})

    with cost() as spent:
        close_old_connections()
        assert api.receipt("k1", external_id="e-1").status_code == 201

    assert spent.statements == RECEIPT
    assert spent.round_trips == len(RECEIPT)
