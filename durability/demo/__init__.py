"""The living demo: simulated agents that use the real SDK against a running Tallybook.

`manage.py demo` seeds a fresh demo project (grants, reconcilers, a history of effects);
`manage.py demoagents` then runs, until stopped, a fake payment and deploy provider
(`provider`), a local git repository, and three agent processes (`agents`): a refund bot,
a release bot and a support bot. They record their effects through `tallybook` over
HTTP and their trajectories through OpenTelemetry (`telemetry`), and now and then they
crash, time out, retry badly or overstep their grants, so that every kind of case shows up
in the queue — some settled by the reconcilers on their own, some left to the operator.

Nothing here imports Django: the agents run as plain Python processes, like real ones.
"""

from __future__ import annotations

from pathlib import Path

# Where the demo keeps what it has on disk, by default: the git repository (`repository`),
# the agents' memory, spools and logs.
DEMO_DIR = Path(__file__).resolve().parent.parent.parent / ".demo"
PROVIDER_PORT = 8765


def repository(directory: Path) -> Path:
    """The release bot's git repository, which the git reconciler asks."""
    return directory / "release-repo"
