"""The agents in examples/ run against a live server as documented, and a second run
repeats none of their effects."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from durability.models import Attempt, Effect, Receipt
from tests.sdk.support import ROOT


@pytest.fixture
def run_example(live_server, api_key, tmp_path):
    env = {
        **os.environ,
        "TALLYBOOK_URL": live_server.url,
        "TALLYBOOK_API_KEY": api_key,
        "TALLYBOOK_SPOOL_DIR": str(tmp_path / "spool"),
    }

    def run(name, *args):
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / name), "--provider-dir", str(tmp_path), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    return run


def test_the_refund_bot_refunds_each_order_once(run_example, tmp_path):
    first = run_example("refund_bot.py")
    second = run_example("refund_bot.py")

    refunds = json.loads((tmp_path / "fakepay-refunds.json").read_text())
    assert sorted(r["order"] for r in refunds) == ["42", "43"]
    for out in (first, second):
        assert "T-1001: refunded, receipt re_" in out
        assert "T-1003: declined, nothing refunded" in out
        assert "fakepay has made 2 refund(s) in all" in out
    assert first.splitlines()[:2] == second.splitlines()[:2]
    assert Effect.objects.get(key="refund:44").state == "failed"
    assert Receipt.objects.count() == 2
    assert Attempt.objects.get(effect__key="refund:42").run_id == "T-1001"


def test_the_tool_agent_sends_each_message_once(run_example, tmp_path):
    first = run_example("tool_agent.py")
    second = run_example("tool_agent.py")

    assert first == second
    assert "call_2 send_email: fakesmtp msg_" in first
    sent = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert len(sent) == 2
    email = Effect.objects.get(key="email:billing@acme.example:Your invoice")
    assert email.tool_call_id == "call_2" and email.state == "succeeded"
    assert Attempt.objects.get(effect=email).context["model"] == "scripted-model-1"
