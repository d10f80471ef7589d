"""Signed webhooks under fuzzing: whatever a sender holding the secret signs, the intake
answers 2xx or 4xx, never 5xx; a refused delivery stores nothing, and a replay of an
accepted one stores nothing new whatever its headers say.

The inputs are near-valid: a payload that maps, with any of its mapped values replaced by
odd JSON (huge or non-finite numbers, NUL, lone surrogates, superscript digits, wrong
types), odd headers and odd bodies. The seed is fixed (`derandomize`), so a run is the
same run everywhere; the budget keeps the file to a few seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from durability.api.webhooks import signature_of
from durability.models import Project, WebhookSource
from tests.api.support import signed
from tests.ledger import support as ledger

FUZZ = settings(
    max_examples=120,
    derandomize=True,
    database=None,
    deadline=None,
    # The examples share the function's database fixtures; each rolls itself back.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text a hostile sender would try: NUL, lone surrogates, other scripts' digits, long runs.
ODD_TEXT = st.sampled_from(
    ["", "\x00", "\ud800", "a\udfff", "¹²³", "١٢٣", "1" * 5000, " " * 300 + "x", "2025-13-01"]
)
TEXT = st.text(st.characters(exclude_categories=()), max_size=12) | ODD_TEXT
NUMBER = (
    st.integers()
    | st.sampled_from([10**30, -(10**30), 2**63, 1e20, -1e20, 946_684_799, 1_760_000_000])
    | st.floats(allow_nan=True, allow_infinity=True)
)
LEAF = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
)
# What HTTP can carry in a header: Latin-1, as WSGI decodes it.
HEADER = st.text(st.characters(max_codepoint=0xFF), max_size=40) | ODD_TEXT.filter(
    lambda t: all(ord(c) <= 0xFF for c in t)
)
# Besides JSON documents: bytes that are not JSON, not UTF-8, or nested deeper than allowed.
ODD_BODY = st.binary(max_size=40) | st.integers(60, 3000).map(lambda n: b"[" * n + b"]" * n)


def mostly[T](valid: T, odd: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """`valid` three times in four, else something odd: most deliveries get far enough in
    to be recorded, and the odd ones still come in every combination."""
    return st.integers(0, 3).flatmap(lambda n: odd if n == 0 else st.just(valid))


def _body(payload: Any) -> bytes:
    # ensure_ascii writes lone surrogates as \ud800 escapes, as a hostile sender would;
    # allow_nan writes NaN and Infinity, which are not JSON.
    return json.dumps(payload, allow_nan=True).encode()


@st.composite
def refunds(draw: st.DrawFn) -> bytes:
    """A Stripe-like refund event with any of its mapped values made odd."""
    obj: dict[str, Any] = {
        "id": draw(mostly("re_1", JSON)),
        "amount": draw(mostly(1250, JSON)),
        "currency": draw(mostly("eur", JSON)),
        "metadata": {"tallybook_key": draw(mostly("refund:1", st.just("refund:2") | JSON))},
    }
    payload: Any = {"id": "evt_1", "created": draw(mostly(1_760_000_000, JSON)), "data": {}}
    payload["data"]["object"] = draw(mostly(obj, JSON))
    return draw(mostly(_body(payload), st.builds(_body, JSON) | ODD_BODY))


@st.composite
def pushes(draw: st.DrawFn) -> bytes:
    """A GitHub push with odd commits, trailers, times and repository names."""
    commit = st.fixed_dictionaries(
        {
            "id": st.text("0123456789abcdef", min_size=40, max_size=40) | JSON,
            "message": mostly(
                "Fix\n\nTallybook-Key: fix:42\n",
                st.builds(lambda key: f"Fix\n\nTallybook-Key: {key}", TEXT) | JSON,
            ),
            "timestamp": mostly("2025-10-09T10:00:00+02:00", JSON),
            "url": mostly("https://github.com/acme/shop/commit/a", JSON),
        }
    )
    payload = {
        "ref": draw(mostly("refs/heads/main", JSON)),
        "repository": {"full_name": draw(mostly("acme/shop", JSON))},
        "commits": draw(
            st.integers(0, 7).flatmap(
                lambda n: JSON if n == 0 else st.lists(commit if n > 1 else JSON, max_size=3)
            )
        ),
    }
    return draw(mostly(_body(payload), st.builds(_body, JSON) | ODD_BODY))


@pytest.fixture
def effects(project: Project) -> None:
    """Intents for some of the keys the deliveries name, so that receipts settle effects."""
    for key in ("refund:1", "fix:42"):
        ledger.intent(project, key)


@contextmanager
def _rolled_back() -> Iterator[None]:
    """One example in a transaction rolled back after it: examples stay independent."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def _assert_answered(response: Any, before: dict[str, int]) -> None:
    """2xx or 4xx with a JSON body; anything but a new delivery stores nothing."""
    event(f"answered {response.status_code}")
    assert response.status_code < 500, response.content[:500]
    body = response.json()
    if response.status_code >= 400:
        assert body["error"]
    if response.status_code != 201:
        assert ledger.row_counts() == before


@FUZZ
@given(
    body=refunds(),
    skew=mostly(0, st.integers(-400, 400)),
    stamp=mostly(None, HEADER),
    delivery=st.none() | HEADER,
    replay_delivery=HEADER,
)
def test_no_signed_generic_delivery_is_a_server_error_or_stores_anything_when_refused(
    client: Client,
    stripe: WebhookSource,
    effects: None,
    body: bytes,
    skew: int,
    stamp: str | None,
    delivery: str | None,
    replay_delivery: str,
) -> None:
    stamp = str(int(time.time()) + skew) if stamp is None else stamp
    headers = signed(body, stamp, stripe.secret, delivery or "")
    with _rolled_back():
        before = ledger.row_counts()
        response = _hook(client, stripe, body, headers)
        _assert_answered(response, before)
        if response.status_code == 201:
            # The same signed bytes under any other delivery id: received already.
            after = ledger.row_counts()
            replay = _hook(
                client, stripe, body, {**headers, "X-Tallybook-Delivery": replay_delivery}
            )
            assert replay.status_code in (200, 400), replay.content[:500]
            assert ledger.row_counts() == after


@FUZZ
@given(
    body=pushes(),
    event=st.sampled_from(["push", "ping"]) | HEADER,
    delivery=st.none() | HEADER,
    replay_delivery=HEADER,
)
def test_no_signed_github_delivery_is_a_server_error_or_stores_anything_when_refused(
    client: Client,
    github: WebhookSource,
    effects: None,
    body: bytes,
    event: str,
    delivery: str | None,
    replay_delivery: str,
) -> None:
    headers = {
        "X-GitHub-Event": event,
        "X-Hub-Signature-256": signature_of(github.secret, body),
        **({"X-GitHub-Delivery": delivery} if delivery is not None else {}),
    }
    with _rolled_back():
        before = ledger.row_counts()
        response = _hook(client, github, body, headers)
        _assert_answered(response, before)
        if response.status_code == 201:
            after = ledger.row_counts()
            # GitHub signs no timestamp: the capture is valid for ever, under any headers.
            replay = _hook(
                client,
                github,
                body,
                {**headers, "X-GitHub-Delivery": replay_delivery, "X-GitHub-Event": "push"},
            )
            assert replay.status_code in (200, 400), replay.content[:500]
            assert ledger.row_counts() == after


def _hook(client: Client, source: WebhookSource, body: bytes, headers: dict[str, str]) -> Any:
    return client.post(
        f"/hooks/{source.name}/", data=body, content_type="application/json", headers=headers
    )
