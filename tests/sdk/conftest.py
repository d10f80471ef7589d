"""Fixtures of the SDK tests: clients of the live server, and a server process to stop."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from django.core.signals import request_started
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
def status_polls(live_server: Any) -> Iterator[Counter[str]]:
    """How many status requests (`GET /api/v1/effects?key=...`) the live server has begun, by
    effect key: what a client waiting for a person asks."""
    polls: Counter[str] = Counter()

    def count(sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        if (environ["REQUEST_METHOD"], environ["PATH_INFO"]) == ("GET", "/api/v1/effects"):
            for key in parse_qs(environ.get("QUERY_STRING", "")).get("key", []):
                polls[key] += 1

    request_started.connect(count)
    yield polls
    request_started.disconnect(count)


@pytest.fixture
def intents_posted(live_server: Any) -> Iterator[Counter[str]]:
    """How many intents (`POST /api/v1/intents`) the live server has begun, as "intents"."""
    posted: Counter[str] = Counter()

    def count(sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        if (environ["REQUEST_METHOD"], environ["PATH_INFO"]) == ("POST", "/api/v1/intents"):
            posted["intents"] += 1

    request_started.connect(count)
    yield posted
    request_started.disconnect(count)


@pytest.fixture
def server(transactional_db: None) -> Iterator[ServerProcess]:
    """A real server process (not started yet) on the test database."""
    process = ServerProcess(database_url_of_tests())
    yield process
    process.close()
