"""The SDK's effect block against a live server: what runs, what is recorded, what raises."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
from tallybook import (
    EffectConflict,
    EffectDenied,
    EffectInDoubt,
    EffectUnsettled,
    IntentNotRecorded,
    Tallybook,
)

from durability.ledger import evidence, settling
from durability.ledger.machine import Event
from durability.models import Attempt, Case, Effect, Receipt
from tests.ports import refusing_port
from tests.sdk.support import FAST, SDK_SRC, alongside, wait_until


class Declined(Exception):
    """The fake provider said no: nothing happened."""


def refund(tb, order="42", amount=1250, **options):
    return tb.effect(
        f"refund:{order}",
        kind="payment",
        target="fakepay",
        request={"order": order, "amount": amount},
        **options,
    )


def settle(effect_key, event):
    """What an operator does on the effect's page."""
    effect = Effect.objects.get(key=effect_key)
    settling.effect_settle(
        project=effect.project,
        effect_id=effect.pk,
        actor="user:alice",
        event=event,
        note="checked with the provider",
    )


def test_an_effect_records_its_intent_then_its_receipt(tb):
    with tb.run("refund-bot", version="2.3.0", run_id="ticket-7"), refund(tb) as fx:
        assert fx.decision == "proceed" and not fx.completed
        assert Effect.objects.get(key="refund:42").state == "pending"
        receipt = fx.receipt(system="fakepay", external_id="re_1", observed_at=1767225600)

    # Spooled, and returned before it is sent: the server's copy comes a moment later.
    assert (receipt.id, receipt.external_id, receipt.attempt) == (None, "re_1", 1)
    assert tb.flush()
    assert Receipt.objects.get().strength == "agent_reported"
    effect = Effect.objects.get(key="refund:42")
    assert (effect.state, effect.request) == ("succeeded", {"order": "42", "amount": 1250})
    stored = Receipt.objects.get(effect=effect)
    assert (stored.external_id, stored.attempt) == ("re_1", 1)
    assert stored.observed_at == datetime(2026, 1, 1, tzinfo=UTC)
    attempt = Attempt.objects.get(effect=effect)
    assert attempt.run_id == "ticket-7" and attempt.worker == tb.worker
    assert attempt.context == {"workflow": "refund-bot", "workflow_version": "2.3.0"}
    assert not list(tb.spool.directory.glob("*.json"))


def test_a_completed_effect_is_not_repeated_and_shows_the_stored_receipt(tb):
    with refund(tb) as fx:
        fx.receipt(system="fakepay", external_id="re_1", data={"amount": 1250})

    # Not flushed: the next intent for the key sends the receipt first.
    with refund(tb) as fx:
        assert fx.completed and fx.decision == "completed"
        assert fx.receipt.external_id == "re_1" and fx.receipt.data == {"amount": 1250}

    assert Receipt.objects.count() == 1


def test_the_run_context_and_tool_call_travel_with_every_intent(tb):
    with (
        tb.run("refund-bot", version="2.3.0", run_id="ticket-7", code_version="abc123"),
        tb.context(model="gpt-x", tools={"refund": "1.2"}, tool_call_id="call_9", region="eu"),
        refund(tb) as fx,
    ):
        fx.receipt(system="fakepay", external_id="re_1")

    assert tb.flush()
    attempt = Attempt.objects.get(effect__key="refund:42")
    assert attempt.context == {
        "workflow": "refund-bot",
        "workflow_version": "2.3.0",
        "code_version": "abc123",
        "model": "gpt-x",
        "tools": {"refund": "1.2"},
        "region": "eu",
    }
    assert Effect.objects.get(key="refund:42").tool_call_id == "call_9"


def test_an_exception_in_the_body_reports_an_uncertain_failure_and_reraises(tb):
    with pytest.raises(TimeoutError), refund(tb):
        raise TimeoutError("fakepay did not answer")

    assert tb.flush()
    effect = Effect.objects.get(key="refund:42")
    assert effect.state == "timed_out"
    case = Case.objects.get(effect=effect, reason="uncertain", closed=None)
    assert "TimeoutError: fakepay did not answer" in case.summary


