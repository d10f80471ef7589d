"""One project's flood of OTLP requests leaves the other projects' ingest served: each project
holds at most a few ingest slots, taken before a body is inflated or decoded."""

from __future__ import annotations

import gzip

from django.db import connection
from google.rpc import status_pb2

from tests.trajectories.support import post_traces, request, slots_taken, span
from trajectories import ingest
from trajectories.models import Span

__all__ = ["slots_taken"]

ROOT = "00f067aa0ba902b7"


def test_a_project_whose_slots_are_all_taken_is_told_to_retry_before_its_body_is_read(
    api, slots_taken
):
    # A body that would be a 400 (or a 413 once inflated) is not looked at: the slot comes first.
    bomb = gzip.compress(b"\xff" * 10_000_000)
    r = post_traces(api.client, api.key, bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 429 and r["Retry-After"] == "1"
    assert status_pb2.Status.FromString(r.content).code == 8  # RESOURCE_EXHAUSTED
    assert f"{ingest.SLOTS_PER_PROJECT} batches of this project" in (
        status_pb2.Status.FromString(r.content).message
    )


def test_another_projects_request_is_served_while_the_first_one_floods(api, other_api, slots_taken):
    assert post_traces(api.client, api.key, request(span(ROOT, "mine"))).status_code == 429
    r = post_traces(other_api.client, other_api.key, request(span(ROOT, "theirs")), as_json=True)
    assert r.status_code == 200 and r.json() == {}
    assert list(Span.objects.values_list("name", flat=True)) == ["theirs"]


def test_a_slot_is_given_back_whatever_the_answer(api):
    truncated = gzip.compress(b"x")[:-4]
    statuses = set()
    for _ in range(ingest.SLOTS_PER_PROJECT + 1):
        statuses |= {
            post_traces(api.client, api.key, b"\xff not protobuf").status_code,
            post_traces(
                api.client, api.key, truncated, headers={"Content-Encoding": "gzip"}
            ).status_code,
            post_traces(api.client, api.key, request(span("0" * 16))).status_code,
        }
    assert statuses == {200, 400}
    assert post_traces(api.client, api.key, request(span(ROOT))).status_code == 200
    assert Span.objects.count() == 1
    # The test client shares this connection, whose own locks would not stop it: count them.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND pid = pg_backend_pid()",
            [ingest.SLOT_LOCK_CLASS],
        )
        assert cursor.fetchone() == (0,)
