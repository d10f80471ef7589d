"""Concurrent writers on PostgreSQL: real threads, each with its own connection."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from durability.audit import first_broken_entry
from durability.models import Attempt, Case, Effect, Project, Receipt

pytestmark = pytest.mark.usefixtures("transactional_db")

INTENT = {"key": "k1", "kind": "payment", "target": "stripe", "request": {"amount": 1}}


def in_threads(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run work(0..n-1) in n threads released at the same moment; their results in order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a writer did not return"
    assert not errors, errors
    return results


def poster(key: str) -> Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]:
    def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = Client().post(
            f"/api/v1/{path}",
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        return r.status_code, r.json()

    return post


def test_fifty_concurrent_intents_for_one_key_give_exactly_one_proceed(project, api_key):
    post = poster(api_key)
    answers = in_threads(50, lambda i: post("intents", INTENT))
    statuses = Counter(status for status, _ in answers)
    decisions = Counter(body["decision"] for _, body in answers)
    assert statuses == {201: 1, 200: 49}
    assert decisions == {"proceed": 1, "wait": 49}
    assert Effect.objects.count() == 1
    assert Attempt.objects.count() == 1
    assert {body["effect"]["id"] for _, body in answers} == {Effect.objects.get().pk}
    assert first_broken_entry(project) is None


def test_concurrent_intents_from_one_worker_all_carry_on_with_one_attempt(project, api_key):
    post = poster(api_key)
    answers = in_threads(20, lambda i: post("intents", {**INTENT, "run_id": "r", "worker": "w"}))
    assert Counter(body["decision"] for _, body in answers) == {"proceed": 20}
    assert Attempt.objects.count() == 1
    assert not Case.objects.exists()


def test_concurrent_intents_on_many_keys_each_create_their_effect(project, api_key):
    post = poster(api_key)
    answers = in_threads(40, lambda i: post("intents", {**INTENT, "key": f"k{i % 10}"}))
    assert Counter(status for status, _ in answers) == {201: 10, 200: 30}
    assert Effect.objects.count() == 10
    assert Attempt.objects.count() == 10
    assert first_broken_entry(project) is None


def test_concurrent_retries_after_a_failure_make_exactly_one_new_attempt(project, api_key):
    post = poster(api_key)
    post("intents", INTENT)
    post("failures", {"key": "k1", "error": "HTTP 502", "definitive": True})
    answers = in_threads(20, lambda i: post("intents", INTENT))
    assert Counter(body["decision"] for _, body in answers) == {"proceed": 1, "wait": 19}
    assert Attempt.objects.count() == 2
    assert first_broken_entry(project) is None


def test_the_same_receipt_sent_concurrently_is_stored_once(project, api_key):
    post = poster(api_key)
    post("intents", INTENT)
    receipt = {"key": "k1", "system": "stripe", "external_id": "re_1"}
    answers = in_threads(20, lambda i: post("receipts", receipt))
    assert Counter(status for status, _ in answers) == {201: 1, 200: 19}
    assert Receipt.objects.count() == 1
    assert Effect.objects.get().state == "succeeded"
    assert not Case.objects.exists()
    assert first_broken_entry(project) is None


def test_different_receipts_sent_concurrently_open_one_duplicate_case(project, api_key):
    post = poster(api_key)
    post("intents", INTENT)
    answers = in_threads(
        10, lambda i: post("receipts", {"key": "k1", "system": "stripe", "external_id": f"re_{i}"})
    )
    assert Counter(status for status, _ in answers) == {201: 10}
    assert Receipt.objects.count() == 10
    assert Effect.objects.get().state == "succeeded"
    duplicate = Case.objects.get(reason="duplicate_effect")
    assert len(duplicate.detail.get("repeats", [])) == 8
    assert first_broken_entry(project) is None


def test_the_same_orphan_receipt_sent_concurrently_is_stored_once(project, api_key):
    post = poster(api_key)
    receipt = {"key": "unknown", "system": "stripe", "external_id": "re_1"}
    answers = in_threads(20, lambda i: post("receipts", receipt))
    assert Counter(status for status, _ in answers) == {201: 1, 200: 19}
    assert Receipt.objects.count() == 1
    assert Case.objects.filter(reason="orphan_receipt").count() == 1
    assert first_broken_entry(project) is None


def test_an_intent_and_its_receipt_racing_always_end_succeeded(project, api_key):
    post = poster(api_key)
    keys = [f"race-{i}" for i in range(15)]

    def work(i: int) -> tuple[int, dict[str, Any]]:
        key = keys[i // 2]
        if i % 2:
            return post("receipts", {"key": key, "system": "stripe", "external_id": key})
        return post("intents", {**INTENT, "key": key})

    in_threads(2 * len(keys), work)
    assert dict(Effect.objects.values_list("key", "state")) == dict.fromkeys(keys, "succeeded")
    assert not Receipt.objects.filter(effect=None).exists()
    assert not Case.objects.filter(reason="orphan_receipt", closed=None).exists()
    assert first_broken_entry(Project.objects.get()) is None
