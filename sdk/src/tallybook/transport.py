"""HTTP to the Tallybook API over the standard library: pooled keep-alive connections,
a timeout on every call, and retries with exponential backoff and jitter on connection
errors, 429 and 5xx only (honouring Retry-After).

Every request the SDK makes is safe to repeat: intents are idempotent on the key and
the worker, receipts on (key, system, external_id), failures on the state they reach.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from tallybook.errors import ServerUnavailable

# Errors of a keep-alive connection the server closed while it sat idle in the pool.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
MAX_IDLE = 8


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a request is repeated."""

    retries: int = 5
    backoff: float = 0.25  # seconds before the first retry; doubles each time
    max_backoff: float = 30.0  # cap of one wait, Retry-After included

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Equal jitter: half the exponential step fixed, half random; at least Retry-After."""
        step = min(self.max_backoff, self.backoff * 2.0**retry)
        wait = step / 2 + random.uniform(0, step / 2)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.max_backoff)


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class Channel(Protocol):
    """What the client needs of a server: a Transport, or `tallybook.testing`'s fake."""

    url: str
    timeout: float
    retry: Retry

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: Retry | None = None,
        budget: float | None = None,
    ) -> Response: ...

    def close(self) -> None: ...


class Transport:
    """Thread-safe JSON client of one Tallybook server."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float,
        retry: Retry,
        user_agent: str,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Tallybook URL must be http(s)://host[:port][/path], not {url!r}")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self.timeout = timeout
        self.retry = retry
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._pid = os.getpid()
        self._sleep, self._clock = sleep, clock

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: Retry | None = None,
        budget: float | None = None,
    ) -> Response:
        """Send one request, retrying what is worth retrying; 4xx answers are returned.

        `budget` caps the seconds of all tries together, waits and pauses included.
        """
        retry = retry or self.retry
        payload = None if body is None else json.dumps(body).encode()
        deadline = None if budget is None else self._clock() + budget
        attempt = 0
        while True:
            wait: float | None = None
            try:
                status, headers, data = self._exchange(method, path, payload, self._left(deadline))
            except (OSError, http.client.HTTPException) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status != 429 and status < 500:
                    return Response(status, _decode(data))
                problem = f"HTTP {status}"
                wait = retry_after(headers.get("Retry-After"))
            pause = retry.delay(attempt, wait)
            if attempt >= retry.retries or self._left(deadline) <= pause:
                raise ServerUnavailable(
                    f"{method} {self.url}{path} failed after {attempt + 1} tries: {problem}"
                )
            self._sleep(pause)
            attempt += 1

    def _left(self, deadline: float | None) -> float:
        """The timeout of the next try: the configured one, or what is left of the budget."""
        if deadline is None:
            return self.timeout
        return max(0.001, min(self.timeout, deadline - self._clock()))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _exchange(
        self, method: str, path: str, payload: bytes | None, timeout: float
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn, reused = self._acquire(timeout)
        try:
            try:
                return self._roundtrip(conn, method, path, payload)
            except STALE:
                if not reused:
                    raise
                # The server dropped an idle keep-alive connection: one fresh try, not a retry.
                conn.close()
                conn = self._connect(timeout)
                return self._roundtrip(conn, method, path, payload)
        except BaseException:
            conn.close()
            raise

    def _roundtrip(
        self, conn: http.client.HTTPConnection, method: str, path: str, payload: bytes | None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn.request(method, self._base + path, body=payload, headers=self._headers)
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            conn.close()
        else:
            self._release(conn)
        return response.status, response.headers, data

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _acquire(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._pid != os.getpid():
                # A forked child must not share its parent's sockets.
                self._idle, self._pid = [], os.getpid()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self._connect(timeout), False
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE and self._pid == os.getpid():
                self._idle.append(conn)
                return
        conn.close()


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        # Not the API talking (a proxy's error page, a wrong URL): say what came back.
        return {"error": f"a non-JSON answer: {data[:200]!r}"}
