"""The API keeps the contract its OpenAPI document states, as Schemathesis checks it: every
check, positive and negative data, the document's links followed statefully, against the
app served as in production (gunicorn, on the test database), with a fixed (derandomized)
generation so a run can be repeated."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durability.models import ApiKey, Project
from tests.ledger import support as ledger
from tests.sdk.support import ServerProcess, database_url_of_tests

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "api" / "schemathesis.toml"
# Examples per operation and phase: ~1,400 requests over the ledger's and events' operations
# (about 30 s here).
EXAMPLES = 25


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
def served(transactional_db: None) -> Iterator[str]:
    """The app's URL, served by gunicorn on the test database."""
    server = ServerProcess(database_url_of_tests())
    server.start()
    yield server.url
    server.close()


@pytest.fixture
def contract_key(transactional_db: None) -> str:
    """A project with a grant (so the grant pages have one to follow) and its key."""
    project = Project.objects.create(name="contract")
    ledger.everything(project)
    _, raw = ApiKey.issue(project)
    return raw


def _failures(run: subprocess.CompletedProcess[str]) -> str:
    return f"schemathesis exited {run.returncode}:\n{run.stdout[-20000:]}\n{run.stderr[-5000:]}"


@pytest.mark.timeout(300)
def test_the_api_keeps_its_documented_contract(served, contract_key):
    # The webhook intake answers only what is signed with a source's secret, which
    # Schemathesis cannot make: tests/api/test_webhooks_fuzz.py fuzzes it signed.
    run = _schemathesis(
        served,
        contract_key,
        "--exclude-path",
        "/v1/traces",
        "--exclude-path",
        "/hooks/{name}/",
    )
    assert run.returncode == 0, _failures(run)
    generated = re.search(r"(\d+) generated, \1 passed", run.stdout)
    assert generated and int(generated[1]) > 1000, run.stdout[-3000:]
    scenarios = re.search(r"Scenarios: +(\d+)", run.stdout)
    assert scenarios and int(scenarios[1]) > 0, run.stdout[-3000:]


@pytest.mark.timeout(300)
def test_otlp_traces_keep_their_documented_contract(served, contract_key):
    # No links lead to or from it: the stateful phase has nothing to run.
    run = _schemathesis(
        served,
        contract_key,
        "--include-path",
        "/v1/traces",
        "--phases",
        "examples,coverage,fuzzing",
    )
    assert run.returncode == 0, _failures(run)
