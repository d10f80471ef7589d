"""The API keeps the contract its OpenAPI document states, as Schemathesis checks it: every
check, positive and negative data, the document's links followed statefully, against the
app served as in production (granian, on the test database), with a fixed (derandomized)
generation so a run can be repeated."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durability.models import ApiKey, Project
from tests.ledger import support as ledger
from tests.sdk.support import ServerProcess, database_url_of_tests

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "api" / "schemathesis.toml"
# Examples per operation and phase: ~1,400 requests over the ledger's and events' operations
# (80 s measured on a shared 2-core machine running other tests).
EXAMPLES = 25
# Bounds for a loaded 2-core CI machine, over ten times that: the run's own, then the test's
# (above the suite's default of 300 s), with room for the server's start and stop.
RUN_TIMEOUT_S = 900
TEST_TIMEOUT_S = 1200


class Run:
    """A finished Schemathesis run: its exit code, its output, and its JSON run report."""

    def __init__(self, done: subprocess.CompletedProcess[str], report: Path) -> None:
        self.returncode = done.returncode
        self.output = f"{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
        self.report: dict[str, Any] = json.loads(report.read_text()) if report.exists() else {}

    def failures(self) -> str:
        return f"schemathesis exited {self.returncode}:\n{self.output}"


def _schemathesis(base_url: str, key: str, folder: Path, *selection: str) -> Run:
    report = folder / "schemathesis.json"
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
        "--report",
        "json",
        "--report-json-path",
        str(report),
        *selection,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    return Run(done, report)


@pytest.fixture
def served(transactional_db: None) -> Iterator[str]:
    """The app's URL, served by granian on the test database, its connections kept between
    requests as in production. One worker: Schemathesis sends one request at a time."""
    server = ServerProcess(database_url_of_tests(), workers=1, keep_connections=True)
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


def _kept(run: Run) -> dict[str, Any]:
    """The report's test cases, once it says the run completed without a failure or error."""
    assert run.returncode == 0, run.failures()
    assert run.report["complete"] and run.report["exit_code"] == 0, run.failures()
    cases: dict[str, Any] = run.report["test_cases"]
    assert cases["with_failures"] == 0 and cases["errored"] == 0, run.report
    assert not run.report["failures"] and not run.report["errors"], run.report
    return cases


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_api_keeps_its_documented_contract(served, contract_key, tmp_path):
    # The webhook intake answers only what is signed with a source's secret, which
    # Schemathesis cannot make: tests/api/test_webhooks_fuzz.py fuzzes it signed.
    run = _schemathesis(
        served,
        contract_key,
        tmp_path,
        "--exclude-path",
        "/v1/traces",
        "--exclude-path",
        "/hooks/{name}/",
    )
    cases = _kept(run)
    assert cases["generated"] > 1000, run.report
    # The document's links were followed: the stateful phase ran, and passed.
    assert run.report["phases"]["stateful"]["status"] == "success", run.report


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_otlp_traces_keep_their_documented_contract(served, contract_key, tmp_path):
    # No links lead to or from it: the stateful phase has nothing to run.
    run = _schemathesis(
        served,
        contract_key,
        tmp_path,
        "--include-path",
        "/v1/traces",
        "--phases",
        "examples,coverage,fuzzing",
    )
    cases = _kept(run)
    assert cases["generated"] > 0, run.report
