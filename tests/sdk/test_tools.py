"""`tb.tool(...)`: tool functions made durable by a decorator, the key from their arguments,
the call's result kept with the receipt and given back when the effect was done before."""

from __future__ import annotations

import pytest
from tallybook import EffectInDoubt, Receipt, Tallybook, TallybookError

from durability.api.schemas import ReceiptOut
from durability.models import Case, Effect
from durability.models import Receipt as ReceiptRow


@pytest.fixture
def sent() -> list[str]:
    """What the fake mail provider sent."""
    return []


@pytest.fixture
def mailer(tb: Tallybook, sent: list[str]):
    """A tool that sends an email through the fake provider and returns its message."""

    @tb.tool("email:{to}:{subject}", kind="email", target="fakesmtp", receipt="id")
    def send_email(to: str, subject: str, body: str = "") -> dict:
        sent.append(to)
        return {"id": f"msg-{len(sent)}", "to": to, "queued": True}

    return send_email


def test_a_tool_call_returns_its_result_and_records_its_arguments_as_the_request(tb, mailer):
    result = mailer("ann@example.com", "Your refund")

    assert result == {"id": "msg-1", "to": "ann@example.com", "queued": True}
    assert tb.flush()
    effect = Effect.objects.get(key="email:ann@example.com:Your refund")
    assert effect.state == "succeeded"
    assert effect.request == {"to": "ann@example.com", "subject": "Your refund", "body": ""}
    stored = ReceiptRow.objects.get(effect=effect)
    assert (stored.system, stored.external_id, stored.data) == (
        "fakesmtp",
        "msg-1",
        {"result": result},
    )


def test_a_tool_call_already_done_returns_the_same_result_without_running(mailer, sent):
    first = mailer("ann@example.com", "Your refund")
    again = mailer(to="ann@example.com", subject="Your refund")

    assert sent == ["ann@example.com"]
    assert again == first
    assert ReceiptRow.objects.count() == 1


def test_any_json_value_is_a_result_and_the_receipt_may_come_from_a_function(tb):
    @tb.tool(
        "count:{n}",
        kind="counter",
        target="fakecount",
        receipt=lambda total: Receipt(system="fakecount", external_id=f"total-{total}"),
    )
    def add(n: int) -> int:
        return n + 40

    assert add(2) == 42 and add(2) == 42
    assert tb.flush()
    assert ReceiptRow.objects.get().external_id == "total-42"


def test_a_tool_returning_its_receipt_gets_it_back_and_the_stored_one_on_replay(tb, sent):
    @tb.tool("email:{to}", kind="email", target="fakesmtp")
    def send_email(to: str) -> Receipt:
        sent.append(to)
        return Receipt(system="fakesmtp", external_id=f"msg-{len(sent)}")

    first, again = send_email("ann@example.com"), send_email("ann@example.com")

    assert sent == ["ann@example.com"]
    assert first.external_id == again.external_id == "msg-1"
    assert again.strength == "agent_reported"


def test_the_request_may_be_chosen_from_the_arguments(tb):
    @tb.tool(
        "email:{to}",
        kind="email",
        target="fakesmtp",
        request=lambda to, subject: {"to": to, "subject": subject},
        receipt="id",
    )
    def send_email(to: str, subject: str, body: str, trace: object = None) -> dict:
        return {"id": "msg-1"}

    send_email("ann@example.com", "Hello", "a long body", trace=object())

    assert Effect.objects.get().request == {"to": "ann@example.com", "subject": "Hello"}


def test_the_key_can_be_a_function_of_the_arguments(tb: Tallybook):
    @tb.tool(lambda order: f"refund:{order}", kind="payment", target="fakepay", receipt="id")
    def refund(order: int, cents: int) -> dict:
        return {"id": f"re_{order}"}

    refund(7, 1250)

    assert Effect.objects.get(key="refund:7").request == {"order": 7, "cents": 1250}


def test_the_key_template_may_name_the_run_and_the_tool_call(tb: Tallybook):
    @tb.tool("reply:{run_id}:{tool_call_id}", kind="chat", target="fakechat", receipt="id")
    def reply(text: str) -> dict:
        return {"id": "m1"}

    with pytest.raises(TallybookError, match=r"names \{run_id\}, but none is current"):
        reply("hello")
    with tb.run("support-bot", run_id="T-9"), tb.context(tool_call_id="call_3"):
        reply("hello")

    assert Effect.objects.get().key == "reply:T-9:call_3"


@pytest.mark.parametrize(
    ("key", "options", "problem"),
    [
        ("email:{recipient}", {}, "names recipient, which send_email does not take"),
        ("email:{}", {}, "must name its fields"),
        (lambda address: address, {}, "names address"),
        ("email:{to}", {"request": lambda to, cc: {}}, "names cc"),
        ("email:{to}", {"receipt": None}, "does not return a tallybook.Receipt"),
        ("email:{to}", {"receipt": 42}, "must be a field name or a function"),
        ("email:{to}", {"timout_s": 3}, "unknown effect option"),
        ("email:{to}", {"wait_in_doubt": "forever"}, "must be a number of seconds"),
        ("email:{to}", {"on_in_doubt": "ask"}, "must be a function"),
    ],
)
def test_a_wrong_decoration_is_refused_when_decorating(tb: Tallybook, key, options, problem):
    options = {"kind": "email", "target": "fakesmtp", "receipt": "id", **options}

    with pytest.raises(TypeError, match=problem):

        @tb.tool(key, **options)
        def send_email(to: str) -> dict:
            raise AssertionError("the tool ran")

    assert not Effect.objects.exists()


def test_a_tool_that_raises_reports_an_uncertain_failure_and_the_retry_is_in_doubt(tb: Tallybook):
    @tb.tool("charge:{order}", kind="payment", target="fakepay", receipt="id")
    def charge(order: int) -> dict:
        raise ConnectionError("fakepay hung up")

    with pytest.raises(ConnectionError):
        charge(1)
    with pytest.raises(EffectInDoubt):
        charge(1)

    assert Case.objects.get(closed=None).reason == "uncertain"


def test_a_tool_that_returns_no_receipt_after_all_is_a_bug_reported_loudly(tb: Tallybook):
    @tb.tool("charge:{order}", kind="payment", target="fakepay")
    def charge(order: int) -> Receipt:
        return "done"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a tallybook.Receipt"):
        charge(1)

    assert tb.flush()
    assert Effect.objects.get(key="charge:1").state == "timed_out"


def test_a_result_that_is_not_json_still_records_the_receipt(tb: Tallybook):
    @tb.tool("charge:{order}", kind="payment", target="fakepay", receipt="id")
    def charge(order: int) -> dict:
        return {"id": "ch_1", "when": object()}

    with pytest.raises(TypeError, match="is not JSON.*its receipt was recorded"):
        charge(1)

    assert tb.flush()
    assert Effect.objects.get(key="charge:1").state == "succeeded"
    # A receipt without the result: the call answers with the Receipt on record.
    replayed: object = charge(1)
    assert replayed == Receipt.from_json(
        ReceiptOut.of(ReceiptRow.objects.get()).model_dump(mode="json")
    )
