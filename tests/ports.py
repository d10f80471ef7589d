"""Loopback TCP ports, for the tests that need one: a server that can only be told a port
number (the demo's provider, `runserver`), or a URL of an HTTP server that is away.

Redis and PostgreSQL need none: a private Redis listens on a Unix socket in the test's
tmp_path, and one "away" is a socket path that does not exist, which nobody can take.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port() -> int:
    """A port free now, for a server that binds it by number. Another process may take it
    before that server does: hold the port until the server starts and start again on
    another should the server find it taken (tests/sdk/support.py ServerProcess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port where connections are refused, as by a server that is away: bound and not
    listening, so that nobody else is given it while the block runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])
