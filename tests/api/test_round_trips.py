"""What one intent and one receipt cost in PostgreSQL, pinned: each statement, and two round
trips (no health check `SELECT 1`, prepared statements already prepared, the BEGIN and the
keys version sent in the first pipeline)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import close_old_connections, connection

from durability.models import Project
from tests.conftest import Api
from tests.ledger import support as ledger
from tests.round_trips import cost

pytestmark = pytest.mark.django_db(transaction=True)  # real BEGIN and COMMIT, as served

# The intent of a new key, in two round trips: the BEGIN with the reads under the key's lock
# (one pipeline), and the writes with the COMMIT (one pipeline).
INTENT = [
    "BEGIN",  # Django's; sent in the first pipeline (`rows.begun_lazily`)
    # one pipeline:
    # the key itself locked, whether it has an effect or not; and the keys version, so that
    # the key and its project cached here are known to hold
    "SELECT (durability_keysversion), pg_advisory_xact_lock",
    # the key's effect (none yet), with its latest attempt and first receipt (for a known key)
    "SELECT durability_effect FOR UPDATE",
    "SELECT nextval",  # so a key drawn for it
    "SELECT durability_grant",  # the grant named by the intent
    "SELECT durability_receipt",  # receipts that came before the intent, to adopt
    # one pipeline: the writes as one statement (the effect with its audit chain head,
    # attempt 1 and the audit entry), and the COMMIT
    "WITH INSERT INTO durability_effect, INSERT INTO durability_attempt, "
    "INSERT INTO durability_auditentry",
    "COMMIT",
    "COMMIT",  # Django's, which finds the transaction closed and sends nothing
]
# A receipt for a pending effect.
RECEIPT = [
    "BEGIN",
    # one pipeline, with the BEGIN:
    "SELECT (durability_keysversion), pg_advisory_xact_lock",
    "SELECT durability_effect FOR UPDATE",  # with its grant, which the evidence is compared with
    "SELECT durability_receipt",  # the same receipt sent before, or else a key drawn for it
    # one pipeline: the receipt, the effect's move (pending -> succeeded, and its audit
    # chain head) and the audit entry as one statement, and the COMMIT
    "WITH INSERT INTO durability_receipt, UPDATE durability_effect, "
    "INSERT INTO durability_auditentry",
    "COMMIT",
    "COMMIT",
]


def _warmed(api: Api, project: Project) -> int:
    """Pairs first, until every statement is prepared (after DB_PREPARE_THRESHOLD runs; the
    ledger prepares a statement in the pipeline it runs in, so it costs no round trip), on
    a connection of the test's own."""
    connection.close()
    grant = ledger.everything(project).pk
    for n in range((settings.DB_PREPARE_AFTER or 0) + 1):
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
    assert spent.round_trips == 2


def test_a_receipt_costs_its_statements_and_no_round_trip_more(api: Api, project: Project) -> None:
    grant = _warmed(api, project)
    api.intent("k1", authority={"grant": grant})

    with cost() as spent:
        close_old_connections()
        assert api.receipt("k1", external_id="e-1").status_code == 201

    assert spent.statements == RECEIPT
    assert spent.round_trips == 2
