"""The SDK against crashes and outages: agent processes killed with SIGKILL at the worst
moments, and a real server process stopped for a while. Nothing is repeated, nothing lost."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from tallybook import IntentNotRecorded, Tallybook

from durability.models import Case, Effect, Receipt
from tests.sdk.support import FAST, run_agent, wait_until


@dataclass
class Agent:
    """tests/sdk/agent.py refunding order 42 through the live server, one process per call."""

    url: str
    key: str
    spool: Path
    ledger: Path

    def __call__(self, *args):
        return run_agent(self.url, self.key, self.spool, self.ledger, "--order", "42", *args)


@pytest.fixture
def agent(live_server, api_key, spool_root, tmp_path):
    return Agent(live_server.url, api_key, spool_root, tmp_path / "fakepay-ledger.txt")


def test_an_agent_killed_after_the_effect_is_told_the_effect_is_in_doubt(agent):
    code, _ = agent("--crash", "after-effect")
    assert code == -9
    assert agent.ledger.read_text() == "42\n"

    code, out = agent()

    assert code == 3 and out["outcome"] == "in_doubt"
    assert agent.ledger.read_text() == "42\n", "the refund was repeated"
    effect = Effect.objects.get(key="refund:42")
    assert effect.state == "timed_out"
    case = Case.objects.get(effect=effect, reason="uncertain", closed=None)
    assert out["case"].endswith(case.get_absolute_url())
    assert "resumed" in case.summary


def test_a_receipt_spooled_before_a_kill_is_delivered_by_the_next_start_exactly_once(
    agent, spool_root
):
    code, _ = agent("--crash", "after-spool")
    assert code == -9
    assert len(list(spool_root.glob("*/*.json"))) == 1
    assert not Receipt.objects.exists()

    code, out = agent()
    again_code, again = agent()

    assert (code, out["outcome"]) == (0, "completed")
    assert (again_code, again["outcome"]) == (0, "completed")
    assert out["external_id"] == "re_42_1"
    assert agent.ledger.read_text() == "42\n"
    assert Receipt.objects.filter(key="refund:42").count() == 1
    assert Effect.objects.get(key="refund:42").state == "succeeded"
    assert not Case.objects.exists(), "the replayed receipt looked late or the run interrupted"
    assert not list(spool_root.glob("*/*.json"))


def test_a_server_away_for_a_while_loses_no_receipt(server, api_key, spool_root):
    server.start()
    tb = Tallybook(server.url, api_key, spool=spool_root, **FAST)
    with contextlib.ExitStack() as blocks:
        effects = [
            blocks.enter_context(tb.effect(f"send:{n}", kind="email", target="smtp"))
            for n in range(3)
        ]
        server.stop()
        for n, fx in enumerate(effects):
            fx.receipt(system="smtp", external_id=f"msg-{n}")
    with pytest.raises(IntentNotRecorded), tb.effect("send:3", kind="email", target="smtp"):
        pytest.fail("an effect ran without a recorded intent")
    assert len(tb.spool.pending()) == 3
    wait_until(lambda: tb._failing, what="the sender to find the server away")

    server.start()

    wait_until(lambda: not tb.spool.pending(), what="the spool to drain")
    tb.close()
    assert sorted(Receipt.objects.values_list("external_id", flat=True)) == [
        "msg-0",
        "msg-1",
        "msg-2",
    ]
    assert set(Effect.objects.values_list("state", flat=True)) == {"succeeded"}
    assert not Case.objects.exists()
