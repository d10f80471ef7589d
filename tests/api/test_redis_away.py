"""Redis is never on the synchronous write path: with Redis away, intents and receipts are
committed and answered truthfully, and the scheduled passes put right the jobs they could
not enqueue."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest
from django.db import connection

from durability import jobs
from durability.models import Effect, Receipt, State
from durability.settings import redis_url_bounded
from trajectories import links
from trajectories.models import EffectLink


def _use_redis(settings, url: str) -> None:
    """Point the app at `url`, bounded as settings.py bounds REDIS_URL."""
    settings.REDIS_URL = url
    bounded = redis_url_bounded(url)
    settings.RQ_QUEUES = {n: {**q, "URL": bounded} for n, q in settings.RQ_QUEUES.items()}


@pytest.fixture
def redis_away(settings, tmp_path: Path):
    """A Redis URL whose Unix socket does not exist: every connection is refused at once,
    and no other test's server can appear there."""
    _use_redis(settings, f"unix://{tmp_path / 'no-redis.sock'}")


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


def test_the_redis_url_gets_bounded_waits_unless_it_sets_its_own():
    bounded = redis_url_bounded("redis://cache.internal:6379/2")
    assert bounded == "redis://cache.internal:6379/2?socket_connect_timeout=2&socket_timeout=5"
    own = "redis://cache.internal:6379/2?socket_timeout=30"
    assert redis_url_bounded(own) == f"{own}&socket_connect_timeout=2"
    unix = "unix:///run/redis/redis.sock?db=2"
    assert redis_url_bounded(unix) == f"{unix}&socket_connect_timeout=2&socket_timeout=5"


def test_an_enqueue_against_a_redis_that_never_answers_gives_up_and_returns(
    settings, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="durability.jobs")
    # Accepts connections (the kernel's backlog) and never reads or answers: a hung Redis.
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(8)
    # Its own short read timeout, which the bounding keeps (the test above): the wait given up
    # is the same, in half a second rather than the default bound's five.
    _use_redis(settings, f"unix://{tmp_path / 'silent.sock'}?socket_timeout=0.5")
    returned = threading.Event()

    def enqueue() -> None:
        try:
            jobs.enqueue(links.links_repair)
            returned.set()
        finally:
            connection.close()  # on_commit asked for the thread's own

    try:
        thread = threading.Thread(target=enqueue, daemon=True)
        thread.start()
        # Generous: only an unbounded wait (no socket timeout) fails here.
        thread.join(120)
    finally:
        silent.close()
    assert returned.is_set(), "the enqueue is still waiting for Redis"
    assert "links_repair" in caplog.text and "not enqueued" in caplog.text


def test_a_retried_intent_after_redis_was_away_is_the_same_effect(api, redis_away):
    first = api.intent("refund:1", run_id="ticket-1").json()
    again = api.intent("refund:1", run_id="ticket-1")

    assert again.status_code == 200
    assert again.json()["effect"]["id"] == first["effect"]["id"]
    assert Effect.objects.filter(key="refund:1").count() == 1
