from __future__ import annotations

import socket
import threading

import pytest


@pytest.fixture
def silent_git_server():
    """A TCP server that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        try:
            while True:
                accepted.append(listener.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    yield f"git://127.0.0.1:{listener.getsockname()[1]}/repo.git"
    listener.close()
    for conn in accepted:
        conn.close()
