"""The hot lookups use their unique index, on a fresh database and on a grown one.

Each plan is PostgreSQL's for the statement the code ran (read back with the values in it):
an intent's look for its key's effect and the reads beside it, a receipt's look for the same
receipt sent before, and an API key's look by digest.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.models import ApiKey, Effect, Project, Receipt
from tests import plans
from tests.ledger import support as ledger
from tests.round_trips import shape


def _plans(run: Any, *shapes: str) -> list[dict[str, set[str]]]:
    """The indexes each plan reads each table by ({table: indexes}), for the first statement
    of each shape that `run` ran."""
    with CaptureQueriesContext(connection) as queries:
        run()
    ran: dict[str, str] = {}
    for query in queries.captured_queries:
        ran.setdefault(shape(query["sql"]), query["sql"])
    found = []
    for one in shapes:
        plan = plans.explain(ran[one])
        found.append({table: plans.indexes(plan, table) for table in plans.tables(plan)})
    return found


@pytest.fixture(params=[2_000, 20_000], ids=["fresh", "grown"])
def database(request: pytest.FixtureRequest, project: Project) -> Project:
    """The project among effects, receipts and API keys of its own and of another project,
    analyzed as autovacuum does once 50 rows and 10% changed: 2,000 (a fresh database in its
    first minutes) or 20,000 (a sequential scan is cheaper than any index below about a
    thousand).

    Before any statistics, on a table of under ten pages, every index that leads with
    project_id costs the planner the same as the unique one, and it may take any of them:
    each reads the same one page then.
    """
    rows = request.param
    other = Project.objects.create(name="beta")
    for owner in (project, other):
        plans.grow(
            Effect,
            rows // 2,
            sql={"key": "'old-' || n"},
            project=owner,
            kind="payment",
            target="stripe",
        )
        plans.attempts_and_receipts(owner)
        # Receipts whose intent never came (one in twenty): orphans of other keys.
        plans.grow(
            Receipt,
            rows // 40,
            sql={"key": "'lost-' || n", "external_id": "'lost-' || n"},
            project=owner,
            system="stripe",
        )
        plans.grow(
            ApiKey,
            rows // 20,
            sql={"digest": f"lpad('{owner.pk}-' || n, 64, '0')"},
            project=owner,
            prefix="tb_old",
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE durability_effect, durability_attempt, durability_receipt, durability_apikey"
        )
    return project


def test_an_intent_for_a_new_key_looks_for_it_by_its_unique_index(database: Project) -> None:
    by_key, orphans = _plans(
        lambda: ledger.intent(database, "k-new"),
        # with the latest attempt and the first receipt of the key's effect
        "SELECT durability_effect FOR UPDATE",
        "SELECT durability_receipt",  # receipts of the key that came before it
    )

    assert by_key == {
        "durability_effect": {"effect_project_key_uniq"},
        "durability_attempt": {"attempt_of_effect_uniq"},
        "durability_receipt": {"receipt_of_effect_idx"},
    }
    assert orphans == {"durability_receipt": {"receipt_orphans_of_key_idx"}}


def test_a_receipt_looks_for_itself_by_its_unique_index(database: Project) -> None:
    ledger.intent(database, "k1")

    by_key, same_receipt = _plans(
        lambda: ledger.receipt(database, "k1", external_id="ext-1"),
        "SELECT durability_effect FOR UPDATE",  # with the effect's grant
        "SELECT durability_receipt",
    )

    # The grant beside it by its primary key (or a scan of the few grants of this test).
    assert by_key["durability_effect"] == {"effect_project_key_uniq"}
    assert same_receipt == {"durability_receipt": {"receipt_identity_uniq"}}


def test_an_api_key_is_found_by_its_digest_index(database: Project) -> None:
    _, raw = ApiKey.issue(database)

    (by_digest,) = _plans(lambda: ApiKey.authenticate(raw), "SELECT durability_apikey")

    assert by_digest["durability_apikey"] == {"apikey_digest_uniq"}
