"""An agent in a fresh virtualenv with nothing but the SDK's wheel: one effect, for real.

    python installed_agent.py URL API_KEY SPOOL

Prints one JSON line: where `tallybook` came from, what the effect did, and whether
anything of the server's could be imported.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import tallybook


def main() -> None:
    url, api_key, spool = sys.argv[1:4]
    # A budget a loaded machine's first answer stays within (the default, 2 s, is an agent's
    # that must not wait; the test server's first request loads its URLs and views).
    with tallybook.Tallybook(url, api_key, spool=spool, timeout=30.0, intent_budget=30.0) as tb:

        @tb.tool("email:{run_id}:{to}", kind="email", target="fakesmtp", receipt="id")
        def send_email(to: str) -> dict[str, str]:
            return {"id": f"msg-for-{to}"}

        with tb.run("installed-agent", run_id="venv-1"):
            first, again = send_email("ann@example.com"), send_email("ann@example.com")
        delivered = tb.flush()
    print(
        json.dumps(
            {
                "file": tallybook.__file__,
                "version": tallybook.__version__,
                "python": list(sys.version_info[:2]),
                "results": [first, again],
                "delivered": delivered,
                "otel": importlib.util.find_spec("opentelemetry") is not None,
                "server_code": [
                    name
                    for name in ("django", "durability", "trajectories")
                    if importlib.util.find_spec(name) is not None
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
