"""The API keeps the contract its OpenAPI document states, as Schemathesis checks it: every
check, positive and negative data, the document's links followed statefully, against the
app served over HTTP, with a fixed (derandomized) generation so a run can be repeated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durability.models import ApiKey, Project
from tests.ledger import support as ledger

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "api" / "schemathesis.toml"
# Examples per operation and phase: ~1,200 requests over the ledger's and events' operations
# (20 s against gunicorn here; about a minute against the test's live server on a busy machine).
EXAMPLES = 15


def _schemathesis(base_url: str, key: str, *selection: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{base_url}/api/v1/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        "all",
        "--mode",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",
        "--request-timeout",
        "60",
        *selection,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.fixture
def contract_key(live_server: Any, transactional_db: None) -> str:
    """A project with a grant (so the grant pages have one to follow) and its key."""
    project = Project.objects.create(name="contract")
    ledger.everything(project)
    _, raw = ApiKey.issue(project)
    return raw


def _failures(run: subprocess.CompletedProcess[str]) -> str:
    return f"schemathesis exited {run.returncode}:\n{run.stdout[-20000:]}\n{run.stderr[-5000:]}"


@pytest.mark.timeout(300)
def test_the_api_keeps_its_documented_contract(live_server, contract_key):
    run = _schemathesis(live_server.url, contract_key, "--exclude-path", "/v1/traces")
    assert run.returncode == 0, _failures(run)
    assert "passed" in run.stdout and "Stateful" in run.stdout, run.stdout[-3000:]


# lead: remove at merge, fixed by otlp (`{"resourceSpans": {}}` answers 200; an attribute
# whose value is null is refused although the document allows it).
@pytest.mark.xfail(strict=True, reason="fixed on the otlp branch")
@pytest.mark.timeout(300)
def test_otlp_traces_keep_their_documented_contract(live_server, contract_key):
    # No links lead to or from it: the stateful phase has nothing to run.
    run = _schemathesis(
        live_server.url,
        contract_key,
        "--include-path",
        "/v1/traces",
        "--phases",
        "examples,coverage,fuzzing",
    )
    assert run.returncode == 0, _failures(run)