def test_an_effect_in_doubt_raises_the_interruption_report_and_does_not_run(tb):
    with pytest.raises(TimeoutError), refund(tb):
        raise TimeoutError("fakepay did not answer")
    ran = False

    with pytest.raises(EffectInDoubt) as raised, refund(tb):
        ran = True

    assert not ran
    report, case = raised.value, Case.objects.get(reason="uncertain", closed=None)
    assert report.decision == "wait" and "forbids a blind retry" in report.reason
    assert report.case and (report.case.id, report.case.reason) == (case.pk, "uncertain")
    # The address the server was asked at, as SITE_URL is not set.
    assert report.case_url == report.case.url == tb.url + case.get_absolute_url()
    assert report.case.url in str(report)


def test_a_definitive_failure_lets_the_next_attempt_proceed(tb):
    with pytest.raises(Declined), refund(tb, definitive_on=(Declined,)):
        raise Declined("card expired")
    assert tb.flush()
    assert Effect.objects.get(key="refund:42").state == "failed"

    with refund(tb) as fx:
        assert fx.decision == "proceed" and fx.attempt == 2
        fx.fail("declined again", definitive=True)

    assert tb.flush()
    assert Effect.objects.get(key="refund:42").state == "failed"
    assert not Case.objects.exists()


def test_leaving_the_block_without_receipt_or_failure_raises_and_opens_a_case(tb):
    with pytest.raises(EffectUnsettled, match="neither a receipt nor a failure"), refund(tb):
        pass

    assert tb.flush()
    assert Effect.objects.get(key="refund:42").state == "timed_out"
    assert Case.objects.filter(reason="uncertain", closed=None).count() == 1


def test_the_same_key_for_another_request_raises_effect_conflict(tb):
    with refund(tb, amount=1250) as fx:
        fx.receipt(system="fakepay", external_id="re_1")

    with pytest.raises(EffectConflict) as raised, refund(tb, amount=9999):
        pytest.fail("a conflicting effect ran")

    assert raised.value.case and raised.value.case.reason == "key_reuse_conflict"


def test_an_effect_an_operator_abandoned_raises_effect_denied(tb):
    with pytest.raises(TimeoutError), refund(tb):
        raise TimeoutError
    assert tb.flush()
    settle("refund:42", Event.ABANDON)

    with pytest.raises(EffectDenied, match="abandoned"), refund(tb):
        pytest.fail("an abandoned effect ran")


@pytest.fixture
def worker(live_server, api_key, tmp_path):
    """Clients of the live server with a given worker identity."""
    clients = []

    def make(identity):
        clients.append(Tallybook(live_server.url, api_key, spool=tmp_path, worker=identity, **FAST))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_asking_again_from_the_same_worker_is_the_same_attempt(worker):
    first, again = worker("host:1:a"), worker("host:1:a")
    with first.run("refund-bot", run_id="ticket-7"), refund(first) as fx:
        with refund(again) as retried:
            assert (retried.decision, retried.attempt) == ("proceed", fx.attempt)
            retried.receipt(system="fakepay", external_id="re_1")
        fx.receipt(system="fakepay", external_id="re_1")

    assert first.flush() and again.flush()
    assert Receipt.objects.count() == 1
    assert not Case.objects.exists()


def test_the_same_run_in_another_worker_finds_the_attempt_interrupted(worker):
    first, other = worker("host:1:a"), worker("host:2:b")
    with first.run("refund-bot", run_id="ticket-7"), refund(first) as fx:
        with pytest.raises(EffectInDoubt, match="timed out"), refund(other):
            pytest.fail("an interrupted attempt ran again")
        fx.receipt(system="fakepay", external_id="re_1")

    # The interrupted attempt's receipt still counts, as a late success.
    assert first.flush()
    assert Receipt.objects.get().late
    assert Case.objects.get(closed=None).reason == "late_success"


