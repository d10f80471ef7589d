"""A real MCP server for the proxy's tests: a payment provider's tools, over stdio or
streamable HTTP, whose ledger file (one line per refund) is the ground truth.

    python -m tests.sdk.mcp_support --ledger PATH [--http] [--hold PATH]

`--http` serves streamable HTTP on a loopback port it binds itself and prints. With `--hold`,
a refund waits after it is done, before it answers, until that file is removed: the test
kills the proxy in between. Each ledger line is JSON: the order and the process that asked
(the proxy, for a stdio server it started).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from mcp.server import MCPServer


def app(ledger: Path, hold: Path | None) -> MCPServer:
    server = MCPServer("fakepay")

    @server.tool()
    def refund(order: int) -> dict[str, Any]:
        """Refund an order in full."""
        number = len(ledger.read_text().splitlines()) + 1
        with ledger.open("a") as f:
            f.write(json.dumps({"order": order, "proxy": os.getppid(), "me": os.getpid()}) + "\n")
        deadline = time.monotonic() + 60
        while hold is not None and hold.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"id": f"re_{order}_{number}", "status": "succeeded"}

    @server.resource("fakepay://balance")
    def balance() -> str:
        """The account's balance."""
        return "1200.00 EUR"

    @server.prompt()
    def dispute(order: int) -> str:
        """Answer a dispute."""
        return f"Answer the dispute on order {order}."

    @server.tool()
    def lookup(order: int) -> str:
        """Look an order up."""
        return f"order {order}: 12.50 EUR, paid"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--hold", type=Path)
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    args.ledger.touch()
    server = app(args.ledger, args.hold)
    if args.http:
        import anyio
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        anyio.run(uvicorn.Server(config).serve, [sock])
    else:
        server.run("stdio")
    # The proxy waits for its stdio server to exit once it hangs up, within the two seconds
    # its own agent gives it (and a test for its HTTP server once stopped): ended at once, as
    # a server with nothing left to do may be, rather than after tearing down the mcp
    # package's modules (a second on a loaded machine). Its ledger is written and closed with
    # each refund.
    os._exit(0)


if __name__ == "__main__":
    main()
