"""What the ledger is asked to record: an intent, a receipt's evidence, a failure, a timeout.

Plain frozen dataclasses, the ledger's own words: the API maps its wire models onto them
(`durability/api/commands.py`), and the desk, the reconcilers and the webhooks build them
directly. They hold values already checked (the API's schemas check what comes over the
wire); the ledger redacts them (`redaction.redact_input`) before it stores anything.

A text field's `max_length` (in its metadata) is its column's size: redaction keeps a text
within it. The field names are the API's, which redaction reads too (a project's secret key
names apply to them as to any JSON key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

# The columns' sizes.
_KEY = {"max_length": 255}
_NAME = {"max_length": 100}
_TEXT = {"max_length": 255}
_REPORT = {"max_length": 4000}

# The context's named keys and their texts' sizes (None: not a text); any other key is the
# agent's own, and its name is redacted like a JSON key's.
CONTEXT_KEYS: Mapping[str, int | None] = {
    "workflow": 255,
    "workflow_version": 255,
    "model": 255,
    "code_version": 255,
    "tools": None,
    "memory_digest": 255,
    "policy_version": 255,
}


@dataclass(frozen=True, slots=True)
class Amount:
    """What an effect moves, or what the evidence says was moved."""

    value: Decimal
    currency: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    """An agent's intent to perform an effect, under its stable key."""

    key: str = field(metadata=_KEY)
    kind: str = field(metadata=_NAME)
    target: str = field(metadata=_TEXT)
    request: Any = None
    # The client's own request fingerprint; else the ledger takes the request's.
    fingerprint: str | None = field(default=None, metadata={"max_length": 128})
    replay: str = "never"
    timeout_s: int | None = None
    run_id: str | None = field(default=None, metadata=_TEXT)
    tool_call_id: str | None = field(default=None, metadata=_TEXT)
    trace_id: str | None = None
    span_id: str | None = None
    worker: str | None = field(default=None, metadata=_TEXT)
    # What the agent ran under (no None values): `CONTEXT_KEYS` and the agent's own keys.
    context: Mapping[str, Any] = field(default_factory=dict, metadata={"keys": CONTEXT_KEYS})
    authority: Mapping[str, Any] | None = None
    amount: Amount | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptEvidence:
    """A receipt: evidence from an external system that an effect happened."""

    key: str = field(metadata=_KEY)
    system: str = field(metadata=_NAME)
    external_id: str = field(metadata=_TEXT)
    observed_at: datetime | None = None
    data: Any = None
    amount: Amount | None = None
    # Where the evidence says the effect landed, when it may differ from the intent's target.
    target: str | None = field(default=None, metadata=_TEXT)
    attempt: int | None = None
    trace_id: str | None = None
    span_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """An attempt failed: `definitive` when the provider said nothing happened, else its
    outcome is unknown."""

    key: str = field(metadata=_KEY)
    error: str = field(metadata=_REPORT)
    definitive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeout:
    """An attempt was given up as timed out."""

    key: str = field(metadata=_KEY)
    reason: str = field(metadata=_REPORT)
