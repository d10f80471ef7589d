"""What a search costs: the same few queries whether it finds one row of each kind or
many (no query per row found), and a fixed number for a text that finds nothing."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.desk.support import logged_in, uncertain_case
from tests.ledger.support import receipt
from tests.search.support import found, run


def _queries(client, q: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/search/", {"q": q}).status_code == 200
    return [query["sql"] for query in queries.captured_queries]


def _some(project, n: int) -> None:
    for i in range(n):
        uncertain_case(project, f"refund:{i}", run_id=f"refund-run-{i}")
        receipt(project, f"refund:{i}", f"re_refund_{i}")
        run(project, f"refund-run-{i}", f"{i:032x}", agent="refund-bot")


def test_the_query_count_does_not_grow_with_what_is_found(alice, project):
    client = logged_in(alice)
    _some(project, 1)
    one = _queries(client, "refund")
    for n in range(1, 15):
        uncertain_case(project, f"refund:{n}", run_id=f"refund-run-{n}")
        run(project, f"refund-run-{n}", f"{n:032x}", agent="refund-bot")
    many = _queries(client, "refund")
    assert len(found(client, "refund")["effects"]) == 10
    assert len(many) == len(one)
    # The session, the user, the memberships with their projects, the role's permissions; the
    # search's transaction (a savepoint in a test) with its SET LOCAL: effects' tiers, their
    # rows, the cases' own tiers, their cases, their approvals, runs' tiers, their rows; the
    # header's project switcher.
    assert len(one) == 15, "\n".join(one)


def test_a_text_that_finds_nothing_costs_the_tiers_only(alice, project):
    client = logged_in(alice)
    _some(project, 3)
    queries = _queries(client, "nothing-like-it")
    # No rows to load and no effects whose cases to look for: the tiers alone (effects',
    # cases' own, runs'), and the approvals' one statement (their sign-offs' text).
    assert len(queries) == 12, "\n".join(queries)
