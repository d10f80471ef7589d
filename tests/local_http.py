"""A real HTTP server on 127.0.0.1 in a thread, answering what a test tells it to."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # Set by the test when the server may answer: until then it holds the request open.
    hold: threading.Event | None = None


class LocalHttp:
    """Replies are queued per path; the last one for a path repeats. Requests are kept."""

    def __init__(self) -> None:
        self.replies: dict[str, deque[Reply]] = {}
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._answer(self)

            def do_POST(self) -> None:
                server._answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> LocalHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reply(self, path: str, *replies: Reply) -> None:
        self.replies[path] = deque(replies)

    def requests_to(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        self.seen.append(Seen(handler.command, handler.path, dict(handler.headers), body))
        queue = self.replies.get(handler.path)
        if not queue:
            reply = Reply(404, {"error": "no such thing"})
        else:
            reply = queue.popleft() if len(queue) > 1 else queue[0]
        if reply.hold is not None:
            reply.hold.wait(timeout=120)
        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)
