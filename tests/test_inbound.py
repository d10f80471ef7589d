"""durability/inbound.py: the one check every entrance gives times and JSON from outside."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from durability import inbound

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(JSON)
def test_json_loads_reads_back_any_shallow_json_document(document):
    assert inbound.json_loads(json.dumps(document).encode()) == document


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"key": 1, "key": 2}', "duplicate key 'key'"),
        (b"[" * 10_000 + b"]" * 10_000, "nested deeper than 64"),
        (b"[" * 65 + b"]" * 65, "nested deeper than 64"),
        (b'{"amount": NaN}', "NaN is not JSON"),
        (b'{"amount": -Infinity}', "-Infinity is not JSON"),
        (b'{"amount": 1e400}', "out of range for a number"),
        ('{"a": 1}'.encode("utf-16"), "must be UTF-8"),
        (b'{"a": "\xff"}', "must be UTF-8"),
        (b'{"a": ', "Expecting value"),
    ],
)
def test_json_loads_refuses_what_would_hide_or_break_a_value(body, message):
    with pytest.raises(ValueError, match=message):
        inbound.json_loads(body)


def test_json_loads_keeps_sixty_four_levels():
    assert inbound.json_loads(b"[" * 64 + b"]" * 64) is not None


def test_instant_returns_the_utc_value_of_an_offset_time():
    value = datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=14)))
    converted = inbound.instant(value)
    assert converted.tzinfo is UTC
    assert converted == value
    assert converted.hour == 22


def test_instant_takes_a_naive_time_as_utc():
    assert inbound.instant(datetime(2026, 6, 1, 12, 0)) == datetime(2026, 6, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        datetime(1999, 12, 31, 23, 59, tzinfo=UTC),
        datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),  # year 0 in UTC
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-2))),  # year 10000
        datetime(9999, 1, 1, tzinfo=UTC),
    ],
)
def test_instant_refuses_times_outside_what_the_world_can_have_reported(value):
    with pytest.raises(ValueError):
        inbound.instant(value)


def test_instant_allows_a_clock_a_little_ahead_but_not_two_days():
    now = django_timezone.now()
    assert inbound.instant(now + timedelta(hours=23)) == now + timedelta(hours=23)
    with pytest.raises(ValueError, match="one day from now"):
        inbound.instant(now + timedelta(days=2))


@pytest.mark.parametrize("seconds", [1e20, float("nan"), float("inf"), True, "1700000000", -1])
def test_instant_from_unix_refuses_what_is_not_a_plausible_number_of_seconds(seconds):
    with pytest.raises(ValueError):
        inbound.instant_from_unix(seconds)


def test_instant_from_unix_nanos_reads_otlp_times_and_refuses_overflow():
    assert inbound.instant_from_unix_nanos(1_767_225_600_000_000_000) == datetime(
        2026, 1, 1, tzinfo=UTC
    )
    for nanos in (10**30, -1, 2**64, 0):
        with pytest.raises(ValueError):
            inbound.instant_from_unix_nanos(nanos)


@pytest.mark.parametrize("text", ["¹²³", "٣", "1" * 5000, "", "-1", " 1", "1.0"])
def test_decimal_digits_refuses_what_is_not_a_short_ascii_integer(text):
    with pytest.raises(ValueError):
        inbound.decimal_digits(text)


def test_decimal_digits_reads_an_ascii_integer():
    assert inbound.decimal_digits("1700000000") == 1_700_000_000


@pytest.mark.parametrize(("text", "message"), [("a\x00b", "NUL"), ("a\ud800b", "surrogate")])
def test_storable_text_refuses_what_postgresql_cannot_store(text, message):
    with pytest.raises(ValueError, match=message):
        inbound.storable_text(text)


def test_json_path_reads_dotted_paths_and_takes_only_ascii_indexes():
    document = {"data": [{"id": "a"}, {"id": "b"}]}
    assert inbound.json_path(document, "data.1.id") == "b"
    assert inbound.json_path(document, "data.2.id") is None
    assert inbound.json_path(document, "data.².id") is None
    assert inbound.json_path(document, "data." + "9" * 5000) is None
    assert inbound.json_path(document, "data.x") is None


def test_unstorable_at_gives_the_path_of_the_first_key_or_string_postgresql_refuses():
    assert inbound.unstorable_at({"a": [1, "ok", {"b": "x\x00"}]}) == (
        ("a", 2, "b"),
        False,
        "NUL characters (\\u0000) cannot be stored",
    )
    found = inbound.unstorable_at({"a": {"\ud800": 1}})
    assert found is not None and found[:2] == (("a", "\ud800"), True)
    assert "surrogate" in found[2]
    assert inbound.unstorable_at({"a": [1.5, None, "fine"], "b": True}) is None


# Any text: NUL, other control characters and lone surrogates among it.
ANY_JSON = st.recursive(
    st.none() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(ANY_JSON, st.booleans())
def test_json_text_that_escapes_no_nul_or_surrogate_holds_only_storable_strings(
    document, ascii_only
):
    try:
        body = json.dumps(document, ensure_ascii=ascii_only).encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: no request can carry it raw
        return
    if inbound.storable_strings(body):
        assert inbound.unstorable_at(inbound.json_loads(body)) is None


@pytest.mark.parametrize(
    ("body", "storable"),
    [
        (b'{"a": "\\u0000"}', False),
        (b'{"a": "\\ud83d\\ude00"}', False),
        (b'{"\\uDFFF": 1}', False),
        (b'{"a": "C:\\\\u0000"}', False),  # an escaped backslash: a false alarm, the full check
        (b'{"a": "stripe\\u00e9 \\u4e2d\\u0001"}', True),  # what json.dumps escapes by default
        ('{"a": "\u00e9\\n"}'.encode(), True),
    ],
)
def test_only_an_escaped_nul_or_surrogate_calls_for_the_full_check(body, storable):
    assert inbound.storable_strings(body) is storable
