"""The evidence beside the verdict: an operator decides a case from its page alone. Money
reads with its currency's minor units, a conflicting key lists the fields that differ, a
raised severity says why, and an approval's case links to the approval."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from durability.ledger.grant_check import money
from durability.models import Approval, Case, Effect, Reason, Severity
from tests.authority.support import grant, under
from tests.desk.support import logged_in, search
from tests.ledger import support as ledger


@pytest.mark.parametrize(
    ("value", "currency", "shown"),
    [
        ("893.2", "EUR", "893.20 EUR"),
        ("40", "EUR", "40.00 EUR"),
        ("1200", "JPY", "1,200 JPY"),  # no minor unit
        ("12.345", "KWD", "12.345 KWD"),  # three
        ("0.001", "EUR", "0.001 EUR"),  # digits beyond the minor units are kept
        ("5", "", "5"),
    ],
)
def test_money_reads_with_the_currencys_minor_units(value, currency, shown):
    assert money(Decimal(value), currency) == shown


def _asking(api, project, key: str, amount: str | None, currency: str = "EUR") -> Approval:
    g = grant(project, name="refunds", currency=currency, requires_approval=True)
    api.intent(key, run_id="run-7", **under(g, amount, currency))
    return Approval.objects.get(effect__key=key)


def test_the_approvals_list_has_an_amount_column(api, project, alice):
    _asking(api, project, "refund:1", "893.2")
    _asking(api, project, "refund:2", None)
    page = logged_in(alice).get("/approvals/").content.decode()
    cells = [c.strip() for c in re.findall(r'<td class="num" data-amount>(.*?)</td>', page)]
    assert cells == ["893.20 EUR", '<span class="muted">none given</span>']


def test_the_approval_effect_and_case_pages_show_the_amount(api, project, alice):
    approval = _asking(api, project, "refund:1", "893.2")
    client = logged_in(alice)
    page = client.get(approval.get_absolute_url()).content.decode()
    assert search(r"<dd data-amount>(.*?)</dd>", page)[1] == "893.20 EUR"
    effect = client.get(approval.effect.get_absolute_url()).content.decode()
    assert "<dd>893.20 EUR</dd>" in effect
    case = Case.objects.get(effect=approval.effect, reason=Reason.APPROVAL_REQUIRED)
    page = client.get(case.get_absolute_url()).content.decode()
    assert "Amount: <strong>893.20 EUR</strong>" in search(r"data-amount>(.*?)</p>", page)[1]


def test_an_effect_without_an_amount_says_none_was_given(api, project, alice):
    approval = _asking(api, project, "refund:1", None)
    case = Case.objects.get(effect=approval.effect, reason=Reason.APPROVAL_REQUIRED)
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    assert 'Amount: <span class="muted">none given</span>' in page


def test_the_approval_required_banner_links_to_the_approval(api, project, alice):
    approval = _asking(api, project, "refund:1", "40")
    case = Case.objects.get(effect=approval.effect, reason=Reason.APPROVAL_REQUIRED)
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    banner = search(r"<p class=\"banner\" data-approval-link>(.*?)</p>", page)[1]
    assert f'<a href="/approvals/{approval.pk}/">approval #{approval.pk}</a>' in banner


def test_a_key_reused_with_another_request_lists_the_fields_that_differ(project, alice):
    first = {"order": "A-17", "lines": [{"sku": "X", "qty": 1}], "note": "same"}
    ledger.intent(project, "refund:1", request=first)
    again = {"order": "A-18", "lines": [{"sku": "X", "qty": 2}], "note": "same", "rush": True}
    ledger.intent(project, "refund:1", request=again)
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert case.detail["differs"] == {
        "request.lines.0.qty": [1, 2],
        "request.order": ["A-17", "A-18"],
        "request.rush": [None, True],
    }
    assert case.summary == "Key 'refund:1' was reused with a different request."
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    table = page[page.index("data-differs") : page.index("</table>")]
    assert "<td>request.order</td><td><code>&quot;A-17&quot;</code></td>" in table
    assert "fingerprint" not in table


def test_a_reused_key_whose_requests_differ_only_in_a_secret_shows_the_fingerprints(project, alice):
    ledger.intent(project, "refund:1", request={"api_key": "sk_live_aaaaaaaaaaaaaaaaaaaa"})
    ledger.intent(project, "refund:1", request={"api_key": "sk_live_bbbbbbbbbbbbbbbbbbbb"})
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert list(case.detail["differs"]) == ["fingerprint"]
    assert "sk_live_" not in str(case.detail)


def test_the_stored_conflicting_request_is_redacted_before_it_is_compared(project, alice):
    ledger.intent(project, "refund:1", request={"order": "A-17", "password": "hunter2"})
    ledger.intent(project, "refund:1", request={"order": "A-18", "password": "swordfish"})
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert case.detail["differs"] == {"request.order": ["A-17", "A-18"]}
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    assert "hunter2" not in page and "swordfish" not in page


def test_a_receipt_that_raises_a_cases_severity_says_so_in_its_story(project, alice):
    ledger.cases_asked(project)
    ledger.intent(project, "k1", authority=None)
    case = Case.objects.get(reason=Reason.UNAUTHORIZED_EFFECT)
    assert case.severity == Severity.LOW
    ledger.receipt(project, "k1", "re_1")
    case.refresh_from_db()
    assert case.severity == Severity.HIGH
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    raised = search(r"<p data-raised>(.*?)</p>", page)[1]
    assert "<strong>raised to high: a receipt shows the effect happened</strong>" in raised
    assert "(was low)" in raised
    effect = Effect.objects.get(key="k1")
    assert "raised to high" in logged_in(alice).get(effect.get_absolute_url()).content.decode()


def test_a_repeat_that_does_not_raise_the_severity_tells_no_raise(project, alice):
    ledger.intent(project, "k1")
    ledger.receipt(project, "k1", "re_a")
    ledger.receipt(project, "k1", "re_b")
    ledger.receipt(project, "k1", "re_c")  # the duplicate case, seen again at its severity
    case = Case.objects.get(reason=Reason.DUPLICATE_EFFECT)
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    assert "Case seen again" in page and "data-raised" not in page
