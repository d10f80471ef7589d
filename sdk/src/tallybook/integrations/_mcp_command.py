"""`tallybook-mcp`'s entry point: the proxy needs the `mcp` extra, and says so when it is
not installed instead of dying on an ImportError."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

EXTRA = "pip install 'tallybook-sdk[mcp]'"


def main(argv: list[str] | None = None) -> int:
    try:
        from tallybook.integrations import mcp
    except ImportError as exc:
        print(
            f"tallybook-mcp needs the MCP extra ({exc.name or exc}): {EXTRA}",
            file=sys.stderr,
        )
        return 1
    return mcp.main(argv)


def command() -> NoReturn:
    """The console script: main(), then the process ends at once (exit_served)."""
    exit_served(main())


def exit_served(code: int) -> NoReturn:
    """End the proxy's process once it has served, without tearing the interpreter down.

    The agent that started the proxy gives it two seconds after it hangs up (the mcp
    package's grace period) and then kills it; freeing the objects of the mcp package's many
    modules and models takes a good part of that on a loaded machine, after everything was
    delivered or spooled. What an exit does that matters is done first: the exit functions
    (a tracer's last export, the log handlers) and the standard streams' buffers. With a
    thread of someone else's still running, the exit is the ordinary one, which waits for it.
    """
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the agent closed its end
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    command()
