"""The TypeScript packages' suites (sdk-ts/), run by node against a live server started here,
so they count in this run: the shared decision table (tests/sdk/decisions.json), the AI SDK
wrapper and the Pi extension, each `node --test` file one test. bin/setup installs them
(`npm ci` from the committed lockfile) and builds them (`tsc`)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from durability.api.schemas import ReceiptIn
from durability.ledger import settling
from durability.ledger.machine import Event
from durability.models import Effect
from tests.authority.support import grant
from tests.sdk.support import ROOT

TS = ROOT / "sdk-ts"
NODE = TS / "node_modules" / ".bin" / "node"  # Node 22, the registry's `node` package
SUITES = sorted(p.name for p in (TS / "packages").glob("*/test/*.test.ts"))
VERDICTS = {
    "not_happened": Event.ATTEST_NOT_HAPPENED,
    "happened": Event.ATTEST_HAPPENED,
    "abandon": Event.ABANDON,
}


def settle(key: str, what: str) -> None:
    """What a person at the desk does to an effect in doubt."""
    effect = Effect.objects.get(key=key)
    evidence = ReceiptIn(key=key, system="fakepay", external_id="seen-by-alice")
    settling.effect_settle(
        project=effect.project,
        effect_id=effect.pk,
        actor="user:alice",
        event=VERDICTS[what],
        note="checked with fakepay",
        evidence=evidence if what == "happened" else None,
    )


class Operator(BaseHTTPRequestHandler):
    """`POST {"key": …, "what": …}`: the suites' hands at the desk."""

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            settle(asked["key"], asked["what"])
            status, answer = 200, b"{}"
        except Exception as exc:  # said to the suite, which fails with it
            status, answer = 500, repr(exc).encode()
        finally:
            connection.close()
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def operator(transactional_db: None) -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Operator)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/settle"
    server.shutdown()
    server.server_close()
    thread.join(5)


def compiled(suite: str) -> Path:
    (source,) = (TS / "packages").glob(f"*/test/{suite}")
    return source.parent.parent / "dist" / "test" / suite.replace(".ts", ".js")


@pytest.mark.parametrize("suite", SUITES)
def test_the_typescript_suite_passes_against_the_live_server(
    suite, live_server, project, api_key, operator, tmp_path
):
    assert NODE.exists() and compiled(suite).exists(), "bin/setup installs and builds sdk-ts/"
    grants = [grant(project, name="payments").pk, grant(project, name="others").pk]
    done = subprocess.run(
        [str(NODE), "--test", "--test-reporter=dot", str(compiled(suite))],
        cwd=TS,
        env={
            **os.environ,
            "TALLYBOOK_URL": live_server.url,
            "TALLYBOOK_API_KEY": api_key,
            "TALLYBOOK_SPOOL_DIR": str(tmp_path / "spool"),
            "TALLYBOOK_TEST_LIVE": "1",
            "TALLYBOOK_TEST_OPERATOR": operator,
            "TALLYBOOK_TEST_GRANTS": ",".join(map(str, grants)),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
