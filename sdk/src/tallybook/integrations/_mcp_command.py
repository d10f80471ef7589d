"""`tallybook-mcp`'s entry point: the proxy needs the `mcp` extra, and says so when it is
not installed instead of dying on an ImportError."""

from __future__ import annotations

import sys

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


if __name__ == "__main__":
    sys.exit(main())
