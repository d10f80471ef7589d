"""One web process works on at most TALLYBOOK_INGEST_LARGE_PER_PROCESS large OTLP batches at
once (ingest.large_batch): another large one is a 429 before it is inflated, small ones pass.
The tests hold the gate themselves, as a batch busy in another thread of the process would."""

from __future__ import annotations

import gzip

import pytest
from google.rpc import status_pb2

from tests.trajectories.support import post_traces, request, slots_taken, span
from trajectories import ingest, otlp
from trajectories.models import Span

__all__ = ["slots_taken"]

ROOT = "00f067aa0ba902b7"
GZIP = {"Content-Encoding": "gzip"}


def large() -> bytes:
    """A valid request of 64 spans inflating past LARGE_BODY, gzip (a few KB of it)."""
    spans = [span(f"{n + 1:016x}", "big", attributes={"pad": "x" * 6000}) for n in range(64)]
    body = request(*spans).SerializeToString()
    assert len(body) > otlp.LARGE_BODY
    return gzip.compress(body)


@pytest.fixture
def gate_taken(db):
    gate = ingest.LARGE_BATCHES
    assert gate is not None
    assert gate.acquire(blocking=False)
    yield
    gate.release()


def gate_free() -> bool:
    gate = ingest.LARGE_BATCHES
    assert gate is not None
    if not gate.acquire(blocking=False):
        return False
    gate.release()
    return True


def test_large_is_told_by_the_inflated_size_not_the_compressed_one():
    bomb = gzip.compress(b"\0" * (otlp.LARGE_BODY + 1))
    assert len(bomb) < 1024 and otlp.is_large(bomb, "gzip")
    assert not otlp.is_large(gzip.compress(b"\0" * otlp.LARGE_BODY), "gzip")
    assert otlp.is_large(b"\0" * (otlp.LARGE_BODY + 1), "")
    assert not otlp.is_large(b"\0" * otlp.LARGE_BODY, "identity")
    assert not otlp.is_large(b"\xff not gzip", "gzip")  # inflate() answers it: a 400


def test_a_large_batch_is_told_to_retry_while_the_process_works_on_another(api, gate_taken):
    r = post_traces(api.client, api.key, large(), headers=GZIP)
    assert r.status_code == 429 and r["Retry-After"] == "1"
    status = status_pb2.Status.FromString(r.content)
    assert status.code == 8 and "another large batch" in status.message  # RESOURCE_EXHAUSTED
    # In the request's encoding: OTLP/JSON, not compressed, over LARGE_BODY.
    spans = [span(f"{n + 1:016x}", attributes={"pad": "x" * 6000}) for n in range(64)]
    r = post_traces(api.client, api.key, request(*spans), as_json=True)
    assert r.status_code == 429 and r["Retry-After"] == "1"
    assert r.json()["code"] == 8 and "another large batch" in r.json()["message"]
    assert not Span.objects.exists()


def test_small_batches_pass_the_taken_gate_from_every_project(api, other_api, gate_taken):
    assert post_traces(api.client, api.key, request(span(ROOT, "mine"))).status_code == 200
    small = gzip.compress(request(span(ROOT, "theirs")).SerializeToString())
    r = post_traces(other_api.client, other_api.key, small, headers=GZIP)
    assert r.status_code == 200
    assert sorted(Span.objects.values_list("name", flat=True)) == ["mine", "theirs"]


def test_the_gate_is_given_back_after_an_answer(api):
    assert post_traces(api.client, api.key, large(), headers=GZIP).status_code == 200
    assert gate_free()
    unparsable = gzip.compress(b"\xff" * (otlp.LARGE_BODY + 1))
    assert post_traces(api.client, api.key, unparsable, headers=GZIP).status_code == 400
    assert gate_free()
    assert post_traces(api.client, api.key, large(), headers=GZIP).status_code == 200
    assert Span.objects.count() == 64


def test_the_gate_is_given_back_after_an_exception(api, monkeypatch):
    def broken(**kwargs: object) -> None:
        raise RuntimeError("storage broke")

    monkeypatch.setattr(ingest, "spans_ingest", broken)
    with pytest.raises(RuntimeError, match="storage broke"):
        post_traces(api.client, api.key, large(), headers=GZIP)
    assert gate_free()


def test_the_gate_is_given_back_when_the_projects_slots_are_taken(api, slots_taken):
    r = post_traces(api.client, api.key, large(), headers=GZIP)
    assert r.status_code == 429 and "batches of this project" in (
        status_pb2.Status.FromString(r.content).message
    )
    assert gate_free()


def test_no_gate_when_the_setting_is_zero(api, gate_taken, monkeypatch):
    monkeypatch.setattr(ingest, "LARGE_BATCHES", None)
    assert post_traces(api.client, api.key, large(), headers=GZIP).status_code == 200
    assert Span.objects.count() == 64