def test_a_timeout_then_a_late_receipt_is_a_late_success(tb):
    with refund(tb, timeout_s=1) as fx:
        later = datetime.now(UTC) + timedelta(seconds=2)
        assert [e.key for e in evidence.deadlines_sweep(now=later)] == ["refund:42"]
        fx.receipt(system="fakepay", external_id="re_1")

    assert tb.flush()
    assert Receipt.objects.get().late
    effect = Effect.objects.get(key="refund:42")
    assert (effect.state, effect.late) == ("succeeded", True)
    assert Case.objects.filter(reason="late_success", closed=None).count() == 1
    assert not Case.objects.filter(reason="uncertain", closed=None).exists()


def test_wait_for_returns_once_an_operator_settles_the_case(tb, status_polls):
    with pytest.raises(TimeoutError), refund(tb):
        raise TimeoutError
    assert tb.flush()

    def operator():
        # A second poll means the first was answered "wait": wait_for is waiting.
        wait_until(lambda: status_polls["refund:42"] >= 2, 60, "wait_for to wait and poll")
        settle("refund:42", Event.ATTEST_NOT_HAPPENED)

    with alongside(operator):
        status = tb.wait_for("refund:42", timeout=10, poll=0.1)

    assert (status.decision, status.state) == ("proceed", "not_happened")
    with refund(tb) as fx:
        assert fx.attempt == 2
        fx.receipt(system="fakepay", external_id="re_2")


def test_wait_for_gives_up_with_effect_in_doubt(tb):
    with pytest.raises(TimeoutError), refund(tb):
        raise TimeoutError
    assert tb.flush()

    with pytest.raises(EffectInDoubt, match="Still waiting after 0.3 s") as raised:
        tb.wait_for("refund:42", timeout=0.3, poll=0.1)

    assert raised.value.case and raised.value.case.reason == "uncertain"


def test_without_a_server_the_effect_does_not_run(api_key, tmp_path):
    with refusing_port() as port:
        tb = Tallybook(f"http://127.0.0.1:{port}", api_key, spool=tmp_path, **FAST)
        not_recorded = pytest.raises(IntentNotRecorded, match="could not be recorded")
        with not_recorded as raised, refund(tb):
            pytest.fail("an effect ran without a recorded intent")

    assert raised.value.status is None
    assert not tb.spool.pending()
    tb.close()


def test_a_malformed_receipt_raises_before_anything_is_sent(tb):
    with pytest.raises(ValueError, match="observed_at"), refund(tb) as fx:
        fx.receipt(system="fakepay", external_id="re_1", observed_at="last tuesday")

    assert tb.flush()
    assert not Receipt.objects.exists()
    assert Effect.objects.get(key="refund:42").state == "timed_out"


def test_a_receipt_the_server_refuses_is_kept_aside_and_logged(tb, caplog):
    with refund(tb) as fx:
        fx.receipt(system="fakepay", external_id="re_1", observed_at="2026-13-45T00:00:00Z")

    assert tb.flush()
    assert len(list(tb.spool.rejected.glob("*.json"))) == 1
    assert "refused spooled receipts" in caplog.text
    assert Effect.objects.get(key="refund:42").state == "pending"


def test_one_client_serves_many_threads(tb):
    def agent(n):
        for i in range(5):
            with refund(tb, order=f"{n}-{i}") as fx:
                fx.receipt(system="fakepay", external_id=f"re_{n}_{i}")

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert tb.flush()

    assert Effect.objects.filter(state="succeeded").count() == 40
    assert Receipt.objects.count() == 40


def test_a_misspelt_option_is_refused_before_anything_is_sent(tb):
    with pytest.raises(TypeError, match="unknown effect option.*timeout"):
        tb.effect("refund:42", kind="payment", target="fakepay", timeout=30)

    assert not Effect.objects.exists()


def test_the_sdk_imports_without_django_or_any_installed_package():
    # -S: no site-packages at all; only the standard library and the SDK's folder.
    code = "import sys, tallybook; assert 'django' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-S", "-c", code], cwd=SDK_SRC, check=True)
