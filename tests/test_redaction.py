"""durability/redaction.py `distinct`: identities with a secret in them stay apart, whole,
within their column, and are the same in every process of one deployment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from durability.models import Attempt
from durability.redaction import IDENTITY_MAX, NONE, distinct
from tests.conftest import Api

# No letter of a secret marker or key name, no upper case: a secret's value (which starts
# with an upper-case letter) can only be found in a result where it survived.
PLAIN = st.text(alphabet="abc0123456789:/.", max_size=240)
VALUE = st.from_regex(r"[QXZ][A-Z0-9]{0,20}", fullmatch=True)
LABELS = ["password=", "token=", "api_key: ", "secret=", "refund:token=", "Authorization: "]
ASSIGNMENT = st.tuples(st.sampled_from(LABELS), VALUE)
TOKEN = st.tuples(st.just("sk-"), st.from_regex(r"[QXZ][A-Z0-9]{15,30}", fullmatch=True))


@st.composite
def identities(draw: st.DrawFn) -> tuple[str, str]:
    """An identity of at most 255 characters holding a secret, and the secret's value."""
    label, value = draw(ASSIGNMENT | TOKEN)
    prefix, suffix = draw(PLAIN), draw(PLAIN)
    text = f"{prefix}:{label}{value}&{suffix}"[:IDENTITY_MAX]
    return text, value if value in text else ""


@settings(derandomize=True, max_examples=300, deadline=None)
@given(identities(), identities())
def test_identities_that_differ_stay_different_and_keep_no_secret(one, other):
    (x, secret_x), (y, secret_y) = one, other
    for text, secret in ((x, secret_x), (y, secret_y)):
        kept = distinct(text)
        assert not secret or secret not in kept
        assert len(kept) <= IDENTITY_MAX
        assert distinct(kept) == kept
    if x != y:
        assert distinct(x) != distinct(y)


def test_short_secrets_keep_a_whole_digest_each():
    assert distinct("password=a1") != distinct("password=b2")
    assert distinct("refund:token=abc123") != distinct("refund:token=xyz789")
    for short in ("password=a1", "refund:token=abc123"):
        kept = distinct(short)
        assert kept.startswith(short.split("=")[0] + "=[REDACTED:") and kept.endswith("]")
        assert distinct(kept) == kept


def test_an_identity_whose_marks_would_not_fit_becomes_one_mark():
    long = "pay:" + "a" * 240 + ":password=a1"
    other = "pay:" + "a" * 240 + ":password=b2"
    kept = distinct(long)
    assert kept.startswith("[REDACTED:") and "a1" not in kept
    assert len(kept) <= len("[REDACTED:]") + 32
    assert kept != distinct(other)
    assert distinct(kept) == kept
    # A field of its own size: the fingerprint's 128 characters.
    assert len(distinct("fp:" + "b" * 110 + ":password=a1", limit=128)) <= 128
    # An identity with nothing in it to replace stays as it was, whatever its length.
    assert distinct("pay:" + "c" * 300) == "pay:" + "c" * 300


def test_the_digest_is_keyed_by_the_deployments_secret_key_and_the_same_in_every_process():
    here = distinct("pay:password=a1")
    script = (
        "import django; django.setup(); from durability.redaction import distinct; "
        "print(distinct('pay:password=a1'))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "durability.settings"}
    there = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()
    assert there == here
    with override_settings(SECRET_KEY="another-deployment-" + "k" * 40):
        assert distinct("pay:password=a1") != here


# Texts from letters that spell markers (key, token, pass, secret, AIza, sk-…), a NUL, and the
# Kelvin sign (which lowercases to k).
_LETTERS = st.sampled_from("abceknopstwyz_-=:AIK\x00 \u212a")
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=_LETTERS, max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet=_LETTERS, max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(data=_JSON)
def test_an_inputs_json_is_redacted_as_a_walk_over_every_text_would(data: object) -> None:
    """The one search of a JSON value's text for markers never lets through what the walk
    over each of its texts would redact."""
    from durability.api.schemas import ReceiptIn
    from durability.redaction import redact, redact_input

    sent = ReceiptIn.model_construct(key="k", system="s", external_id="e", data=data)
    assert redact_input(sent).data == redact({"data": data})["data"]


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=_LETTERS, max_size=24))
def test_a_text_passed_over_unsearched_is_one_a_full_scrub_would_leave_as_it_is(
    text: str,
) -> None:
    """`scrub_text` skips the patterns for a text holding no marker: the full scrub of every
    such text changes nothing."""
    from durability.redaction import _mark_plain, _scrub, scrub_text

    assert scrub_text(text) == _scrub(text, NONE, _mark_plain)


@pytest.mark.django_db
def test_a_context_field_named_like_a_secret_holding_an_object_is_stored_with_its_name_redacted(
    api: Api,
) -> None:
    secret = "sk-" + "a" * 24
    response = api.intent("named-like-a-secret", context={"workflow": "w", secret: {"n": 1}})

    assert response.status_code == 201, response.content
    attempt = Attempt.objects.get(effect__key="named-like-a-secret")
    assert attempt.context == {"workflow": "w", "[REDACTED]": {"n": 1}}
