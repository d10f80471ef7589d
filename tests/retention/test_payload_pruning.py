"""Payload retention: settled effects lose their request and receipt data once the policy
lets them go, in bulk batches; what proves the ledger stays."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durability.audit import first_broken_entry
from durability.ledger.machine import Event
from durability.models import AuditAction, AuditEntry, Effect, Receipt, State
from durability.retention import services
from tests.desk.support import logged_in, uncertain_case
from tests.ledger.support import intent, receipt, settle
from tests.retention.support import later, policy, succeeded


def test_a_settled_effect_keeps_its_key_fingerprint_and_receipt_ids_but_not_its_payloads(
    project,
):
    policy(project, payload_days=1)
    effect = succeeded(project, "refund:1", "re_1")
    done = services.payloads_prune(project=project, now=later())
    assert (done.effects, done.receipts, done.entries) == (1, 1, 1)
    pruned = Effect.objects.get(pk=effect.pk)
    assert pruned.request is None and pruned.payload_pruned is not None
    assert pruned.fingerprint == effect.fingerprint and pruned.key == "refund:1"
    (kept,) = Receipt.objects.filter(effect=effect)
    assert kept.external_id == "re_1" and kept.data is None and kept.data_pruned is not None
    # The failure's error went with the payloads; the entry's digest and hash stayed.
    failed = AuditEntry.objects.get(effect=effect, action=AuditAction.FAILURE)
    assert failed.data == {} and failed.pruned is not None and failed.data_digest
    assert first_broken_entry(project) is None


def test_the_key_keeps_deduplicating_after_its_payload_is_pruned(project):
    policy(project, payload_days=1)
    succeeded(project, "refund:1")
    services.payloads_prune(project=project, now=later())
    again = intent(
        project, "refund:1", request={"order": "refund:1", "card": "4242"}, replay="safe"
    )
    assert again.decision == "completed"
    other = intent(project, "refund:1", request={"order": "something else"}, replay="safe")
    assert other.decision == "conflict"


def test_nothing_is_pruned_before_its_days_nor_under_a_policy_that_keeps_payloads(project):
    effect = succeeded(project, "k1")
    policy(project, payload_days=None)
    assert services.payloads_prune(project=project, now=later(days=3650)).effects == 0
    policy(project, payload_days=3)
    assert services.payloads_prune(project=project, now=later(days=2)).effects == 0
    assert Effect.objects.get(pk=effect.pk).request == {"order": "k1", "card": "4242"}


def test_an_unsettled_effect_or_one_with_an_open_case_is_never_pruned(project):
    policy(project, payload_days=1)
    intent(project, "pending")  # pending
    uncertain_case(project, "timed-out")  # timed out, with its open uncertain case
    succeeded(project, "open-case", "re_a")
    receipt(project, "open-case", "re_b")  # a second receipt: a duplicate_effect case
    assert services.payloads_prune(project=project, now=later()).effects == 0
    assert not Effect.objects.filter(project=project).exclude(payload_pruned=None).exists()
    assert Effect.objects.get(key="open-case").state == State.SUCCEEDED


def test_pruning_is_audited_on_the_projects_chain(project):
    policy(project, payload_days=1)
    for n in range(3):
        succeeded(project, f"k{n}")
    services.payloads_prune(project=project, now=later(), batch=2)
    entries = AuditEntry.objects.filter(project=project, action=AuditAction.PAYLOADS_PRUNED)
    assert [(e.effect_id, e.actor, e.data["effects"]) for e in entries.order_by("id")] == [
        (None, "system:retention", 2),
        (None, "system:retention", 1),
    ]


def _prune_queries(project, n: int, batch: int) -> int:
    for i in range(n):
        succeeded(project, f"q{batch}-{i}")
    with CaptureQueriesContext(connection) as queries:
        done = services.payloads_prune(project=project, now=later(), batch=batch)
    assert done.effects == n and done.batches == 2
    return len(queries)


def test_a_batch_costs_the_same_queries_however_many_effects_it_prunes(project):
    policy(project, payload_days=1)
    small = _prune_queries(project, 4, batch=2)
    large = _prune_queries(project, 40, batch=20)
    assert small == large


def test_the_api_answers_when_the_payload_was_pruned(project, api):
    policy(project, payload_days=1)
    effect = succeeded(project, "refund:1", "re_1")
    services.payloads_prune(project=project, now=later())
    detail = api.get(f"effects/{effect.pk}").json()
    assert detail["request"] is None and detail["payload_pruned"]
    assert [(r["external_id"], r["data"]) for r in detail["receipts"]] == [("re_1", None)]
    assert detail["effect"]["fingerprint"] == effect.fingerprint


def test_the_effect_page_says_when_the_payload_was_pruned(project, alice):
    policy(project, payload_days=1)
    effect = succeeded(project, "refund:1")
    services.payloads_prune(project=project, now=later())
    page = logged_in(alice).get(f"/effects/{effect.pk}/").content.decode()
    assert "payload pruned on" in page and "(archived: no)" in page
    assert "4242" not in page


def test_a_closed_cases_story_stays_and_says_what_was_pruned(project, alice):
    policy(project, payload_days=1)
    case = uncertain_case(project, "k1", request={"card": "4242"})
    settle(project, "k1", Event.ATTEST_NOT_HAPPENED)
    assert services.payloads_prune(project=project, now=later()).effects == 1
    page = logged_in(alice).get(f"/cases/{case.pk}/").content.decode()
    assert "payload pruned on" in page and "details pruned on" in page
    # The timeout's entry lost its reason (the case's summary, never pruned, still says it).
    assert AuditEntry.objects.get(effect=case.effect, action=AuditAction.TIMEOUT).data == {}
    assert "checked the provider&#x27;s dashboard" in page  # the resolution stays


def test_the_command_prunes_each_project_and_says_what(project, capsys):
    policy(project, payload_days=1)
    succeeded(project, "k1")
    Effect.objects.filter(project=project).update(updated=later(days=-5))
    call_command("retention")
    out = capsys.readouterr().out
    assert "alpha: pruned 1 effects, 1 receipts and 1 audit entries" in out


def test_the_command_fails_on_a_refusal_and_names_the_project(project, capsys):
    policy(project, payload_days=1, require_archive=True)
    with pytest.raises(CommandError, match="Retention refused in: alpha"):
        call_command("retention")
    assert "no archive" in capsys.readouterr().out
