"""The SDK's sender delivers its spool's receipts and failures in batches
(POST /api/v1/receipts/batch, /failures/batch): each leaves the spool once its own result says
the server has it, a refused one is set aside alone, and an acknowledged one is committed."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_started
from tallybook import Tallybook
from tallybook.testing import FakeTallybook
from tallybook.transport import Response

from durability.models import Effect, Receipt
from tests.sdk.support import FAST


@pytest.fixture
def posts(live_server: Any) -> Iterator[Counter[str]]:
    """The POSTs the live server has begun, by path."""
    seen: Counter[str] = Counter()

    def count(sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        if environ["REQUEST_METHOD"] == "POST":
            seen[environ["PATH_INFO"]] += 1

    request_started.connect(count)
    yield seen
    request_started.disconnect(count)


def _receipt(n: int) -> dict[str, Any]:
    return {"key": f"send:{n}", "system": "smtp", "external_id": f"msg-{n}"}


def test_a_spool_of_100_receipts_is_sent_in_batches_and_none_is_left(
    live_server, api_key, spool_root, posts
):
    tb = Tallybook(live_server.url, api_key, spool=spool_root, **FAST)
    for n in range(100):  # as a process that ended with the server away left them
        tb.spool.release(tb.spool.put("receipts", _receipt(n)))
    assert tb.flush(60)
    tb.close()
    assert not tb.spool.pending()
    assert not list((tb.spool.directory / "rejected").iterdir())
    assert Receipt.objects.count() == 100
    assert posts["/api/v1/receipts"] == 0
    assert 1 <= posts["/api/v1/receipts/batch"] <= 100 // 2, posts


def test_a_refused_receipt_is_set_aside_alone_and_failures_batch_too(
    live_server, api, api_key, spool_root, posts
):
    for key in ("pay:a", "pay:b"):
        assert api.intent(key).status_code == 201
    tb = Tallybook(live_server.url, api_key, spool=spool_root, **FAST)
    spool = tb.spool
    for body in (_receipt(1), {**_receipt(2), "external_id": ""}, _receipt(3)):
        spool.release(spool.put("receipts", body))
    for key in ("pay:a", "pay:b"):
        spool.release(spool.put("failures", {"key": key, "error": "declined", "definitive": True}))
    assert tb.flush(60)
    tb.close()
    assert sorted(Receipt.objects.values_list("external_id", flat=True)) == ["msg-1", "msg-3"]
    rejected = sorted(p.suffix for p in (spool.directory / "rejected").iterdir())
    assert rejected == [".answer", ".json"]
    assert set(Effect.objects.values_list("state", flat=True)) == {"failed"}
    assert posts["/api/v1/receipts/batch"] == posts["/api/v1/failures/batch"] == 1, posts


def test_the_fake_answers_batches_as_the_server_does():
    tb = FakeTallybook()
    paths: list[str] = []
    request = tb.fake.request

    def recorded(method: str, path: str, body: Any = None, **options: Any) -> Any:
        paths.append(path)
        return request(method, path, body, **options)

    tb.fake.request = recorded
    for body in (_receipt(1), {**_receipt(2), "colour": "red"}, _receipt(3)):
        tb.spool.release(tb.spool.put("receipts", body))
    assert tb.flush(10)
    tb.close()
    assert paths == ["/api/v1/receipts/batch"]
    assert [r["external_id"] for r in tb.fake.orphans] == ["msg-1", "msg-3"]


def test_a_receipt_acknowledged_in_a_batch_survives_the_server_killed_after_the_answer(
    server, api_key
):
    server.start()
    body = json.dumps({"receipts": [_receipt(n) for n in range(5)]}).encode()
    request = urllib.request.Request(
        f"{server.url}/api/v1/receipts/batch",
        data=body,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        results = json.loads(answer.read())["results"]
    # At once, every process of the server SIGKILLed: nothing is left to finish anything.
    assert server.process is not None
    for pid in [*server.worker_pids(), server.process.pid]:
        os.kill(pid, signal.SIGKILL)
    server.process.wait(30)
    server.process = None
    assert [r["status"] for r in results] == [201] * 5
    assert sorted(Receipt.objects.values_list("external_id", flat=True)) == [
        f"msg-{n}" for n in range(5)
    ]


def _answering_once(tb: FakeTallybook, answer: Any) -> list[str]:
    """The fake answers its first POST with `answer(path, body, request)`, then as itself;
    the paths asked, in order."""
    paths: list[str] = []
    request = tb.fake.request

    def first(method: str, path: str, body: Any = None, **options: Any) -> Any:
        paths.append(path)
        if len(paths) == 1:
            return answer(path, body, lambda p, b: request(method, p, b, **options))
        return request(method, path, body, **options)

    tb.fake.request = first  # type: ignore[method-assign]
    return paths


def test_an_item_a_batch_refuses_for_now_stays_in_the_spool_and_goes_again():
    tb = FakeTallybook()

    def busy_on_the_second(path: str, body: Any, send: Any) -> Response:
        # The server took the first and third receipts and was too busy for the second.
        first, second, third = body["receipts"]
        taken = send(path, {"receipts": [first, third]}).body["results"]
        busy = {"index": 1, "status": 503, "body": {"error": "busy"}}
        return Response(207, {"results": [taken[0], busy, {**taken[1], "index": 2}]})

    paths = _answering_once(tb, busy_on_the_second)
    for n in (1, 2, 3):
        tb.spool.release(tb.spool.put("receipts", _receipt(n)))
    assert tb.flush(10)
    tb.close()
    assert sorted(r["external_id"] for r in tb.fake.orphans) == ["msg-1", "msg-2", "msg-3"]
    assert not list((tb.spool.directory / "rejected").iterdir())
    assert paths == ["/api/v1/receipts/batch", "/api/v1/receipts"]


def _event(n: int, **fields: Any) -> dict[str, Any]:
    return {"id": f"run-{n}", "type": "run", "run_id": f"ticket-{n}", **fields}


def test_an_event_the_server_refuses_is_set_aside_and_one_refused_for_now_goes_again():
    tb = FakeTallybook()

    def busy(path: str, body: Any, send: Any) -> Response:
        result = {"index": 0, "id": body["events"][0]["id"], "status": 503, "result": "busy"}
        return Response(207, {"stored": 0, "duplicates": 0, "rejected": 0, "results": [result]})

    paths = _answering_once(tb, busy)
    tb.spool.release(tb.spool.put("events", {"events": [_event(1)]}))
    tb.spool.release(tb.spool.put("events", {"events": [{"id": "run-2", "type": "comet"}]}))
    assert tb.flush(10)
    tb.close()
    assert list(tb.fake.events) == ["run-1"]
    rejected = sorted((tb.spool.directory / "rejected").iterdir())
    assert [p.suffix for p in rejected] == [".answer", ".json"]
    assert "Unknown event type" in rejected[0].read_text()
    assert paths == ["/api/v1/events"] * 3
