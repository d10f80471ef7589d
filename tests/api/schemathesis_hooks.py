"""Schemathesis hooks for tests/api/test_openapi_contract.py (loaded by its schemathesis.toml).

What the document states but a JSON Schema cannot: a time from outside lies between
2000-01-01 and one day from now (durability/inbound.py); and a batch of events, of receipts
or of failures answers each item alone (207), and an OTLP export request each span alone
(partialSuccess), so a batch holding an invalid item is refused in that item's result, not
with a 4xx.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import schemathesis
from hypothesis import strategies as st

# Whole seconds and a few offsets, from the earliest instant inbound takes to an hour ago.
_EARLIEST = datetime(2000, 1, 1, 12, tzinfo=UTC)
_OFFSETS = ["Z", "+00:00", "+05:30", "-13:30", "+14:00"]


def _instant(seconds: int, offset: str) -> str:
    moment = (_EARLIEST + timedelta(seconds=seconds)).replace(tzinfo=None)
    return moment.isoformat() + offset


_SPAN = int((datetime(2026, 1, 1, tzinfo=UTC) - _EARLIEST).total_seconds())
schemathesis.openapi.format(
    "date-time",
    st.builds(_instant, st.integers(0, _SPAN), st.sampled_from(_OFFSETS)),
)


@schemathesis.check
def events_refused_alone(ctx: Any, response: Any, case: Any) -> bool | None:
    """An invalid batch of events is a 4xx, or a 207 that rejects at least one event."""
    meta = case.meta
    if case.path != "/api/v1/events" or meta is None or not meta.generation.mode.is_negative:
        return None
    if response.status_code != 207:
        return None
    body = response.json()
    if body["rejected"] == 0:
        raise AssertionError("An invalid batch of events had every event accepted")
    return None


@schemathesis.check
def spans_refused_alone(ctx: Any, response: Any, case: Any) -> bool | None:
    """An invalid export request is a 4xx, or a 200 whose partialSuccess rejects a span."""
    meta = case.meta
    if case.path != "/v1/traces" or meta is None or not meta.generation.mode.is_negative:
        return None
    if response.status_code != 200 or "json" not in response.headers.get("Content-Type", ""):
        return None
    rejected = (response.json().get("partialSuccess") or {}).get("rejectedSpans", "0")
    if int(rejected) == 0:
        raise AssertionError("An invalid export request had every span accepted")
    return None


@schemathesis.check
def reports_refused_alone(ctx: Any, response: Any, case: Any) -> bool | None:
    """An invalid batch of receipts or failures is a 4xx, or a 207 with an item refused."""
    meta = case.meta
    batches = ("/api/v1/receipts/batch", "/api/v1/failures/batch")
    if case.path not in batches or meta is None or not meta.generation.mode.is_negative:
        return None
    if response.status_code != 207:
        return None
    if all(result["status"] < 400 for result in response.json()["results"]):
        raise AssertionError("An invalid batch had every item accepted")
    return None
