"""The web server as the deploy unit starts it (granian, two workers where two are what is
tested): a reload under load
loses no request, a stop finishes the requests begun, a crashed worker is replaced, and behind
the TLS proxy the scheme and the client's address are the proxy's words."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading

from axes.models import AccessAttempt
from tallybook import Tallybook

from durability.models import Case, Effect, Receipt
from tests.sdk.support import (
    FAST,
    ServerProcess,
    database_url_of_tests,
    post_login,
    wait_until,
)

# Retries enough to ride over a worker's replacement (a queued connection of the old worker
# may be reset where the kernel does not migrate it: net.ipv4.tcp_migrate_req).
PATIENT = {**FAST, "retries": 8, "backoff": 0.1, "max_backoff": 1.0}


def test_a_reload_under_load_loses_no_request(server, api_key, spool_root):
    server.start()
    tb = Tallybook(server.url, api_key, spool=spool_root, **PATIENT)
    reloaded = threading.Event()
    done: list[str] = []
    raised: list[BaseException] = []

    def agent(n: int) -> None:
        after = 0
        try:
            for i in range(10_000):
                if reloaded.is_set():
                    after += 1
                    if after > 3:
                        return
                key = f"send:{n}:{i}"
                with tb.effect(key, kind="email", target="smtp") as fx:
                    fx.receipt(system="smtp", external_id=f"msg-{n}-{i}")
                done.append(key)
        except BaseException as exc:
            raised.append(exc)

    agents = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for thread in agents:
        thread.start()
    try:
        wait_until(lambda: len(done) >= 8, 60, "the load to run")
        server.restart()
    finally:
        reloaded.set()
        for thread in agents:
            thread.join(120)
    assert not raised, raised
    assert tb.flush(60)
    tb.close()
    assert sorted(Effect.objects.values_list("key", flat=True)) == sorted(done)
    assert set(Effect.objects.values_list("state", flat=True)) == {"succeeded"}
    assert Receipt.objects.count() == len(done)
    assert not Case.objects.exists()
    assert not tb.spool.pending()


def test_a_stop_answers_the_request_it_has_begun(server, api_key):
    """SIGTERM (`systemctl stop`, the first half of a restart) while a request's body is still
    arriving: the worker waits for it, records the intent and answers before it exits. One
    worker: the one that holds the connection is all there is to see."""
    server.workers = 1
    server.start()
    body = json.dumps({"key": "send:held", "kind": "email", "target": "smtp"}).encode()
    # A connection a worker has accepted (it answered a first request on it): one still in a
    # stopping worker's accept queue would be reset by the kernel, which is not what is tested.
    accepted = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    accepted.request("GET", "/api/v1/openapi.json")
    accepted.getresponse().read()
    held = accepted.sock
    head = (
        f"POST /api/v1/intents HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with held:
        held.sendall(head.encode() + body[:-1])
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        held.sendall(body[-1:])
        answer = b""
        while chunk := held.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] == b"201", answer
    assert server.process.wait(60) == 0
    server.process = None
    server.close()
    assert Effect.objects.get(key="send:held").state == "pending"


def test_a_worker_killed_is_replaced(server, api_key):
    server.start()
    killed = server.worker_pids()[0]
    os.kill(killed, signal.SIGKILL)
    wait_until(
        lambda: len(server.worker_pids()) == 2 and killed not in server.worker_pids(),
        120,
        "a new worker",
    )
    tb = Tallybook(server.url, api_key, **FAST)
    for n in range(6):  # on new connections: both workers answer, whichever takes them
        with tb.effect(f"send:{n}", kind="email", target="smtp") as fx:
            fx.receipt(system="smtp", external_id=f"msg-{n}")
        tb.close()
        tb = Tallybook(server.url, api_key, **FAST)
    tb.close()
    assert Receipt.objects.count() == 6


def test_behind_the_proxy_the_scheme_and_the_address_are_the_proxys(transactional_db, alice):
    """HTTPS-only as in production, behind a proxy on 127.0.0.1 (TRUSTED_PROXIES): a request
    the proxy says came over HTTPS is served, one over plain HTTP is redirected; a failed login
    is counted for the address the proxy appended, else for the connection's (granian's
    REMOTE_ADDR). One worker: the settings are every worker's."""
    server = ServerProcess(database_url_of_tests(), workers=1)
    server.env.update(
        SECURE_SSL_REDIRECT="1",
        TRUSTED_PROXIES="127.0.0.1",
        LOGIN_CLIENT_ADDRESS_HEADER="X-Forwarded-For",
    )
    try:
        server.start()
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("GET", "/login/")
        plain = connection.getresponse()
        plain.read()
        assert plain.status == 301
        assert plain.headers["Location"] == f"https://127.0.0.1:{server.port}/login/"

        https = {"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{server.port}"}
        forwarded = {**https, "X-Forwarded-For": "198.51.100.1, 203.0.113.7"}
        assert post_login(connection, "alice", "wrong", forwarded) == 200
        assert post_login(connection, "bob", "wrong", https) == 200
        connection.close()
    finally:
        server.close()
    assert dict(AccessAttempt.objects.values_list("username", "ip_address")) == {
        "alice": "203.0.113.7",
        "bob": "127.0.0.1",
    }
