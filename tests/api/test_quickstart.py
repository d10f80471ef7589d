"""The quick start on a bare machine: SQLite, no Redis, migrate, demo, a server, the API."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _call(url: str, key: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.load(response)


def _wait_for(port: int, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[1]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail("the server did not start within a minute")


def test_the_quick_start_works_on_sqlite_without_redis(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env |= {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SITE_URL": f"http://127.0.0.1:{port}",
    }
    _manage(env, "migrate", "--verbosity", "0")
    printed = _manage(env, "demo", "--dir", str(tmp_path / "demo"))
    found = re.search(r"^API key: (tb_\S+)$", printed, re.M)
    assert found, printed
    key = found[1]
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(port, server)
        api = f"http://127.0.0.1:{port}/api/v1"
        status, intent = _call(
            f"{api}/intents",
            key,
            {"key": "quickstart:1", "kind": "email", "target": "smtp", "request": {"to": "a@b"}},
        )
        assert (status, intent["decision"]) == (201, "proceed")
        assert intent["effect"]["url"].startswith(f"http://127.0.0.1:{port}/effects/")
        status, receipt = _call(
            f"{api}/receipts",
            key,
            {"key": "quickstart:1", "system": "smtp", "external_id": "<msg-1@b>"},
        )
        assert (status, receipt["effect"]["state"]) == (201, "succeeded")
        status, effect = _call(f"{api}/effects/{intent['effect']['id']}", key)
        assert status == 200
        assert effect["decision"] == "completed"
        assert [r["external_id"] for r in effect["receipts"]] == ["<msg-1@b>"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    # SQLite's span tables are plain: the scheduler's upkeep has no partition to make or drop.
    upkeep = _manage(env, "partitions")
    assert "created 0 partitions" in upkeep and "dropped 0 partitions" in upkeep
