"""POST /api/v1/intents: recording an intent and the decision it gets."""

from __future__ import annotations

from durability.ledger.intents import fingerprint_of
from durability.models import Attempt, Case, Effect


def test_a_new_intent_creates_the_effect_and_answers_proceed(api):
    r = api.intent("refund:1", timeout_s=30, run_id="run-1")
    assert r.status_code == 201
    body = r.json()
    assert body["decision"] == "proceed"
    assert body["effect"]["key"] == "refund:1"
    assert body["effect"]["state"] == "pending"
    assert body["effect"]["attempt"] == 1
    assert body["effect"]["deadline"] is not None
    assert body["effect"]["url"].endswith(f"/effects/{body['effect']['id']}/")
    assert body["receipt"] is None and body["case"] is None
    assert body["reason"]
    assert Attempt.objects.filter(effect_id=body["effect"]["id"], number=1).exists()


def test_the_fingerprint_is_sha256_of_the_canonical_request(api):
    request = {"b": [1, 2], "a": "é"}
    body = api.intent("k", request=request).json()
    assert body["effect"]["fingerprint"] == fingerprint_of({"a": "é", "b": [1, 2]})
    assert len(body["effect"]["fingerprint"]) == 64


def test_the_clients_fingerprint_wins_over_the_request(api):
    body = api.intent("k", fingerprint="client-fp").json()
    assert body["effect"]["fingerprint"] == "client-fp"


def test_asking_again_while_pending_answers_wait_without_a_new_attempt(api):
    api.intent("k")
    r = api.intent("k")
    assert r.status_code == 200
    assert r.json()["decision"] == "wait"
    assert Effect.objects.get(key="k").attempt_count == 1


def test_a_completed_effect_answers_completed_with_its_receipt(api):
    api.intent("k")
    api.receipt("k", "re_1")
    body = api.intent("k").json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == "re_1"


def test_the_same_key_with_another_request_is_a_conflict_and_opens_a_case(api):
    api.intent("k", request={"amount": 1})
    r = api.intent("k", request={"amount": 2})
    assert r.status_code == 409
    body = r.json()
    assert body["decision"] == "conflict"
    assert body["case"]["reason"] == "key_reuse_conflict"
    assert Effect.objects.get(key="k").state == "pending"
    assert Case.objects.filter(reason="key_reuse_conflict", closed=None).count() == 1


def test_links_use_the_address_asked_at_unless_site_url_is_set(api, settings):
    assert api.intent("k1").json()["effect"]["url"].startswith("http://testserver/effects/")

    settings.SITE_URL, settings.SITE_URL_CONFIGURED = "https://desk.example", True

    assert api.intent("k2").json()["effect"]["url"].startswith("https://desk.example/effects/")
