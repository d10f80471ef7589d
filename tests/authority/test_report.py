"""The authority report (/authority/audit/): authority set against evidence, in four
quadrants with their effects, and the same table as CSV."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durability import tallies
from durability.authority.report import PAGE_SIZE
from durability.ledger import evidence
from durability.ledger.commands import Amount, ReceiptEvidence
from durability.models import Case as LedgerCase
from durability.models import Effect, Project, Receipt, Strength
from tests.authority.support import grant, under
from tests.desk.support import logged_in
from tests.ledger import support as ledger

PAGE = "/authority/audit/"


def _provider(project: Project, key: str, external_id: str, amount: str | None = None) -> None:
    evidence.receipt_record(
        project=project,
        actor="webhook:test",
        receipt=ReceiptEvidence(
            key=key,
            system="stripe",
            external_id=external_id,
            amount=Amount(Decimal(amount), "EUR") if amount else None,
        ),
        strength=Strength.PROVIDER_CONFIRMED,
    )


@pytest.fixture
def week(project: Project) -> dict[str, int]:
    """A week of effects in every quadrant; returns the expected counts."""
    g = grant(project, name="payments", kinds=["payment"], currency="EUR", max_amount="10")
    approval = grant(project, name="big", requires_approval=True)
    ledger.intent(project, "ok:1", **under(g, "5"))
    ledger.receipt(project, "ok:1", "re_1")
    ledger.intent(project, "ok:2", **under(g, "5"))
    _provider(project, "ok:2", "re_2")
    ledger.intent(project, "over:1", **under(g, "9"))
    _provider(project, "over:1", "re_3", amount="12")  # beyond the grant
    ledger.intent(project, "waiting:1", **under(g, "5"))  # no evidence yet
    ledger.intent(project, "rogue:1", authority=None)  # no grant, audit policy
    ledger.receipt(project, "rogue:1", "re_4")
    ledger.receipt(project, "orphan:1", "re_5")  # evidence, no intent
    ledger.intent(project, "denied:1", kind="email", **under(g))
    ledger.intent(project, "asked:1", **under(approval))
    ledger.intent(project, "rogue:2", authority=None)  # no grant, no evidence
    ledger.intent(project, "long-ago:1", **under(g, "1"))
    Effect.objects.filter(key="long-ago:1").update(created=timezone.now() - timedelta(days=30))
    return {
        "authorized_evidence": 3,
        "authorized_waiting": 1,
        "evidence_unauthorized": 2,
        "denied_unattempted": 3,
    }


def _counts(html: str) -> dict[str, int]:
    return {
        name: int(count)
        for name, count in re.findall(
            r'data-quadrant="(\w+)">\s*<span class="quadrant-label">[^<]*</span>\s*'
            r'<span class="quadrant-count">(\d+)</span>',
            html,
        )
    }


def _keys(html: str) -> list[str]:
    table = html[html.index('class="list authority-audit"') :]
    table = table[: table.index("</table>")]
    return re.findall(r'<td><a href="[^"]+">\d+</a></td>\s*<td><code>([^<]+)</code>', table)


def test_the_quadrants_count_authority_against_evidence(project, alice, week):
    html = logged_in(alice).get(PAGE).content.decode()
    assert _counts(html) == week


def test_each_quadrant_drills_down_to_its_effects(project, alice, week):
    client = logged_in(alice)
    expect = {
        "authorized_evidence": ["over:1", "ok:2", "ok:1"],
        "authorized_waiting": ["waiting:1"],
        "evidence_unauthorized": ["rogue:1"],
        "denied_unattempted": ["rogue:2", "asked:1", "denied:1"],
    }
    for quadrant, keys in expect.items():
        html = client.get(PAGE, {"quadrant": quadrant}).content.decode()
        assert _keys(html) == keys, quadrant
    orphans = client.get(PAGE, {"quadrant": "evidence_unauthorized"}).content.decode()
    assert "orphan:1" in orphans


def test_the_table_shows_authority_strongest_evidence_and_mismatch(project, alice, week):
    html = logged_in(alice).get(PAGE).content.decode()
    row = html[html.index("<code>over:1</code>") :]
    row = row[: row.index("</tr>")]
    assert "payments (grant" in row and "provider_confirmed" in row and "stripe:re_3" in row
    assert "evidence beyond the grant" in row
    rogue = html[html.index("<code>rogue:1</code>") :]
    assert "happened with no grant" in rogue[: rogue.index("</tr>")]
    denied = html[html.index("<code>denied:1</code>") :]
    assert "denied (kind)" in denied[: denied.index("</tr>")]


def test_every_ungranted_effect_is_in_the_report_with_no_case_behind_it(project, alice):
    for n in range(3):
        ledger.intent(project, f"email:{n}", kind="email", authority=None)
    ledger.receipt(project, "email:0", "mail_0")
    assert not LedgerCase.objects.exists()  # the default audit policy opens none
    html = logged_in(alice).get(PAGE).content.decode()
    assert _counts(html)["evidence_unauthorized"] == 1
    assert _counts(html)["denied_unattempted"] == 2
    assert sorted(_keys(html)) == ["email:0", "email:1", "email:2"]
    assert html.count("no grant (audit policy)") == 3
    assert "happened with no grant" in html


def test_the_time_range_and_filters_narrow_every_number(project, alice, week):
    client = logged_in(alice)
    since = (timezone.now() - timedelta(days=40)).strftime("%Y-%m-%dT%H:%M")
    wide = _counts(client.get(PAGE, {"since": since}).content.decode())
    assert wide["authorized_waiting"] == week["authorized_waiting"] + 1
    only_email = _counts(client.get(PAGE, {"kind": "email"}).content.decode())
    # Orphan receipts have no kind, so a kind filter leaves them out.
    assert only_email == {
        "authorized_evidence": 0,
        "authorized_waiting": 0,
        "evidence_unauthorized": 0,
        "denied_unattempted": 1,
    }


def test_the_csv_holds_exactly_the_rows_and_columns_on_screen(project, alice, week):
    client = logged_in(alice)
    params = {"quadrant": "denied_unattempted"}
    html = client.get(PAGE, params).content.decode()
    response = client.get("/authority/audit.csv", {**params, "page": "1"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.getvalue().decode())))
    header = re.findall(r"<th>([^<]+)</th>", html[html.index('class="list authority-audit"') :])
    assert rows[0] == header[: len(rows[0])]
    assert [r[1] for r in rows[1:]] == _keys(html)
    mismatch, authority = rows[0].index("mismatch"), rows[0].index("authority")
    assert {r[mismatch] for r in rows[1:]} == {""}
    assert "big (grant" in {r[1]: r[authority] for r in rows[1:]}["asked:1"]


def test_no_cell_of_the_csv_opens_as_a_formula_in_a_spreadsheet(project, alice):
    # An agent chooses its keys and targets: a spreadsheet would run these as formulas.
    hostile = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]
    for n, text in enumerate(hostile):
        ledger.intent(project, text, target=f"{text}:{n}", authority=None)
    response = logged_in(alice).get("/authority/audit.csv")
    rows = list(csv.reader(io.StringIO(response.getvalue().decode())))
    keys = {r[1] for r in rows[1:]}
    assert keys == {"'" + text for text in hostile}
    assert {r[3] for r in rows[1:]} == {f"'{text}:{n}" for n, text in enumerate(hostile)}
    for row in rows:
        assert not any(value.startswith(("=", "+", "-", "@", "\t", "\r")) for value in row)


def test_the_page_costs_the_same_queries_for_ten_effects_or_a_hundred(project, alice):
    g = grant(project, kinds=["*"])
    client = logged_in(alice)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(PAGE).status_code == 200
        return len(ctx.captured_queries)

    for n in range(10):
        ledger.intent(project, f"a{n}", **under(g))
        ledger.receipt(project, f"a{n}", f"re_{n}")
    few = queries()
    for n in range(10, 100):
        ledger.intent(project, f"a{n}", **under(g))
        ledger.receipt(project, f"a{n}", f"re_{n}")
    assert queries() == few


def test_a_viewer_reads_the_report_and_a_stranger_cannot(project, viewer, mallory, outsider, week):
    assert logged_in(viewer).get(PAGE).status_code == 200
    # In no project: the landing page, for the page and its CSV alike.
    for path in (PAGE, "/authority/audit.csv"):
        r = logged_in(mallory).get(path)
        assert r.status_code == 200 and b"not a member of any project" in r.content
    # With a project of their own: theirs, with none of this project's effects.
    r = logged_in(outsider).get("/authority/audit.csv")
    assert r.status_code == 200 and len(r.getvalue().decode().splitlines()) == 1


def test_amounts_are_shown_as_recorded(project, alice):
    g = grant(project, currency="EUR", max_amount="100")
    ledger.intent(project, "k1", **under(g, "12.50"))
    assert Effect.objects.get().amount == Decimal("12.5")
    assert "12.50 EUR" in logged_in(alice).get(PAGE).content.decode()
    assert not Receipt.objects.exists()


def test_older_effects_open_as_the_next_page_keeping_the_filter(project, alice):
    Effect.objects.bulk_create(
        Effect(project=project, key=f"k{i:03}", kind="payment", target="stripe", fingerprint="f")
        for i in range(PAGE_SIZE + 1)
    )
    client = logged_in(alice)
    first = client.get(PAGE, {"kind": "payment"}).content.decode()
    link = re.search(r'<tr class="more">\s*<td[^>]*><a href="\?([^"]+)"([^>]*)>', first)
    assert link is not None and "hx-get" not in link.group(2)
    params = link.group(1).replace("&amp;", "&")
    assert "kind=payment" in params and params.count("before=") == 1
    second = client.get(f"{PAGE}?{params}").content.decode()
    assert "k000" in second and "k100" not in second
    again = re.search(r'<tr class="more">', second)
    assert again is None


def test_the_quadrants_count_the_same_from_the_hourly_tallies(project, alice, week):
    client = logged_in(alice)
    for hours_ago, key in ((3, "ok:1"), (30, "waiting:1"), (100, "rogue:2"), (150, "asked:1")):
        then = timezone.now() - timedelta(hours=hours_ago)
        Effect.objects.filter(key=key).update(created=then)
    since = (timezone.now() - timedelta(days=40)).strftime("%Y-%m-%dT%H:%M")
    views = [{}, {"since": since}, {"kind": "payment"}, {"quadrant": "authorized_waiting"}]

    def counted() -> list[dict[str, int]]:
        return [_counts(client.get(PAGE, view).content.decode()) for view in views]

    live = counted()
    assert live[0] == week
    tallies.projects_tally()
    assert counted() == live
    # Evidence for an effect of an hour already tallied counts once the job runs again.
    ledger.receipt(project, "waiting:1", "re_late")
    tallies.projects_tally()
    assert counted()[0] == week | {"authorized_evidence": 4, "authorized_waiting": 0}
    tallies.projects_tally()
    assert counted()[0]["authorized_evidence"] == 4


def test_the_page_and_every_row_exports_download_under_different_names(project, alice, week):
    client = logged_in(alice)
    params = {"quadrant": "denied_unattempted"}
    page = client.get("/authority/audit.csv", {**params, "page": "1"})["Content-Disposition"]
    every = client.get("/authority/audit.csv", params)["Content-Disposition"]
    later = client.get("/authority/audit.csv", {**params, "page": "1", "before": "99"})
    assert page != every != later["Content-Disposition"] != page
    assert page.endswith('-denied-unattempted-page-1.csv"')
    assert every.endswith('-denied-unattempted-all.csv"')
    assert later["Content-Disposition"].endswith('-page-before-99.csv"')
