"""A fake provider for the demo: refunds (a payment API), deploys and chat messages.

It behaves like the real thing where Tallybook cares: refunds honour an
`Idempotency-Key` and can be looked up by it (the HTTP reconciler asks
`GET /refunds?idempotency_key=…`), deploys likewise (`GET /deploys?key=…`), chat messages
are never deduplicated. The demo agents steer it with `X-Demo-*` headers to make it
misbehave the way real providers do: answer slowly, decline, or refund another amount.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024


@dataclass
class Record:
    """A refund, a deploy or a message, as the provider keeps it."""

    id: str
    key: str
    status: str
    created: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ledger:
    """What the provider has done, by kind; shared by the handler threads."""

    records: dict[str, list[Record]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, kind: str, key: str) -> list[Record]:
        with self.lock:
            return [r for r in self.records.get(kind, []) if r.key == key]

    def add(self, kind: str, prefix: str, key: str, status: str, **details: Any) -> Record:
        record = Record(f"{prefix}_{secrets.token_hex(6)}", key, status, time.time(), details)
        with self.lock:
            self.records.setdefault(kind, []).append(record)
        return record

    def count(self, kind: str) -> int:
        with self.lock:
            return len(self.records.get(kind, []))


# POST path -> (kind, id prefix, final status, whether the Idempotency-Key deduplicates)
CREATES = {
    "/refunds": ("refunds", "re", "succeeded", True),
    "/deploys": ("deploys", "dep", "live", True),
    "/messages": ("messages", "msg", "delivered", False),
}
# GET path -> (kind, query parameter naming the key)
LOOKUPS = {"/refunds": ("refunds", "idempotency_key"), "/deploys": ("deploys", "key")}


class Handler(BaseHTTPRequestHandler):
    server: ProviderServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("provider: " + format, *args)

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path not in LOOKUPS:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "no such endpoint"})
            return
        kind, param = LOOKUPS[url.path]
        key = parse_qs(url.query).get(param, [""])[0]
        found = self.server.ledger.find(kind, key) if key else []
        self._reply(HTTPStatus.OK, {"data": [_public(r) for r in found]})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        if path not in CREATES or length > MAX_BODY:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "no such endpoint"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": "body is not JSON"})
            return
        kind, prefix, status, dedupes = CREATES[path]
        key = self.headers.get("Idempotency-Key", "")
        if dedupes and key and (done := self.server.ledger.find(kind, key)):
            self._reply(HTTPStatus.OK, _public(done[0]))
            return
        if declined := self.headers.get("X-Demo-Decline"):
            self._reply(HTTPStatus.PAYMENT_REQUIRED, {"error": {"code": declined}})
            return
        # A slow provider still does the work: it is only recorded once the delay is over,
        # so a reconciler asking in the meantime finds nothing yet.
        time.sleep(float(self.headers.get("X-Demo-Delay") or 0))
        details = dict(body)
        if amount := self.headers.get("X-Demo-Amount"):
            details["amount"] = amount  # a provider bug: it moved another amount
        record = self.server.ledger.add(kind, prefix, key, status, **details)
        try:
            self._reply(HTTPStatus.CREATED, _public(record))
        except OSError:
            log.info("provider: the client left before %s was answered", record.id)


def _public(record: Record) -> dict[str, Any]:
    data = asdict(record)
    data.update(data.pop("details"))
    data["created"] = int(record.created)
    return data


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int) -> None:
        self.ledger = Ledger()
        super().__init__(("127.0.0.1", port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def dashboard_refund(self, tallybook: str, api_key: str, n: int) -> Record:
        """A person refunds an order by hand in the provider's dashboard, and the provider's
        integration reports it to Tallybook: a receipt whose key no agent ever used."""
        record = self.ledger.add(
            "refunds", "re", f"refund:manual-{n}", "succeeded", source="dashboard"
        )
        body = {
            "key": record.key,
            "system": "payments",
            "external_id": record.id,
            "observed_at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "data": {"source": "dashboard"},
        }
        request = urllib.request.Request(
            f"{tallybook}/api/v1/receipts",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except (urllib.error.URLError, OSError) as exc:
            log.warning("provider: could not report %s to Tallybook: %s", record.id, exc)
        return record

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="demo-provider", daemon=True)
        thread.start()
        return thread
