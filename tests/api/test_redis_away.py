"""Redis is never on the synchronous write path: with Redis away, intents and receipts are
committed and answered truthfully, and the scheduled passes put right the jobs they could
not enqueue."""

from __future__ import annotations

import logging
import socket

import pytest

from durability.models import Effect, Receipt, State
from durability.settings import redis_url_bounded
from trajectories import links
from trajectories.models import EffectLink


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_away(settings):
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    settings.REDIS_URL = url
    settings.RQ_QUEUES = {name: {**queue, "URL": url} for name, queue in settings.RQ_QUEUES.items()}


# Committed for real: the link job is enqueued after the commit, inside the request.
pytestmark = pytest.mark.django_db(transaction=True)


def test_an_intent_and_its_receipt_are_answered_and_stored_with_redis_away(api, redis_away, caplog):
    caplog.set_level(logging.WARNING, logger="durability.jobs")

    intent = api.intent("refund:1", run_id="ticket-1")
    receipt = api.receipt("refund:1", external_id="re_1")

    assert intent.status_code == 201 and intent.json()["decision"] == "proceed"
    assert receipt.status_code == 201
    effect = Effect.objects.get(key="refund:1")
    assert effect.state == State.SUCCEEDED
    assert Receipt.objects.filter(effect=effect, external_id="re_1").exists()
    assert "effect_link" in caplog.text and "not enqueued" in caplog.text


def test_the_repair_pass_links_what_was_recorded_while_redis_was_away(api, redis_away):
    api.intent("refund:1", run_id="ticket-1")
    effect = Effect.objects.get(key="refund:1")
    assert not EffectLink.objects.filter(effect=effect).exists()

    assert links.links_repair() == [effect.pk]

    assert EffectLink.objects.get(effect=effect).run_key == "ticket-1"


def test_a_redis_that_does_not_answer_holds_a_request_for_seconds_at_most():
    bounded = redis_url_bounded("redis://cache.internal:6379/2")
    assert bounded == "redis://cache.internal:6379/2?socket_connect_timeout=2&socket_timeout=5"
    own = "redis://cache.internal:6379/2?socket_timeout=30"
    assert redis_url_bounded(own) == f"{own}&socket_connect_timeout=2"


def test_a_retried_intent_after_redis_was_away_is_the_same_effect(api, redis_away):
    first = api.intent("refund:1", run_id="ticket-1").json()
    again = api.intent("refund:1", run_id="ticket-1")

    assert again.status_code == 200
    assert again.json()["effect"]["id"] == first["effect"]["id"]
    assert Effect.objects.filter(key="refund:1").count() == 1
