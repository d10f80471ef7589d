"""No stored time can make a page fail: the database holds only times Python can load, the
times stored before that rule are repaired by the migration that made it, and the pages'
own parameters (cursors, offsets) refuse what they cannot read."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from tests.trajectories.support import post_traces, request, span
from trajectories.models import Run, Span

ROOT, CHILD = "a" * 16, "b" * 16
# The migration before 0003_stored_times_in_range, which repairs the times.
BEFORE = "0002_foreign_keys_use_the_unique_indexes"
# What an agent key could store before the entrances checked times: a year PostgreSQL
# holds and Python cannot load, a year 1 that its offset turns into 1 BC, infinity.
UNLOADABLE = {
    "run.started": "0001-01-01 00:00:00+05",
    "run.ended": "10000-01-01 00:00:00+00",
    "span.start": "0001-01-01 00:00:00+05",
    "span.end": "infinity",
}


@pytest.fixture
def stored(api):
    post_traces(api.client, api.key, request(span(ROOT), span(CHILD, parent=ROOT)))
    return Run.objects.get(), Span.objects.get(span_id=CHILD)


def _pages(client, run, child) -> dict[str, int]:
    paths = ["/", "/runs/", f"/runs/{run.pk}/", f"/runs/{run.pk}/spans/{child.pk}/"]
    return {path: client.get(path).status_code for path in paths}


def _migrate(target: str | None) -> None:
    """Migrate trajectories to `target`, or to its latest migration."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("trajectories", target)] if target else executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_repairs_times_no_page_could_show(client, alice, stored):
    run, child = stored
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE trajectories_run SET started = %s, ended = %s WHERE id = %s",
                [UNLOADABLE["run.started"], UNLOADABLE["run.ended"], run.pk],
            )
            cursor.execute(
                'UPDATE trajectories_span SET start = %s, "end" = %s WHERE id = %s',
                [UNLOADABLE["span.start"], UNLOADABLE["span.end"], child.pk],
            )
    finally:
        _migrate(None)
    client.force_login(alice)
    assert set(_pages(client, run, child).values()) == {200}
    repaired_run, repaired_span = Run.objects.get(), Span.objects.get(pk=child.pk)
    assert (repaired_run.started, repaired_run.ended) == (run.updated, None)
    assert (repaired_span.start, repaired_span.end) == (child.received, None)


@pytest.mark.parametrize("column, table", [(c, c.split(".")[0]) for c in UNLOADABLE])
def test_the_database_refuses_a_time_no_page_could_show(stored, column, table):
    run, child = stored
    name = column.split(".")[1]
    with (
        pytest.raises(IntegrityError, match="in_range"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            f'UPDATE trajectories_{table} SET "{name}" = %s WHERE id = %s',
            [UNLOADABLE[column], run.pk if table == "run" else child.pk],
        )


@pytest.mark.parametrize(
    "query",
    [
        "before=¹²-1",
        "before=99999999999999999999-1",
        "before=1-" + "9" * 5000,
        "since=0001-01-01T00:00%2B05:00",
        "until=9999-12-31T23:59-05:00",
    ],
)
def test_the_runs_page_answers_whatever_its_parameters(client, alice, stored, query):
    client.force_login(alice)
    assert client.get(f"/runs/?{query}").status_code == 200


@pytest.mark.parametrize("query", ["root=²", "offset=⁵", "offset=" + "9" * 5000])
def test_the_run_page_answers_whatever_its_parameters(client, alice, stored, query):
    client.force_login(alice)
    run, _ = stored
    assert client.get(f"/runs/{run.pk}/?{query}").status_code == 200
