"""The keyset pages every list reads through (`durability.paging`): walked to the end, they
show each row once, in the order, whatever the ties; a page is one statement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models import Count, Max, Min, QuerySet

from durability.models import Case, Project, Reason, Severity
from durability.paging import Keyset, Page, micros, moment
from trajectories.models import Run

START = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _walk(order: Keyset, rows: QuerySet[Any, Any], size: int) -> list[Any]:
    """Every page from the first, each after the previous page's last row."""
    shown: list[Any] = []
    position = None
    while True:
        page = order.page(rows, position, size)
        shown += page.rows
        following = page.next(order.position)
        if following is None:
            return shown
        assert len(page.rows) == size
        position = following


@pytest.fixture
def runs(project: Project) -> QuerySet[Run]:
    """23 runs over 4 moments (ties on `started`), created out of order."""
    Run.objects.bulk_create(
        Run(project=project, run_id=f"run-{n}", started=START + timedelta(microseconds=n % 4))
        for n in (7, 3, 22, 0, 15, 11, 19, 1, 8, 4, 12, 16, 20, 2, 5, 9, 13, 17, 21, 6, 10, 14, 18)
    )
    return Run.objects.filter(project=project)


@pytest.fixture
def cases(project: Project) -> QuerySet[Case]:
    """31 open cases over 3 severities and 3 moments, in 7 groups."""
    severities = [Severity.LOW, Severity.HIGH, Severity.CRITICAL]
    Case.objects.bulk_create(
        Case(
            project=project,
            reason=Reason.ORPHAN_RECEIPT,
            severity=severities[n % 3],
            summary="s",
            group_key=f"{n % 7:032x}",
            opened=START + timedelta(seconds=(n // 2) % 3),
        )
        for n in range(31)
    )
    return Case.objects.filter(project=project)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 22, 23, 24])
def test_pages_newest_first_over_equal_times_show_every_run_once_in_order(runs, size):
    order = Keyset("-started", "-pk")
    everything = list(runs.order_by("-started", "-pk"))

    assert _walk(order, runs, size) == everything


@pytest.mark.parametrize("size", [1, 2, 4, 7, 30, 31, 32])
@pytest.mark.parametrize(
    "fields", [("opened", "id"), ("-severity", "opened", "id"), ("severity", "-opened", "-id")]
)
def test_pages_in_mixed_directions_over_equal_keys_show_every_case_once_in_order(
    cases, fields, size
):
    everything = list(cases.order_by(*fields))

    assert _walk(Keyset(*fields), cases, size) == everything


@pytest.mark.parametrize("size", [1, 2, 3, 6, 7, 8])
@pytest.mark.parametrize("fields", [("first", "group_key"), ("-top", "first", "group_key")])
def test_pages_of_aggregated_rows_show_every_group_once_in_order(cases, fields, size):
    groups = (
        cases.order_by()
        .values("group_key")
        .annotate(n=Count("id"), first=Min("opened"), top=Max("severity"))
    )
    everything = list(groups.order_by(*fields))

    assert [g["group_key"] for g in _walk(Keyset(*fields), groups, size)] == [
        g["group_key"] for g in everything
    ]


def test_a_page_is_one_statement_that_reads_one_row_more_than_it_shows(
    runs, django_assert_num_queries
):
    order = Keyset("-started", "-pk")
    with django_assert_num_queries(1) as ran:
        page = order.page(runs, (START + timedelta(microseconds=3), 10**6), 5)

    assert len(page.rows) == 5 and page.more
    assert ran.captured_queries[0]["sql"].endswith("LIMIT 6")


def test_the_last_page_has_no_next_even_when_it_is_full(runs):
    order = Keyset("-started", "-pk")
    last_but_one = order.page(runs, None, 20)
    last = order.page(runs, last_but_one.next(order.position), 3)

    assert last_but_one.more and last_but_one.next(lambda run: run.pk) == last_but_one.rows[-1].pk
    assert len(last.rows) == 3 and not last.more and last.next(order.position) is None


def test_a_page_after_the_last_row_is_empty(runs):
    order = Keyset("-started", "-pk")
    oldest = runs.order_by("started", "pk").first()

    page = order.page(runs, order.position(oldest), 10)

    assert page == Page(rows=[], more=False)
    assert page.next(order.position) is None


def test_a_position_names_a_value_for_every_field_of_the_order(runs):
    with pytest.raises(ValueError):
        Keyset("-started", "-pk").after(runs, (START,))


def test_a_single_field_order_is_paged_by_that_field_alone(runs):
    ids = sorted(runs.values_list("pk", flat=True), reverse=True)

    page = Keyset("-pk").page(runs, (ids[4],), 3)

    assert [run.pk for run in page.rows] == ids[5:8] and page.more


def test_a_moment_is_spelt_in_whole_microseconds_and_read_back_exactly():
    for at in (START, datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, tzinfo=UTC)):
        assert moment(micros(at)) == at
    assert micros(START) == 1772366400123456
    assert micros(datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == -1


def test_a_moment_no_datetime_holds_is_an_overflow():
    with pytest.raises(OverflowError):
        moment(micros(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) + 1)


# A cursor from outside that names no place: each page answers as it always has (its first
# page; the queue with a note on its filter), the API refuses it with the field named.
GARBAGE = [
    ("/runs/", "before", "x-1", "runs"),
    ("/audit/", "before", "abc", "entries"),
    ("/effects/", "before", "-3", "effects"),
    ("/authority/audit/", "before", "0", "rows"),
    ("/queue/", "after", "1.2.3.4", "rows"),
    ("/queue/", "after", "garbage", "rows"),
]


@pytest.mark.parametrize(("path", "name", "value", "shown"), GARBAGE)
def test_a_cursor_that_names_no_place_shows_the_first_page(
    client, alice, api, project, path, name, value, shown
):
    api.intent("refund:1")
    api.timeout("refund:1")
    Run.objects.create(project=project, run_id="run-1")
    client.force_login(alice)
    first = client.get(path)
    tampered = client.get(path, {name: value})

    assert tampered.status_code == first.status_code == 200
    assert tampered.context[shown] and tampered.context[shown] == first.context[shown]


def test_the_apis_grants_refuse_a_cursor_that_is_no_grant_id(api):
    r = api.get("grants", before="x")

    assert r.status_code == 400
    assert r.json()["fields"] == {"before": "A grant id"}
