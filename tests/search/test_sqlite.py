"""The search on SQLite, the demo's database: no trigram indexes, the same tiers and ranks
with LIKE (case-insensitive, its wildcards escaped), in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_search_ranks_and_finds_every_kind_on_sqlite(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    texts = ["refund:7", "ANA.LOPEZ", "re_1_50%", "50%", "uncertain", "4bf92f35", "zz"]
    env |= {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SEARCH_TEXTS": json.dumps(texts),
    }
    script = ROOT / "tests" / "search" / "sqlite_search.py"
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", f"exec(open({str(script)!r}).read())"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])

    assert found["refund:7"]["effects"] == [
        ["refund:7", "key"],
        ["refund:70", "key"],
        ["audit:1", "request"],
    ]
    assert found["refund:7"]["cases"] == [["uncertain #1", "effect's key"]]
    assert found["ANA.LOPEZ"]["effects"] == [["audit:1", "request"]]
    assert found["re_1_50%"]["effects"] == [["refund:70", "external id"]]
    assert [e for e, _ in found["50%"]["effects"]] == ["audit:1", "refund:70", "refund:7"]
    assert [why for _, why in found["uncertain"]["cases"]] == ["reason"]
    assert found["4bf92f35"]["runs"] == [["ticket-5521", "trace id"]]
    assert found["zz"] == {"effects": [], "cases": [], "approvals": [], "runs": []}
