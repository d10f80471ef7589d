"""Fixtures of the SDK tests: clients of the live server, and a server process to stop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tallybook import AsyncTallybook, Tallybook

from tests.sdk.support import FAST, ServerProcess, database_url_of_tests


@pytest.fixture
def spool_root(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def tb(live_server: Any, api_key: str, spool_root: Path) -> Iterator[Tallybook]:
    client = Tallybook(live_server.url, api_key, spool=spool_root, **FAST)
    yield client
    client.close()


@pytest.fixture
def atb(live_server: Any, api_key: str, spool_root: Path) -> Iterator[AsyncTallybook]:
    client = AsyncTallybook(live_server.url, api_key, spool=spool_root, **FAST)
    yield client
    client._close(5.0)


@pytest.fixture
def server(transactional_db: None) -> Iterator[ServerProcess]:
    """A real server process (not started yet) on the test database."""
    process = ServerProcess(database_url_of_tests())
    yield process
    process.close()
