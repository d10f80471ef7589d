"""A provider's answer to a probe is text from outside: its secrets are redacted before the
probe, its receipt, the notes or the audit entries hold it."""

from __future__ import annotations

import json

import pytest

from durability.models import AuditEntry, Case, Probe, Receipt
from tests.local_http import LocalHttp, Reply
from tests.reconcilers.test_http import ask, reconciler, timed_out

SECRET = "sk-live-" + "Pr0v1d3r" * 4


@pytest.fixture
def provider():
    with LocalHttp() as s:
        yield s


def _stored() -> str:
    rows = [
        *Probe.objects.values(),
        *Receipt.objects.values(),
        *Case.objects.values(),
        *AuditEntry.objects.values(),
    ]
    return json.dumps(rows, default=str)


def test_a_found_answers_ids_and_data_are_redacted(api, project, provider):
    effect = timed_out(api)
    reconciler(project, provider)
    provider.reply("/refunds/refund%3A1", Reply(200, {"id": f"re_{SECRET}", "status": "succeeded"}))
    probe = ask(effect)
    assert probe.settled == "probe_found"
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.external_id.startswith("re_[REDACTED:")
    assert SECRET not in _stored()


def test_an_unknown_answers_detail_is_redacted(api, project, provider):
    effect = timed_out(api)
    reconciler(project, provider)
    provider.reply("/refunds/refund%3A1", Reply(200, {"id": "re_1", "status": f"odd {SECRET}"}))
    probe = ask(effect)
    assert probe.answer == "unknown" and "[REDACTED]" in probe.detail
    assert SECRET not in _stored()
