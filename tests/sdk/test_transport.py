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

from tests.sdk.support import free_port

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
        status, headers, body, delay = (
            self.answers.popleft() if len(self.answers) > 1 else (self.answers[0])
        )
        time.sleep(delay)
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


def transport(url, retries=4, backoff=0.05, timeout=5.0):
    return Transport(
        url, "tb_test", timeout=timeout, retry=Retry(retries, backoff, 5.0), user_agent="test"
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
    with Script(answer(503)) as server, pytest.raises(ServerUnavailable, match="5 tries"):
        transport(server.url, retries=4, backoff=0.1).request("GET", "/x")

    times = [t for t, *_ in server.seen]
    pauses = [b - a for a, b in zip(times, times[1:], strict=False)]
    for n, pause in enumerate(pauses):
        step = 0.1 * 2**n
        assert step / 2 <= pause <= step + 0.5, (n, pauses)


def test_it_honours_retry_after_in_seconds():
    with Script(answer(429, **{"Retry-After": "1"}), answer(200, {})) as server:
        transport(server.url, backoff=0.01).request("GET", "/x")

    (first, *_), (second, *_) = server.seen
    assert second - first >= 1.0


def test_it_honours_retry_after_as_an_http_date():
    when = formatdate(time.time() + 2, usegmt=True)
    with Script(answer(503, **{"Retry-After": when}), answer(200, {})) as server:
        transport(server.url, backoff=0.01).request("GET", "/x")

    (first, *_), (second, *_) = server.seen
    assert second - first >= 0.9  # the date has a resolution of one second


def test_a_slow_answer_times_out_and_is_retried():
    with Script(answer(200, {}, delay=3.0), answer(200, {"late": False})) as server:
        started = time.monotonic()
        response = transport(server.url, timeout=0.3).request("GET", "/x")

    assert response.body == {"late": False}
    assert time.monotonic() - started < 2.0


def test_connection_refused_is_retried_then_reported():
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="3 tries.*ConnectionRefused"):
        transport(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.1).request("GET", "/x")

    assert time.monotonic() - started >= 0.05 + 0.1


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
