"""The SDK's HTTP behaviour against a small local HTTP/1.1 server: which answers are
retried, how long it backs off, Retry-After, timeouts and connection reuse."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tallybook import IntentNotRecorded, ServerUnavailable, Tallybook
from tallybook.transport import Retry, Transport

from tests.ports import refusing_port

PROCEED = {
    "decision": "proceed",
    "effect": {"id": 1, "key": "k", "state": "pending", "attempt": 1, "url": "http://x/e/1/"},
    "receipt": None,
    "case": None,
    "reason": "New effect: perform it, then send the receipt.",
}


class Script:
    """A keep-alive HTTP server that answers from a script: (status, headers, body, delay)."""

    def __init__(self, *answers):
        self.answers = deque(answers)
        self.seen = []  # (monotonic time, client port, path, body)
        self.arrived = threading.Event()  # set by each request, as it is seen
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                script.answer(self)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, handler):
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.seen.append((time.monotonic(), handler.client_address[1], handler.path, body))
        self.arrived.set()
        status, headers, body, delay = (
            self.answers.popleft() if len(self.answers) > 1 else (self.answers[0])
        )
        # A delay is seconds, or an event the test sets to let the answer go.
        delay.wait(30) if isinstance(delay, threading.Event) else time.sleep(delay)
        data = json.dumps(body).encode()
        handler.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(status, body=None, delay=0.0, **headers):
    return (status, headers, body if body is not None else {"error": "x"}, delay)


class Clock:
    """Time for a transport that only pretends to sleep: the pauses it asked for, kept."""

    def __init__(self):
        self.now, self.pauses = 1000.0, []

    def sleep(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds

    def __call__(self):
        return self.now


def transport(url, retries=4, backoff=0.05, timeout=5.0, clock=None):
    timing = {"sleep": clock.sleep, "clock": clock} if clock else {}
    return Transport(
        url,
        "tb_test",
        timeout=timeout,
        retry=Retry(retries, backoff, 5.0),
        user_agent="test",
        **timing,
    )


def test_it_retries_5xx_and_429_until_an_answer_comes():
    with Script(answer(503), answer(502), answer(429), answer(200, {"ok": True})) as server:
        response = transport(server.url).request("GET", "/x")

    assert (response.status, response.body) == (200, {"ok": True})
    assert len(server.seen) == 4


def test_it_does_not_retry_a_4xx():
    with Script(answer(400, {"error": "Invalid request", "fields": {"key": "bad"}})) as server:
        response = transport(server.url).request("POST", "/x", {"key": ""})

    assert response.status == 400 and len(server.seen) == 1


def test_the_pauses_grow_exponentially_with_jitter():
    clock = Clock()
    with Script(answer(503)) as server, pytest.raises(ServerUnavailable, match="5 tries"):
        transport(server.url, retries=4, backoff=0.1, clock=clock).request("GET", "/x")

    assert len(server.seen) == 5 and len(clock.pauses) == 4
    for n, pause in enumerate(clock.pauses):
        step = 0.1 * 2**n
        assert step / 2 <= pause <= step, (n, clock.pauses)


def test_it_honours_retry_after_in_seconds():
    clock = Clock()
    with Script(answer(429, **{"Retry-After": "1"}), answer(200, {})) as server:
        transport(server.url, backoff=0.01, clock=clock).request("GET", "/x")

    assert clock.pauses == [1.0] and len(server.seen) == 2


def test_it_honours_retry_after_as_an_http_date():
    clock = Clock()
    when = formatdate(time.time() + 3, usegmt=True)
    with Script(answer(503, **{"Retry-After": when}), answer(200, {})) as server:
        transport(server.url, backoff=0.01, clock=clock).request("GET", "/x")

    (pause,) = clock.pauses
    assert 1.0 < pause <= 3.0  # the date has a resolution of one second


def test_a_slow_answer_times_out_and_is_retried():
    with Script(answer(200, {}, delay=3.0), answer(200, {"late": False})) as server:
        response = transport(server.url, timeout=0.3).request("GET", "/x")

    assert response.body == {"late": False}
    assert len(server.seen) == 2


def test_connection_refused_is_retried_then_reported():
    clock = Clock()
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(ServerUnavailable, match="3 tries.*ConnectionRefused"):
            transport(url, retries=2, backoff=0.1, clock=clock).request("GET", "/x")

    assert len(clock.pauses) == 2


def test_a_budget_ends_the_retries_before_a_pause_would_pass_it(monkeypatch):
    # No jitter: the pauses are 1, 2 and 4 s of the clock's pretended time, so the tries
    # start with 10, 9, 7 and 3 s of the budget left, and each has at least 3 real seconds to
    # be answered in, however busy the machine.
    monkeypatch.setattr("tallybook.transport.random.uniform", lambda low, high: high)
    clock = Clock()
    with Script(answer(503)) as server, pytest.raises(ServerUnavailable, match="tries: HTTP 503"):
        client = Transport(
            server.url, "tb_test", timeout=5.0, retry=Retry(10, 1.0, 4.0), user_agent="test",
            sleep=clock.sleep, clock=clock,
        )  # fmt: skip
        client.request("GET", "/x", budget=10.0)

    # The budget, not the ten retries, ended it: the next pause (4 s) would have passed it.
    assert len(server.seen) == 4 and clock.pauses == [1.0, 2.0, 4.0]


def test_one_connection_is_reused_for_consecutive_requests():
    with Script(answer(200, {})) as server:
        client = transport(server.url)
        for _ in range(5):
            client.request("GET", "/x")

    assert len({port for _, port, *_ in server.seen}) == 1


def test_an_intent_refused_with_a_4xx_is_not_recorded_and_not_retried(tmp_path):
    with Script(answer(401, {"error": "Missing, wrong or revoked API key"})) as server:
        tb = Tallybook(server.url, "tb_wrong", spool=tmp_path, retries=3, backoff=0.01)
        with (
            pytest.raises(IntentNotRecorded, match="revoked") as raised,
            tb.effect("k", kind="email", target="smtp"),
        ):
            pytest.fail("the effect ran")

    assert raised.value.status == 401 and len(server.seen) == 1


def test_a_failing_open_effect_runs_and_its_events_wait_in_the_spool(tmp_path):
    with Script(answer(503)) as server:
        tb = Tallybook(server.url, "tb_x", spool=tmp_path, retries=1, backoff=0.01)
        with tb.effect("k", kind="cache", target="redis", fail_open=True) as fx:
            assert fx.decision == "unrecorded" and not fx.recorded
            fx.receipt(system="redis", external_id="set:k")
        spooled = [json.loads(p.read_text())["endpoint"] for p in tb.spool.pending()]

    tb.close()
    assert spooled == ["intents", "receipts"]


def test_a_retried_intent_names_the_same_worker_so_the_server_sees_one_attempt(tmp_path):
    with Script(answer(503), answer(201, PROCEED)) as server:
        tb = Tallybook(server.url, "tb_x", spool=tmp_path, retries=2, backoff=0.01)
        with tb.effect("k", kind="email", target="smtp") as fx:
            fx.fail("not sent", definitive=True)
        tb.close()

    paths = [path for _, _, path, _ in server.seen]
    assert paths == ["/api/v1/intents", "/api/v1/intents", "/api/v1/failures"]
    workers = {json.loads(body)["worker"] for _, _, path, body in server.seen[:2]}
    assert workers == {tb.worker}


def test_a_receipt_returns_before_the_server_has_answered_it(tmp_path):
    held = threading.Event()
    with Script(answer(201, PROCEED), answer(201, {}, delay=held)) as server:
        tb = Tallybook(server.url, "tb_x", spool=tmp_path)
        with tb.effect("k", kind="email", target="smtp") as fx:
            fx.receipt(system="smtp", external_id="msg-1")

        assert not held.is_set() and len(tb.spool.pending()) == 1
        held.set()
        assert tb.flush()
        tb.close()

    assert [path for _, _, path, _ in server.seen] == ["/api/v1/intents", "/api/v1/receipts"]


def test_an_intent_the_server_sits_on_fails_closed_within_its_budget(tmp_path):
    held = threading.Event()
    with Script(answer(201, PROCEED, delay=held)) as server:
        tb = Tallybook(server.url, "tb_x", spool=tmp_path, intent_budget=0.5)
        with (
            pytest.raises(IntentNotRecorded, match="TimeoutError|timed out"),
            tb.effect("k", kind="email", target="smtp"),
        ):
            pytest.fail("the effect ran")

        # Given up on while the server still held the request: the budget ended it.
        assert server.arrived.wait(30), "the intent never reached the server"
        assert not held.is_set()
        held.set()
        tb.close()
