"""The verdicts a case offers follow its reason (docs/operator-guide.md): each reason offers
what settles it, the server refuses the others with why, and a closed case says how it was
closed in words a person says."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

from durability.models import AuditEntry, Case, Effect, Reason
from tests.desk.support import case_of, exceeding_case, logged_in, search

# The reference: what each reason offers on its page, in the page's order.
OFFERED = {
    Reason.UNCERTAIN: ["happened", "not_happened", "compensated", "abandoned"],
    Reason.LATE_SUCCESS: ["compensated", "acknowledge"],
    Reason.DUPLICATE_EFFECT: ["compensated", "acknowledge"],
    Reason.KEY_REUSE_CONFLICT: ["acknowledge"],
    Reason.ORPHAN_RECEIPT: ["acknowledge"],
    Reason.VERSION_DRIFT: ["acknowledge"],
    Reason.APPROVAL_REQUIRED: [],
    Reason.AUTHORITY_DENIED: ["acknowledge"],
    Reason.UNAUTHORIZED_EFFECT: ["compensated", "acknowledge"],
    Reason.AUTHORITY_EXCEEDED: ["compensated", "acknowledge"],
}
EVERY = ["happened", "not_happened", "compensated", "abandoned", "acknowledge"]
REFUSED = [(reason, v) for reason, offered in OFFERED.items() for v in EVERY if v not in offered]


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def _offered(page: str) -> list[str]:
    return re.findall(r'<input type="radio" name="verdict" value="(\w+)"', page)


def _resolve(client, case, verdict, note="checked it", **fields):
    body = {"verdict": verdict, "version": case.version, "note": note, **fields}
    return client.post(f"/cases/{case.pk}/resolve/", body)


def test_the_reference_names_every_reason():
    assert set(OFFERED) == set(Reason)


def test_the_operator_guide_offers_what_the_pages_offer():
    guide = (Path(__file__).parents[2] / "docs" / "operator-guide.md").read_text()
    words = {
        "it happened": "happened",
        "it did not happen": "not_happened",
        "compensated": "compensated",
        "abandoned": "abandoned",
        "acknowledge": "acknowledge",
    }
    said: dict[str, list[str]] = {}
    for reasons, offered in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| ([^|]+) \|$", guide, re.M):
        actions = [words[a] for a in re.sub(r" \(.*?\)", "", offered).split(", ") if a in words]
        for reason in re.findall(r"`(\w+)`", reasons):
            said[reason] = actions
    assert said == {str(reason): offered for reason, offered in OFFERED.items()}


@pytest.mark.parametrize("reason", list(Reason))
def test_each_reason_offers_the_verdicts_that_settle_it(project, desk, reason):
    case = case_of(project, reason)
    page = desk.get(f"/cases/{case.pk}/").content.decode()
    assert _offered(page) == OFFERED[reason]


def test_a_key_reuse_conflict_leaves_its_untouched_effect_alone(project, desk):
    case = case_of(project, Reason.KEY_REUSE_CONFLICT)
    page = desk.get(f"/cases/{case.pk}/").content.decode()
    assert "Compensated" not in page and "Abandoned" not in page


def test_a_refund_that_succeeded_cannot_be_abandoned(project, desk):
    case = case_of(project, Reason.AUTHORITY_EXCEEDED)
    assert case.effect.state == "succeeded"
    r = _resolve(desk, case, "abandoned")
    assert r.status_code == 400
    assert Effect.objects.get(pk=case.effect_id).state == "succeeded"


@pytest.mark.parametrize(("reason", "verdict"), REFUSED)
def test_the_server_refuses_a_verdict_the_reason_does_not_offer(project, desk, reason, verdict):
    case = case_of(project, reason)
    state = case.effect.state if case.effect else None
    entries = AuditEntry.objects.count()
    r = _resolve(desk, case, verdict, system="stripe", external_id="ch_1")
    assert r.status_code == 400
    error = unescape(search(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', r.content.decode())[1])
    said = {
        "happened": "“It happened”",
        "not_happened": "“It did not happen”",
        "compensated": "“Compensated”",
        "abandoned": "“Abandoned”",
    }
    if verdict == "acknowledge":
        assert "not acknowledged here" in error or "needs a verdict" in error
    else:
        assert f"{said[verdict]} does not settle a case of reason {reason}." in error
    case.refresh_from_db()
    assert case.closed is None
    assert (case.effect.state if case.effect else None) == state
    assert AuditEntry.objects.count() == entries


@pytest.mark.parametrize("reason", [r for r in Reason if OFFERED[r]])
def test_each_offered_verdict_is_accepted(project, desk, reason):
    verdict = OFFERED[reason][-1]
    case = case_of(project, reason)
    fields = {"system": "stripe", "external_id": "ch_1"} if verdict == "happened" else {}
    r = _resolve(desk, case, verdict, **fields)
    assert r.status_code == 302
    assert Case.objects.get(pk=case.pk).closed is not None


@pytest.mark.parametrize(
    ("reason", "verdict", "status"),
    [
        (Reason.UNCERTAIN, "not_happened", "Closed: it did not happen"),
        (Reason.UNCERTAIN, "abandoned", "Closed: abandoned"),
        (Reason.LATE_SUCCESS, "acknowledge", "Acknowledged"),
        (Reason.AUTHORITY_EXCEEDED, "compensated", "Closed: compensated"),
    ],
)
def test_a_closed_case_says_how_in_words_a_person_says(project, desk, reason, verdict, status):
    case = case_of(project, reason)
    assert _resolve(desk, case, verdict, note="looked in Stripe").status_code == 302
    page = unescape(desk.get(f"/cases/{case.pk}/").content.decode())
    line = search(r'<p class="status" data-status>(.*?)</p>', page)[1]
    assert re.sub(r"<[^>]+>", "", line) == f"{status} by alice: “looked in Stripe”"
    effect_page = unescape(desk.get(f"/effects/{case.effect_id}/").content.decode())
    shown = re.sub(r"<[^>]+>", " ", effect_page + page)  # the words, not the markup
    for code in ("attest_not_happened", "abandon by", "compensate by", "user:alice"):
        assert code not in shown, code
    assert f"{status} by alice" in effect_page


def test_the_queue_row_of_a_case_closed_elsewhere_says_how(project, desk):
    case = case_of(project, Reason.UNCERTAIN)
    assert _resolve(desk, case, "not_happened").status_code == 302
    row = desk.get(f"/queue/pulse/?since=0&shown={case.pk}").content.decode()
    assert "Closed: it did not happen by alice" in row


# -- an authority_exceeded case shows the figures it compares (issue 14, bug 6) -------------


def test_an_authority_exceeded_case_shows_the_grants_limit_the_intents_and_the_receipts_amount(
    project, desk
):
    case = exceeding_case(project)
    assert "400.00 EUR is more than the 40.00 EUR the intent asked for" in case.summary
    page = unescape(desk.get(f"/cases/{case.pk}/").content.decode()).replace("\n", "")
    table = search(r'<table class="changes" data-figures>(.*?)</table>', page)[1]
    assert "Grant small refunds (v1)" in table and "Receipt <code>stripe:re_400</code>" in table
    assert search(r"<td data-limit>(.*?)</td>", table)[1] == "50.00 EUR per effect"
    assert search(r"<td data-asked>(.*?)</td>", table)[1] == "40.00 EUR"
    assert search(r"<td data-receipt-amount>(.*?)</td>", table)[1] == "400.00 EUR"


def test_the_effect_answer_carries_the_figures_too(project, api):
    case = exceeding_case(project)
    body = api.get(f"effects/{case.effect_id}").json()
    assert body["amount"] == {"value": "40", "currency": "EUR"}
    grant = body["grant"]
    assert (grant["name"], grant["currency"], grant["max_amount"]) == ("small refunds", "EUR", "50")
    assert grant["max_daily_amount"] is None and grant["targets"] == ["*"]
    (receipt,) = body["receipts"]
    assert receipt["amount"] == {"value": "400", "currency": "EUR"}
    assert [c["reason"] for c in body["cases"]] == ["authority_exceeded"]


def test_an_effect_without_an_amount_or_grant_answers_null_for_them(project, api):
    api.intent("email:1", kind="email", target="smtp", authority=None)
    body = api.get("effects", key="email:1").json()
    assert body["amount"] is None and body["grant"] is None


def test_the_effect_page_shows_the_intents_and_the_receipts_amount(project, desk):
    case = exceeding_case(project)
    page = unescape(desk.get(f"/effects/{case.effect_id}/").content.decode())
    assert "<dt>Amount</dt><dd>40.00 EUR</dd>" in page
    assert search(r"<span data-receipt-moved>(.*?)</span>", page)[1] == "400.00 EUR"
    assert "small refunds (grant" in page
