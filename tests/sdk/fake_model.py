"""An OpenAI-compatible model on 127.0.0.1 that answers with scripted turns: a tool call, or
text. Every request it gets is kept, so a test reads what the agent told the model (a tool's
result, a hook's reason for blocking it).

    with FakeModel([call("Bash", {"command": "git push origin main"}), say("Done.")]) as model:
        ...  # an agent configured with model.url ("http://127.0.0.1:PORT/v1")

A turn is taken when the request's last message is the user's or a tool's; any other request
(a title, a summary) is answered with text and takes no turn. Past the script, "Done.".
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MODEL = "fake-model"


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool": name, "arguments": arguments}


def say(text: str) -> dict[str, Any]:
    return {"text": text}


class FakeModel:
    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeModel:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def tool_results(self) -> list[str]:
        """What the agent sent back as tool results, in order."""
        seen: list[str] = []
        for request in self.requests:
            for message in request.get("messages", []):
                if message.get("role") == "tool":
                    content = message.get("content")
                    text = content if isinstance(content, str) else json.dumps(content)
                    if text not in seen:
                        seen.append(text)
        return seen

    def _turn(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        last = messages[-1].get("role") if messages else "user"
        tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        with self._lock:
            self.requests.append(body)
            if last in ("user", "tool") and self.script:
                turn = self.script[0]
                if "tool" not in turn or turn["tool"] in tools:
                    return self.script.pop(0)
        return say("Done.")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                self._json(200, body)

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no {self.path} here"}})
                    return
                turn = model._turn(body)
                message: dict[str, Any] = {"role": "assistant", "content": turn.get("text")}
                if "tool" in turn:
                    message["tool_calls"] = [
                        {
                            "id": f"call_{next(model._ids)}",
                            "type": "function",
                            "function": {
                                "name": turn["tool"],
                                "arguments": json.dumps(turn["arguments"]),
                            },
                        }
                    ]
                finish = "tool_calls" if "tool" in turn else "stop"
                if body.get("stream"):
                    self._stream(message, finish)
                else:
                    self._json(200, _completion(message, finish))

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, message: dict[str, Any], finish: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                delta: dict[str, Any] = {"role": "assistant"}
                if message.get("content"):
                    delta["content"] = message["content"]
                if message.get("tool_calls"):
                    delta["tool_calls"] = [
                        {"index": i, **c} for i, c in enumerate(message["tool_calls"])
                    ]
                for chunk in (
                    _chunk(delta, None),
                    _chunk({}, finish),
                ):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if finish
        else None,
    }
