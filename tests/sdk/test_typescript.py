"""The TypeScript packages' suites (sdk-ts/), run by node against a live server started here,
so they count in this run: the shared decision table (tests/sdk/decisions.json), the AI SDK
wrapper and the Pi extension, each `node --test` file one test. bin/test installs them
(`npm ci` from the committed lockfile) and builds them (`tsc`) before pytest runs; in a
worktree, `(cd sdk-ts && npm ci && npm run build)` once."""

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
from tallybook.spool import Spool, spool_dir
from tallybook.transport import Retry, Transport

from durability.ledger import settling
from durability.ledger.commands import ReceiptEvidence
from durability.ledger.machine import Event
from durability.models import Effect
from tests.authority.support import grant
from tests.sdk.support import ROOT
from trajectories.models import Run

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
    evidence = ReceiptEvidence(key=key, system="fakepay", external_id="seen-by-alice")
    settling.effect_settle(
        project=effect.project,
        effect_id=effect.pk,
        actor="user:alice",
        event=VERDICTS[what],
        note="checked with fakepay",
        evidence=evidence if what == "happened" else None,
    )


class Operator(BaseHTTPRequestHandler):
    """`POST {"key": …, "what": …}`: the suites' hands at the desk; `{"run": …}`: the run's
    status, as the desk shows it."""

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            if "run" in asked:
                run = Run.objects.get(run_id=asked["run"])
                status, answer = 200, json.dumps({"status": run.status}).encode()
            else:
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
    built = "bin/test installs and builds sdk-ts/ (npm ci && npm run build)"
    assert NODE.exists() and compiled(suite).exists(), built
    grants = [grant(project, name="payments").pk, grant(project, name="others").pk]
    # The suite runs in this Node process (isolation "none"), not in a child that
    # `node --test` would start for its one file: a second Node start-up proves nothing.
    isolation = "--experimental-test-isolation=none"  # `--test-isolation` from Node 23
    done = subprocess.run(
        [str(NODE), "--test", isolation, "--test-reporter=dot", str(compiled(suite))],
        cwd=TS,
        env={
            **os.environ,
            "TALLYBOOK_URL": live_server.url,
            "TALLYBOOK_API_KEY": api_key,
            "TALLYBOOK_SPOOL_DIR": str(tmp_path / "spool"),
            "TALLYBOOK_INTENT_BUDGET": "30",  # a loaded machine's slow answer is no failure
            "TALLYBOOK_TEST_LIVE": "1",
            "TALLYBOOK_TEST_OPERATOR": operator,
            "TALLYBOOK_TEST_GRANTS": ",".join(map(str, grants)),
            "TMPDIR": str(tmp_path),  # the suites' spools and Pi's projects
        },
        capture_output=True,
        text=True,
        timeout=240,  # within pytest's 300 s, with the server's start
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


AGENT = """
import { Tallybook } from "@tallybook/sdk";
const [url, apiKey, spool] = process.argv.slice(2);
const tb = new Tallybook({ url, apiKey, spool });
const sent = [];
const sendEmail = tb.tool("email:{runId}:{to}", { kind: "email", target: "smtp", receipt: "id" },
  async ({ to }) => { sent.push(to); return { id: `msg-for-${to}` }; });
const results = await tb.run({ workflow: "mailer", runId: "npm-1" }, async () =>
  [await sendEmail({ to: "ann@example.com" }), await sendEmail({ to: "ann@example.com" })]);
const delivered = await tb.flush();
console.log(JSON.stringify({ results, sent, delivered, node: process.versions.node,
  file: import.meta.resolve("@tallybook/sdk") }));
"""


def test_the_npm_package_installs_alone_and_records_an_effect_on_the_machines_node(
    live_server, api_key, tmp_path
):
    """`npm pack`'s tarball, installed alone into an empty folder from the file (no registry),
    brings nothing else, and on the machine's Node (20 here: the oldest the package supports)
    records an effect that is not repeated."""
    packed = subprocess.run(
        ["npm", "pack", "--json", "--pack-destination", str(tmp_path)],
        cwd=TS / "packages" / "sdk",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert packed.returncode == 0, packed.stderr
    (info,) = json.loads(packed.stdout[packed.stdout.index("[") :])
    files = {f["path"] for f in info["files"]}
    assert {"package.json", "README.md", "dist/src/index.js", "dist/src/index.d.ts"} <= files
    assert {"dist/src/testing.js", "dist/src/ai.js"} <= files
    assert not {f for f in files if not (f.startswith("dist/src/") or "/" not in f)}, files

    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    install = [
        "npm",
        "install",
        "--offline",
        "--no-audit",
        "--no-fund",
        str(tmp_path / info["filename"]),
    ]
    done = subprocess.run(install, cwd=app, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    installed = sorted(
        p.name for p in (app / "node_modules").iterdir() if not p.name.startswith(".")
    )
    assert installed == ["@tallybook"]
    assert [p.name for p in (app / "node_modules" / "@tallybook").iterdir()] == ["sdk"]

    (app / "agent.mjs").write_text(AGENT)
    run = subprocess.run(
        ["node", "agent.mjs", live_server.url, api_key, str(tmp_path / "spool")],
        cwd=app,
        env={**os.environ, "TALLYBOOK_INTENT_BUDGET": "30"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert int(out["node"].split(".")[0]) >= 20 and out["delivered"]
    assert out["file"].startswith(f"file://{app}/node_modules/@tallybook/sdk/")
    assert out["results"] == [{"id": "msg-for-ann@example.com"}] * 2
    assert out["sent"] == ["ann@example.com"]
    effect = Effect.objects.get()
    assert (effect.key, effect.state) == ("email:npm-1:ann@example.com", "succeeded")
    assert effect.receipts.get().data == {"result": {"id": "msg-for-ann@example.com"}}


def test_a_receipt_the_python_sdk_spooled_is_sent_by_the_typescript_client(
    live_server, api_key, tmp_path
):
    """The two SDKs' spools are one layout: what a Python agent left (its process died before
    the receipt was sent) the next TypeScript client on the same spool delivers."""
    api = Transport(
        live_server.url, api_key, timeout=5.0, retry=Retry(retries=0), user_agent="tests"
    )
    intent = {"key": "refund:py-1", "kind": "payment", "target": "fakepay", "worker": "py"}
    assert api.request("POST", "/api/v1/intents", intent).status == 201
    api.close()
    root = tmp_path / "spool"
    spool = Spool(spool_dir(root, live_server.url, api_key))
    body = {"key": "refund:py-1", "system": "fakepay", "external_id": "re_py", "attempt": 1}
    spool.release(spool.put("receipts", body))

    script = (
        f"import {{ Tallybook }} from {json.dumps(str(TS / 'packages/sdk/dist/src/index.js'))};\n"
        "const [url, apiKey, spool] = process.argv.slice(2);\n"
        "const tb = new Tallybook({ url, apiKey, spool });\n"
        "console.log(JSON.stringify(await tb.flush()));\n"
    )
    (tmp_path / "next.mjs").write_text(script)
    done = subprocess.run(
        [str(NODE), str(tmp_path / "next.mjs"), live_server.url, api_key, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "true"), done.stderr
    assert not list(spool.directory.glob("*.json"))  # delivered, so deleted
    effect = Effect.objects.get(key="refund:py-1")
    assert effect.state == "succeeded"
    assert effect.receipts.get().external_id == "re_py"
