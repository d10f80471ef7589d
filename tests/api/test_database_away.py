"""PostgreSQL away: the API answers 503 with Retry-After, in JSON, never a 500."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from google.rpc import code_pb2, status_pb2

ROOT = Path(__file__).resolve().parents[2]

# Runs in a process of its own whose DATABASE_URL names a Unix socket directory that does not
# exist (nobody can start a server there): every connection attempt fails as it does while
# PostgreSQL restarts.
PROBE = """
import json, django
django.setup()
from django.test import Client
client = Client(raise_request_exception=False)
answers = {}
for method, path, body in [
    ("post", "/api/v1/intents", {"key": "refund:1", "kind": "refund", "target": "stripe"}),
    ("post", "/api/v1/receipts", {"key": "refund:1", "system": "stripe", "external_id": "re_1"}),
    ("get", "/api/v1/effects?key=refund:1", None),
    ("post", "/hooks/alpha-stripe/", {"id": "evt_1"}),
]:
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body else {}
    response = getattr(client, method)(path, HTTP_AUTHORIZATION="Bearer tb_" + "x" * 40, **kwargs)
    answers[path] = {
        "status": response.status_code,
        "type": response["Content-Type"],
        "retry_after": response.get("Retry-After"),
        "body": response.content.decode(),
    }
exported = client.post(
    # One empty resourceSpans entry: the test client sends no Content-Type with no body.
    "/v1/traces", data=b"\\x0a\\x00", content_type="application/x-protobuf",
    HTTP_AUTHORIZATION="Bearer tb_" + "x" * 40,
)
otlp = {
    "status": exported.status_code,
    "type": exported["Content-Type"],
    "retry_after": exported.get("Retry-After"),
    "body": exported.content.hex(),
}
print(json.dumps({"json": answers, "otlp": otlp}))
"""


def test_the_api_answers_503_with_retry_after_while_postgresql_is_away_otlp_in_its_encoding():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "durability.settings",
        "DATABASE_URL": "postgres://root@%2Fnonexistent%2Fdir/tallybook",
        "DB_CONN_MAX_AGE": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answers = json.loads(done.stdout.strip().splitlines()[-1])

    for path, answer in answers["json"].items():
        assert answer["status"] == 503, (path, answer)
        assert answer["type"] == "application/json", path
        assert answer["retry_after"] == "2", path
        assert json.loads(answer["body"])["error"] == "The database is unavailable; retry shortly"

    # An OTLP exporter reads a google.rpc.Status in its request's encoding, and retries.
    otlp = answers["otlp"]
    assert (otlp["status"], otlp["type"], otlp["retry_after"]) == (
        503,
        "application/x-protobuf",
        "2",
    )
    status = status_pb2.Status.FromString(bytes.fromhex(otlp["body"]))
    assert status.code == code_pb2.UNAVAILABLE
    assert status.message == "The database is unavailable; retry shortly"
