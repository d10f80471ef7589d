"""Signed provider webhooks: verified deliveries become provider-confirmed receipts;
anything unverified changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from durability.api.webhooks import Rejected, signature_of, verify
from durability.models import (
    Case,
    Effect,
    Reason,
    Receipt,
    State,
    Strength,
    WebhookDelivery,
    WebhookKind,
    WebhookSource,
)
from tests.api.support import signed
from tests.authority.support import grant, under
from tests.ledger import support as ledger
from tests.ledger.test_concurrency import in_threads


def _refund(key: str = "refund:1", charge: str = "re_1", cents: Any = 1250) -> dict[str, Any]:
    return {
        "id": "evt_1",
        "created": 1_760_000_000,
        "data": {
            "object": {
                "id": charge,
                "amount": cents,
                "currency": "eur",
                "metadata": {"tallybook_key": key},
            }
        },
    }


def _post(
    client: Client,
    source: WebhookSource,
    payload: Any,
    *,
    delivery: str = "d-1",
    skew: int = 0,
    secret: str | None = None,
) -> Any:
    body = json.dumps(payload).encode()
    stamp = str(int(time.time()) + skew)
    return client.post(
        f"/hooks/{source.name}/",
        data=body,
        content_type="application/json",
        headers=signed(body, stamp, secret or source.secret, delivery),
    )


def _push(client: Client, source: WebhookSource, commits: list[Any], **headers: str) -> Any:
    body = json.dumps(
        {
            "ref": "refs/heads/main",
            "repository": {"full_name": "acme/shop"},
            "commits": commits,
        }
    ).encode()
    return client.post(
        f"/hooks/{source.name}/",
        data=body,
        content_type="application/json",
        headers={
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": "gh-1",
            "X-Hub-Signature-256": signature_of(source.secret, body),
            **headers,
        },
    )


def _commit(sha: str, key: str | None) -> dict[str, Any]:
    message = "Fix the checkout" + (f"\n\nTallybook-Key: {key}\n" if key else "")
    return {
        "id": sha,
        "message": message,
        "timestamp": "2025-10-09T10:00:00+02:00",
        "url": f"https://github.com/acme/shop/commit/{sha}",
    }


def test_a_signed_delivery_settles_a_pending_effect_with_provider_confirmed_evidence(
    client, project, stripe
):
    ledger.intent(project, "refund:1")
    response = _post(client, stripe, _refund())
    assert response.status_code == 201
    body = response.json()
    assert body["duplicate"] is False
    assert body["receipts"][0]["effect"]["state"] == "succeeded"
    receipt = Receipt.objects.get()
    assert (receipt.system, receipt.external_id) == ("stripe", "re_1")
    assert receipt.strength == Strength.PROVIDER_CONFIRMED
    assert str(receipt.amount) == "12.500000" and receipt.currency == "EUR"
    assert receipt.observed_at is not None
    assert receipt.observed_at.timestamp() == 1_760_000_000
    assert receipt.data == {"source": "alpha-stripe", "delivery": "d-1"}


def test_a_delivery_settles_an_uncertain_effect_as_a_late_success(client, project, stripe):
    ledger.intent(project, "refund:1")
    ledger.timeout(project, "refund:1")
    _post(client, stripe, _refund())
    effect = Effect.objects.get()
    assert effect.state == State.SUCCEEDED and effect.late
    open_reasons = set(Case.objects.filter(closed=None).values_list("reason", flat=True))
    assert Reason.UNCERTAIN not in open_reasons and Reason.LATE_SUCCESS in open_reasons


def test_a_provider_confirming_an_agents_receipt_makes_that_evidence_stronger(
    client, project, stripe
):
    ledger.intent(project, "refund:1")
    ledger.receipt(project, "refund:1", "re_1")
    response = _post(client, stripe, _refund())
    assert response.json()["receipts"][0]["created"] is False
    assert Receipt.objects.get().strength == Strength.PROVIDER_CONFIRMED
    assert not Case.objects.filter(reason=Reason.DUPLICATE_EFFECT).exists()


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ({"secret": "not-the-secret"}, "Bad signature"),
        # An hour out: the server's clock cannot move it into the 300 s window before the
        # test's timeout. The window's edges are tested against a fixed clock below.
        ({"skew": -3600}, "replay window"),
        ({"skew": 3600}, "replay window"),
    ],
    ids=["bad-signature", "stale", "from-the-future"],
)
def test_an_unverified_delivery_is_a_401_and_changes_nothing(
    client, project, stripe, tamper, message
):
    ledger.intent(project, "refund:1")
    before = ledger.row_counts()
    response = _post(client, stripe, _refund(), **tamper)
    assert response.status_code == 401
    assert message in response.json()["error"]
    assert ledger.row_counts() == before


# Late in its second: the window counts whole seconds, as the signed timestamp does.
NOW = 1_760_000_000.9


@pytest.mark.parametrize("skew", [-300, 300], ids=["oldest", "newest"])
def test_a_delivery_signed_up_to_the_tolerance_away_is_inside_the_replay_window(stripe, skew):
    body = json.dumps(_refund()).encode()
    headers = signed(body, str(int(NOW) + skew), stripe.secret)
    assert verify(stripe, headers, body, NOW).delivery == "d-1"


@pytest.mark.parametrize("skew", [-301, 301], ids=["stale", "from-the-future"])
def test_a_delivery_signed_a_second_beyond_the_tolerance_is_a_401(stripe, skew):
    body = json.dumps(_refund()).encode()
    headers = signed(body, str(int(NOW) + skew), stripe.secret)
    with pytest.raises(Rejected, match="replay window") as rejected:
        verify(stripe, headers, body, NOW)
    assert rejected.value.status == 401


def test_a_delivery_without_a_timestamp_or_signature_is_a_401(client, stripe):
    body = json.dumps(_refund()).encode()
    for headers in ({}, {"X-Tallybook-Timestamp": str(int(time.time()))}):
        response = client.post(
            f"/hooks/{stripe.name}/", data=body, content_type="application/json", headers=headers
        )
        assert response.status_code == 401
    assert not Receipt.objects.exists()


def test_the_signature_covers_the_timestamp_so_a_capture_cannot_be_replayed_later(
    client, project, stripe
):
    body = json.dumps(_refund()).encode()
    old = str(int(time.time()) - 3600)
    response = client.post(
        f"/hooks/{stripe.name}/",
        data=body,
        content_type="application/json",
        headers={
            "X-Tallybook-Signature": signature_of(stripe.secret, body, old),
            "X-Tallybook-Timestamp": str(int(time.time())),
        },
    )
    assert response.status_code == 401
    assert not Receipt.objects.exists()


def test_a_delivery_id_seen_before_is_a_no_op(client, project, stripe):
    ledger.intent(project, "refund:1")
    assert _post(client, stripe, _refund()).status_code == 201
    before = ledger.row_counts()
    replay = _post(client, stripe, _refund(charge="re_other"))
    assert replay.status_code == 200
    assert replay.json() == {"delivery": "d-1", "duplicate": True, "receipts": [], "ignored": 0}
    assert ledger.row_counts() == before


def test_a_secret_in_a_delivery_id_is_stored_and_answered_as_its_digest(client, project, stripe):
    ledger.intent(project, "refund:1")
    ledger.intent(project, "refund:2")
    first = _post(client, stripe, _refund(), delivery="d:token=abc123")
    assert first.status_code == 201
    shown = first.json()["delivery"]
    assert "abc123" not in shown and shown.startswith("d:token=[REDACTED:")
    assert list(WebhookDelivery.objects.values_list("delivery_id", flat=True)) == [shown]
    # The provider's own retry is found by its stored id; another short secret is another
    # delivery.
    again = _post(client, stripe, _refund(charge="re_other"), delivery="d:token=abc123")
    assert again.status_code == 200 and again.json()["delivery"] == shown
    other = _post(client, stripe, _refund("refund:2", "re_2"), delivery="d:token=xyz789")
    assert other.status_code == 201 and other.json()["delivery"] != shown
    stored = json.dumps(list(WebhookDelivery.objects.values()), default=str)
    stored += json.dumps(list(Receipt.objects.values()), default=str)
    assert "abc123" not in stored and "xyz789" not in stored
    assert WebhookDelivery.objects.count() == 2


def test_a_secret_in_a_github_delivery_id_is_stored_and_answered_as_its_digest(
    client, project, github
):
    ledger.intent(project, "fix:42")
    secret = "ghp_" + "Q" * 36
    response = _push(client, github, [_commit("a" * 40, "fix:42")], **{"X-GitHub-Delivery": secret})
    assert response.status_code == 201
    assert secret not in response.content.decode()
    (delivery,) = WebhookDelivery.objects.values_list("delivery_id", flat=True)
    assert delivery == response.json()["delivery"] and secret not in delivery
    assert secret not in json.dumps(list(Receipt.objects.values()), default=str)


def test_an_unknown_or_disabled_source_is_a_404(client, project, stripe):
    ghost = WebhookSource(name="ghost", secret="s", kind=WebhookKind.GENERIC)
    assert _post(client, ghost, _refund()).status_code == 404
    WebhookSource.objects.filter(pk=stripe.pk).update(enabled=False)
    assert _post(client, stripe, _refund()).status_code == 404
    assert not Receipt.objects.exists()


def test_a_payload_the_mapping_cannot_read_is_a_422_and_stores_nothing(client, project, stripe):
    payload = _refund()
    del payload["data"]["object"]["metadata"]
    before = ledger.row_counts()
    response = _post(client, stripe, payload)
    assert response.status_code == 422
    # Named by its path in the payload, what the provider knows.
    assert "data.object.metadata.tallybook_key" in response.json()["fields"]
    assert ledger.row_counts() == before


def test_evidence_for_a_key_no_intent_named_is_an_orphan_not_yet_unauthorized(
    client, project, stripe
):
    body = _post(client, stripe, _refund()).json()
    assert body["receipts"][0]["case"]["reason"] == "orphan_receipt"
    assert not Case.objects.filter(reason=Reason.UNAUTHORIZED_EFFECT).exists()


def test_evidence_for_an_effect_with_no_grant_opens_no_case_under_the_audit_policy(
    client, project, stripe
):
    ledger.intent(project, "refund:1", authority=None)
    body = _post(client, stripe, _refund()).json()
    assert body["receipts"][0]["case"] is None
    assert not Case.objects.exists()


def test_evidence_for_an_effect_with_no_grant_is_unauthorized_when_cases_are_asked_for(
    client, project, stripe
):
    ledger.cases_asked(project)
    ledger.intent(project, "refund:1", authority=None)
    body = _post(client, stripe, _refund()).json()
    case = Case.objects.get(reason=Reason.UNAUTHORIZED_EFFECT)
    assert body["receipts"][0]["case"]["id"] == case.pk
    # The audit_cases policy's flag on the intent, raised now that it has happened.
    assert case.get_severity_display() == "high"
    assert case.detail["repeats"] == [{"evidence": Receipt.objects.get().pk}]


def test_an_amount_beyond_the_grant_is_authority_exceeded(client, project, stripe):
    g = grant(project, currency="EUR", max_amount="10")
    ledger.intent(project, "refund:1", **under(g, "9.00"))
    _post(client, stripe, _refund(cents=1250))
    case = Case.objects.get(reason=Reason.AUTHORITY_EXCEEDED)
    assert case.get_severity_display() == "critical"
    assert "12.50 EUR is over the grant's 10.00 EUR per effect" in case.summary
    assert "more than the 9.00 EUR the intent asked for" in case.summary
    assert Effect.objects.get().state == State.SUCCEEDED


def test_evidence_within_the_grant_opens_no_case(client, project, stripe):
    g = grant(project, currency="EUR", max_amount="20")
    ledger.intent(project, "refund:1", **under(g, "12.50"))
    _post(client, stripe, _refund(cents=1250))
    assert not Case.objects.exists()


def test_a_github_push_records_each_keyed_commit_as_a_receipt(client, project, github):
    g = grant(project, targets=["acme/*"])
    ledger.intent(project, "fix:42", kind="git.push", target="acme/shop", **under(g))
    response = _push(client, github, [_commit("a" * 40, "fix:42"), _commit("b" * 40, None)])
    assert response.status_code == 201
    assert response.json()["ignored"] == 1
    receipt = Receipt.objects.get()
    assert (receipt.key, receipt.system, receipt.external_id) == ("fix:42", "github", "a" * 40)
    assert receipt.target == "acme/shop" and receipt.strength == Strength.PROVIDER_CONFIRMED
    assert receipt.data is not None and receipt.data["url"].endswith("a" * 40)
    assert Effect.objects.get().state == State.SUCCEEDED
    assert not Case.objects.exists()


def test_a_push_to_a_repository_outside_the_grant_is_authority_exceeded(client, project, github):
    g = grant(project, targets=["acme/docs"])
    ledger.intent(project, "fix:42", target="acme/docs", **under(g))
    _push(client, github, [_commit("a" * 40, "fix:42")])
    case = Case.objects.get(reason=Reason.AUTHORITY_EXCEEDED)
    assert "landed on 'acme/shop', outside the grant's targets" in case.summary


def test_a_github_delivery_with_a_bad_signature_or_seen_before_changes_nothing(
    client, project, github
):
    ledger.intent(project, "fix:42")
    before = ledger.row_counts()
    bad = _push(
        client, github, [_commit("a" * 40, "fix:42")], **{"X-Hub-Signature-256": "sha256=0"}
    )
    assert bad.status_code == 401
    assert ledger.row_counts() == before
    assert _push(client, github, [_commit("a" * 40, "fix:42")]).status_code == 201
    again = _push(client, github, [_commit("c" * 40, "fix:42")])
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert Receipt.objects.count() == 1


def test_other_github_events_are_acknowledged_without_receipts(client, project, github):
    response = _push(client, github, [_commit("a" * 40, "fix:42")], **{"X-GitHub-Event": "ping"})
    assert response.status_code == 201
    assert response.json()["receipts"] == []
    assert not Receipt.objects.exists()


# --- Replays: what is deduplicated is the signed content, whatever the headers say.


def test_a_captured_delivery_replayed_in_the_window_under_a_new_delivery_id_stores_nothing(
    client, project, stripe
):
    ledger.intent(project, "refund:1")
    body = json.dumps(_refund()).encode()
    headers = signed(body, str(int(time.time())), stripe.secret, delivery="d-1")
    url = f"/hooks/{stripe.name}/"
    assert client.post(url, body, "application/json", headers=headers).status_code == 201
    before = ledger.row_counts()
    replay = client.post(
        url, body, "application/json", headers={**headers, "X-Tallybook-Delivery": "d-2"}
    )
    assert replay.status_code == 200
    assert replay.json() == {"delivery": "d-2", "duplicate": True, "receipts": [], "ignored": 0}
    assert ledger.row_counts() == before


def test_a_captured_github_push_replayed_later_under_a_new_delivery_id_stores_nothing(
    client, project, github
):
    ledger.intent(project, "fix:42")
    assert _push(client, github, [_commit("a" * 40, "fix:42")]).status_code == 201
    before = ledger.row_counts()
    # GitHub signs no timestamp: the same bytes are valid for ever, under any headers.
    replay = _push(
        client,
        github,
        [_commit("a" * 40, "fix:42")],
        **{"X-GitHub-Delivery": "gh-2", "X-GitHub-Event": "push"},
    )
    assert replay.status_code == 200 and replay.json()["duplicate"] is True
    assert ledger.row_counts() == before


def test_a_replay_is_answered_as_received_already_even_under_headers_that_would_not_map(
    client, project, github
):
    # GitHub does not sign its event header: a captured ping sent again as a push.
    ping = _push(client, github, [None], **{"X-GitHub-Event": "ping"})
    assert ping.status_code == 201
    before = ledger.row_counts()
    replay = _push(client, github, [None], **{"X-GitHub-Delivery": "gh-2"})
    assert replay.status_code == 200
    assert replay.json() == {"delivery": "gh-2", "duplicate": True, "receipts": [], "ignored": 0}
    assert ledger.row_counts() == before


def test_the_providers_own_retry_under_a_fresh_timestamp_is_a_duplicate_by_its_delivery_id(
    client, project, stripe
):
    ledger.intent(project, "refund:1")
    assert _post(client, stripe, _refund(), delivery="evt_1").status_code == 201
    before = ledger.row_counts()
    retry = _post(client, stripe, _refund(), delivery="evt_1", skew=-10)
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    assert ledger.row_counts() == before


def test_the_same_body_signed_at_another_time_under_another_delivery_id_is_a_new_delivery(
    client, project, stripe
):
    # Two events of the provider may carry the same body; their signed bytes differ.
    assert _post(client, stripe, _refund(), delivery="d-1").status_code == 201
    again = _post(client, stripe, _refund(), delivery="d-2", skew=-10)
    assert again.status_code == 201 and again.json()["duplicate"] is False


# --- Odd input: refused with a 4xx naming what is wrong, and nothing stored.


def _signed_post(client: Client, source: WebhookSource, body: bytes, stamp: str) -> Any:
    return client.post(
        f"/hooks/{source.name}/",
        data=body,
        content_type="application/json",
        headers=signed(body, stamp, source.secret),
    )


@pytest.mark.parametrize(
    "stamp", ["¹⁷⁶⁰⁰⁰⁰⁰⁰⁰", "1" * 5000, "", "-1", " 1760000000", "1760000000.5"]
)
def test_a_timestamp_header_that_is_not_plain_decimal_digits_is_a_401_even_when_signed(
    client, project, stripe, stamp
):
    before = ledger.row_counts()
    response = _signed_post(client, stripe, json.dumps(_refund()).encode(), stamp)
    assert response.status_code == 401
    assert "X-Tallybook-Timestamp" in response.json()["error"]
    assert ledger.row_counts() == before


@pytest.mark.parametrize(
    ("created", "message"),
    [
        (1e20, "out of range"),
        (-1e20, "out of range"),
        (10**30, "out of range"),
        (True, "Unix seconds"),
        ([1_760_000_000], "Unix seconds"),
        (946_684_799, "must lie between"),
        ("9999-12-31T23:59:59-23:59", "out of range"),
        ("0001-01-01T00:00:00+23:59", "out of range"),
        ("2025-10-09T25:00:00", "ISO 8601"),
    ],
    ids=[
        "1e20",
        "-1e20",
        "10**30",
        "bool",
        "list",
        "1999",
        "year-10000-in-utc",
        "year-0-in-utc",
        "hour-25",
    ],
)
def test_an_observed_time_out_of_range_or_of_the_wrong_type_is_a_422_naming_its_path(
    client, project, stripe, created, message
):
    ledger.intent(project, "refund:1")
    before = ledger.row_counts()
    response = _post(client, stripe, {**_refund(), "created": created})
    assert response.status_code == 422
    assert message in response.json()["fields"]["created"]
    assert ledger.row_counts() == before


def test_an_observed_time_is_stored_in_utc(client, project, stripe):
    ledger.intent(project, "refund:1")
    _post(client, stripe, {**_refund(), "created": "2025-10-09T23:30:00-23:00"})
    observed = Receipt.objects.get().observed_at
    assert observed is not None and observed.isoformat() == "2025-10-10T22:30:00+00:00"


def test_a_commit_time_out_of_range_is_a_422_naming_the_commit_and_stores_no_receipt(
    client, project, github
):
    ledger.intent(project, "fix:1")
    ledger.intent(project, "fix:2")
    before = ledger.row_counts()
    response = _push(
        client,
        github,
        [_commit("a" * 40, "fix:1"), {**_commit("b" * 40, "fix:2"), "timestamp": 1e20}],
    )
    assert response.status_code == 422
    assert "out of range" in response.json()["fields"]["commits.1.timestamp"]
    # All or nothing: the good commit of the same push is not recorded either.
    assert ledger.row_counts() == before


@pytest.mark.parametrize(
    ("cents", "message"),
    [
        ("1e999999999", "digits"),
        ("1e-999999999", "decimals"),
        ("Infinity", "number"),
        ("NaN", "number"),
        ({"value": 1}, "number"),
        (True, "number"),
    ],
    ids=["huge-exponent", "tiny-exponent", "infinity", "nan", "object", "bool"],
)
def test_an_amount_that_is_not_a_storable_sum_is_a_422_naming_its_path(
    client, project, stripe, cents, message
):
    ledger.intent(project, "refund:1")
    before = ledger.row_counts()
    response = _post(client, stripe, _refund(cents=cents))
    assert response.status_code == 422
    assert message in response.json()["fields"]["data.object.amount"]
    assert ledger.row_counts() == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"id": "evt_1", "id": "evt_2"}', "duplicate key"),
        (b"[" * 10_000 + b"]" * 10_000, "nested deeper"),
        (b'{"created": NaN}', "NaN is not JSON"),
        (b'{"id": "\xff"}', "UTF-8"),
    ],
    ids=["duplicate-key", "deep", "nan", "not-utf-8"],
)
def test_a_signed_body_that_is_not_plain_json_is_a_400_and_stores_nothing(
    client, project, stripe, body, message
):
    before = ledger.row_counts()
    response = _signed_post(client, stripe, body, str(int(time.time())))
    assert response.status_code == 400
    assert message in response.json()["fields"]["body"]
    assert ledger.row_counts() == before


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("metadata", {"tallybook_key": "refund:\x00"}, "data.object.metadata.tallybook_key"),
        ("metadata", {"tallybook_key": "refund:\ud800"}, "data.object.metadata.tallybook_key"),
        ("id", "re_\udc00", "data.object.id"),
        ("id", {"nested": "id"}, "data.object.id"),
    ],
    ids=["nul-key", "surrogate-key", "surrogate-id", "object-id"],
)
def test_a_mapped_text_postgresql_cannot_store_is_a_422_naming_its_path(
    client, project, stripe, path, value, field
):
    payload = _refund()
    payload["data"]["object"][path] = value
    before = ledger.row_counts()
    response = _post(client, stripe, payload)
    assert response.status_code == 422
    assert field in response.json()["fields"]
    assert ledger.row_counts() == before


@pytest.mark.parametrize(
    ("commit", "field"),
    [
        ({"url": "https://github.com/\ud800"}, "commits.0.url"),
        ({"url": "https://github.com/\x00"}, "commits.0.url"),
        ({"id": 42}, "commits.0.id"),
        ({"message": "Fix\n\nTallybook-Key: " + "k" * 300}, "commits.0.message"),
    ],
    ids=["surrogate-url", "nul-url", "numeric-id", "key-too-long"],
)
def test_a_commit_that_does_not_map_to_a_storable_receipt_is_a_422_naming_its_path(
    client, project, github, commit, field
):
    before = ledger.row_counts()
    response = _push(client, github, [{**_commit("a" * 40, "fix:42"), **commit}])
    assert response.status_code == 422
    assert field in response.json()["fields"]
    assert ledger.row_counts() == before


@pytest.mark.parametrize("delivery", ["d-\x00", "d-" + "x" * 300], ids=["nul", "too-long"])
def test_a_delivery_id_that_cannot_be_stored_is_a_400_naming_the_header(
    client, project, stripe, delivery
):
    before = ledger.row_counts()
    response = _post(client, stripe, _refund(), delivery=delivery)
    assert response.status_code == 400
    assert "X-Tallybook-Delivery" in response.json()["fields"]
    assert ledger.row_counts() == before


def test_a_trailer_with_a_long_run_of_spaces_inside_is_answered_without_backtracking(
    client, project, github
):
    # A regular expression that backtracked over the spaces took the square of the line's
    # length: this 900 kB commit message held a web worker for half an hour.
    message = "Fix\n\nTallybook-Key: fix:42" + " " * 900_000 + "!\n"
    response = _push(client, github, [{**_commit("a" * 40, None), "message": message}])
    assert response.status_code == 422
    assert "at most 255 characters" in response.json()["fields"]["commits.0.message"]


@pytest.mark.usefixtures("transactional_db")
def test_one_delivery_sent_at_once_under_ten_delivery_ids_is_received_once(project, stripe):
    ledger.intent(project, "refund:1")
    body = json.dumps(_refund()).encode()
    stamp = str(int(time.time()))

    def send(i: int) -> int:
        headers = signed(body, stamp, stripe.secret, delivery=f"d-{i}")
        response = Client().post(
            f"/hooks/{stripe.name}/", body, "application/json", headers=headers
        )
        return int(response.status_code)

    assert sorted(in_threads(10, send)) == [200] * 9 + [201]
    assert WebhookDelivery.objects.count() == 1 and Receipt.objects.count() == 1
