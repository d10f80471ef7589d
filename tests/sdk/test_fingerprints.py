"""The arguments' fingerprint both SDKs compute (a call's default key, the server's request
fingerprint): tests/sdk/fingerprints.json holds arguments and their fingerprints, which the
TypeScript suite (sdk.test.ts) reads too, so the two languages key a call alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tallybook.integrations._tool_calls import argument_fingerprint

from durability.ledger.intents import fingerprint_of

VECTORS = json.loads((Path(__file__).parent / "fingerprints.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["fingerprint"][:8])
def test_the_python_sdk_and_the_server_fingerprint_the_shared_vectors_alike(vector):
    assert argument_fingerprint(vector["args"]) == vector["fingerprint"]
    assert fingerprint_of(vector["args"]) == vector["fingerprint"]
