"""Recovery without hand-written loops: a probe that asks the provider, a block that waits
for a person and asks again, receipts that arrive outside any block, and one outcome per
block."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tallybook import (
    EffectInDoubt,
    EffectInterrupted,
    IntentNotRecorded,
    Receipt,
    ReceiptConflict,
    Tallybook,
    TallybookError,
)

from durability.ledger import settling
from durability.ledger.machine import Event
from durability.models import Case, Effect
from durability.models import Receipt as ReceiptRow
from tests.ports import refusing_port
from tests.sdk.support import FAST, SDK_SRC, alongside, wait_until


def refund(tb, **options):
    return tb.effect("refund:42", kind="payment", target="fakepay", request={"n": 1}, **options)


def in_doubt(tb):
    """Leave refund:42 in doubt: the attempt failed without knowing whether it happened."""
    with pytest.raises(ConnectionError), refund(tb):
        raise ConnectionError("fakepay hung up")
    assert tb.flush()


def test_a_probe_that_finds_the_effect_settles_it_and_the_block_is_completed(tb):
    in_doubt(tb)
    asked = []

    def ask_fakepay(report):
        asked.append(report)
        return Receipt(system="fakepay", external_id="re_1")

    with refund(tb, on_in_doubt=ask_fakepay) as fx:
        assert fx.completed and fx.receipt.external_id == "re_1"

    (report,) = asked
    assert report.decision == "wait" and report.case.reason == "uncertain"
    assert Effect.objects.get().state == "succeeded"
    assert not Case.objects.filter(reason="uncertain", closed=None).exists()


def test_a_probe_that_finds_nothing_leaves_the_effect_to_a_person(tb):
    in_doubt(tb)

    with pytest.raises(EffectInDoubt), refund(tb, on_in_doubt=lambda report: None):
        pytest.fail("an effect in doubt ran")

    assert Effect.objects.get().state == "timed_out"


def test_a_block_told_to_wait_runs_once_a_person_settles_the_effect(tb, status_polls):
    in_doubt(tb)
    effect = Effect.objects.get()

    def operator():
        # A second poll means the first was answered "wait": the block is waiting.
        wait_until(lambda: status_polls["refund:42"] >= 2, 60, "the block to wait and poll")
        settling.effect_settle(
            project=effect.project,
            effect_id=effect.pk,
            actor="user:alice",
            event=Event.ATTEST_NOT_HAPPENED,
            note="fakepay has no such refund",
        )

    with alongside(operator), refund(tb, wait_in_doubt=20) as fx:
        assert fx.decision == "proceed" and fx.attempt == 2
        fx.receipt(system="fakepay", external_id="re_2")

    assert tb.flush()
    assert Effect.objects.get().state == "succeeded"


def test_a_second_receipt_in_one_block_raises_before_anything_is_sent(tb):
    with refund(tb) as fx:
        fx.receipt(system="fakepay", external_id="re_1")
        assert fx.receipt(system="fakepay", external_id="re_1").external_id == "re_1"
        with pytest.raises(ReceiptConflict, match="tb.receipt"):
            fx.receipt(system="fakepay", external_id="re_2")
        with pytest.raises(ReceiptConflict):
            fx.fail("after all?")

    assert tb.flush()
    assert list(ReceiptRow.objects.values_list("external_id", flat=True)) == ["re_1"]
    assert not Case.objects.exists()


def test_a_receipt_outside_a_block_is_recorded_and_a_second_effect_is_a_duplicate(tb):
    with refund(tb) as fx:
        fx.receipt(system="fakepay", external_id="re_1")

    # The provider's webhook says it refunded twice.
    tb.receipt("refund:42", system="fakepay", external_id="re_2", data={"via": "webhook"})

    assert tb.flush()
    assert ReceiptRow.objects.get(external_id="re_2").data == {"via": "webhook"}
    assert Case.objects.get().reason == "duplicate_effect"


def test_every_do_not_perform_outcome_is_an_effect_interrupted(api_key, tmp_path):
    with refusing_port() as port:
        tb = Tallybook(f"http://127.0.0.1:{port}", api_key, spool=tmp_path, **FAST)
        with pytest.raises(EffectInterrupted) as raised, refund(tb):
            pytest.fail("an effect ran without a recorded intent")

    assert isinstance(raised.value, IntentNotRecorded)
    assert (raised.value.decision, raised.value.case) == ("unrecorded", None)
    tb.close()


def test_a_client_is_built_without_reading_the_environment_and_complains_at_first_use(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("TALLYBOOK_API_KEY", raising=False)
    monkeypatch.setenv("TALLYBOOK_SPOOL_DIR", str(tmp_path / "spool"))
    tb = Tallybook()

    @tb.tool("email:{to}", kind="email", target="smtp", receipt="id")
    def send_email(to: str) -> dict:
        raise AssertionError("the tool ran")

    assert not (tmp_path / "spool").exists()
    with pytest.raises(TallybookError, match="No API key"):
        send_email("ann@example.com")
    tb.close()


def test_a_module_level_client_imports_without_a_key_or_a_server():
    code = (
        "import os; os.environ.pop('TALLYBOOK_API_KEY', None)\n"
        "import tallybook; tb = tallybook.Tallybook('http://127.0.0.1:9', spool='/nonexistent')\n"
        "@tb.tool('k:{x}', kind='k', target='t', receipt='id')\n"
        "def f(x: int) -> dict: return {'id': x}\n"
    )
    subprocess.run([sys.executable, "-S", "-c", code], cwd=SDK_SRC, check=True, timeout=60)
