"""The ledger stores no secret: what agents send is redacted before anything is stored or
hashed, while the fingerprint, taken from the request as sent, still tells requests apart."""

from __future__ import annotations

import json

from django.contrib.auth.models import User

from durability.audit import first_broken_entry
from durability.ledger.intents import fingerprint_of
from durability.ledger.machine import Event
from durability.models import (
    ApiKey,
    Approval,
    Attempt,
    AuditEntry,
    Case,
    Effect,
    Membership,
    Project,
    Receipt,
    Role,
)
from durability.redaction import REDACTED
from tests.conftest import Api
from tests.desk.support import logged_in
from tests.ledger import support as ledger

OPENAI = "sk-proj-" + "A1b2C3d4" * 4
GITHUB = "ghp_" + "x" * 36


def _stored(project: Project) -> str:
    """Every ledger row of the project that could hold what an agent sent, as one text."""
    rows = [
        *Effect.objects.filter(project=project).values(),
        *Attempt.objects.filter(effect__project=project).values(),
        *Receipt.objects.filter(project=project).values(),
        *Case.objects.filter(project=project).values(),
        *Approval.objects.filter(project=project).values(),
        *AuditEntry.objects.filter(project=project).values(),
    ]
    return json.dumps(rows, default=str)


def test_two_requests_differing_only_in_a_secret_conflict_and_neither_secret_is_stored(
    api, project
):
    first = api.intent("pay:1", request={"to": "acme", "token": OPENAI})
    assert first.status_code == 201
    second = api.intent("pay:1", request={"to": "acme", "token": GITHUB})
    assert second.status_code == 409 and second.json()["decision"] == "conflict"
    effect = Effect.objects.get(project=project, key="pay:1")
    assert effect.fingerprint == fingerprint_of({"to": "acme", "token": OPENAI})
    assert effect.request == {"to": "acme", "token": REDACTED}
    conflict = Case.objects.get(reason="key_reuse_conflict")
    assert conflict.detail["request"] == {"to": "acme", "token": REDACTED}
    stored = _stored(project)
    assert OPENAI not in stored and GITHUB not in stored


def test_the_same_request_sent_again_is_the_same_effect(api):
    request = {"note": f"charge with {OPENAI}"}
    api.intent("pay:1", request=request)
    again = api.intent("pay:1", request=request)
    assert again.status_code == 200 and again.json()["decision"] == "wait"


def test_context_authority_data_error_and_reason_are_redacted_everywhere(api, project):
    api.intent(
        "pay:1",
        context={"workflow": "refunds", "model": f"gpt via {GITHUB}", "api_key": "hunter2"},
        authority={"grant": ledger.everything(project).pk, "approved_by": f"Bearer {OPENAI}"},
    )
    api.timeout("pay:1", reason=f"provider said 401 for {OPENAI}")
    api.receipt("pay:1", "re_1", data={"password": "hunter2", "echo": f"Authorization: {GITHUB}"})
    api.intent("pay:2")
    api.failure("pay:2", error="AKIAIOSFODNN7EXAMPLE was refused, password=hunter2")
    stored = _stored(project)
    for secret in (OPENAI, GITHUB, "hunter2", "AKIAIOSFODNN7EXAMPLE"):
        assert secret not in stored, secret
    effect = Effect.objects.get(key="pay:1")
    assert effect.authority["approved_by"] == f"Bearer {REDACTED}"
    assert effect.attempts.get().context["api_key"] == REDACTED
    assert Receipt.objects.get().data["password"] == REDACTED
    # The redacted values are what the audit chain hashed: it verifies.
    assert first_broken_entry(project) is None


def test_a_secret_in_a_key_is_stored_as_its_digest_and_keys_stay_distinct(api, project):
    one = api.intent(f"pay:{OPENAI}").json()
    other = api.intent(f"pay:{GITHUB}").json()
    assert one["effect"]["id"] != other["effect"]["id"]
    assert OPENAI not in one["effect"]["key"] and one["effect"]["key"].startswith("pay:[REDACTED:")
    # The agent keeps using its own key: the receipt and the lookup find the same effect.
    settled = api.receipt(f"pay:{OPENAI}", f"re_{GITHUB}").json()
    assert settled["effect"]["id"] == one["effect"]["id"]
    assert settled["effect"]["state"] == "succeeded"
    assert GITHUB not in settled["receipt"]["external_id"]
    found = api.get("effects", key=f"pay:{OPENAI}")
    assert found.status_code == 200 and found.json()["effect"]["id"] == one["effect"]["id"]
    assert OPENAI not in _stored(project) and GITHUB not in _stored(project)


def test_two_intents_whose_keys_differ_only_in_a_short_secret_stay_two_effects(api, project):
    one = api.intent("refund:token=abc123").json()
    other = api.intent("refund:token=xyz789").json()
    assert one["decision"] == other["decision"] == "proceed"
    assert one["effect"]["id"] != other["effect"]["id"]
    assert one["effect"]["key"] != other["effect"]["key"]
    assert Effect.objects.filter(project=project).count() == 2
    # Each agent finds its own effect again by the key it sent.
    again = api.intent("refund:token=xyz789").json()
    assert again["effect"]["id"] == other["effect"]["id"]
    assert "abc123" not in _stored(project) and "xyz789" not in _stored(project)


def test_two_receipts_whose_external_ids_differ_only_in_a_short_secret_stay_two(api, project):
    api.intent("pay:1")
    first = api.receipt("pay:1", "re:password=a1")
    second = api.receipt("pay:1", "re:password=b2")
    assert first.status_code == second.status_code == 201
    receipts = Receipt.objects.filter(project=project)
    assert receipts.count() == 2
    assert len({r.external_id for r in receipts}) == 2
    # The same receipt sent again is a duplicate of its own, not of the other.
    assert api.receipt("pay:1", "re:password=b2").status_code == 200
    assert receipts.count() == 2
    assert "password=a1" not in _stored(project) and "password=b2" not in _stored(project)


def test_a_receipt_before_its_intent_is_adopted_under_the_same_digest(api, project):
    api.receipt(f"pay:{OPENAI}", "re_1")
    adopted = api.intent(f"pay:{OPENAI}").json()
    assert adopted["decision"] == "completed"
    assert OPENAI not in _stored(project)


def test_the_projects_own_patterns_and_key_names_are_redacted(api, project):
    project.redaction_patterns = [r"cust-[0-9]{6}"]
    project.redaction_keys = ["iban"]
    project.save()
    api.intent("pay:1", request={"customer": "cust-123456", "iban": "DE89370400440532013000"})
    effect = Effect.objects.get(key="pay:1")
    assert effect.request == {"customer": REDACTED, "iban": REDACTED}
    assert "cust-123456" not in _stored(project) and "DE8937" not in _stored(project)


def test_an_operators_evidence_is_redacted_too(project):
    ledger.intent(project, "pay:1")
    ledger.timeout(project, "pay:1")
    ledger.settle(project, "pay:1", Event.ATTEST_HAPPENED, evidence=f"re_{OPENAI}")
    assert OPENAI not in _stored(project)


def test_a_stored_pattern_that_fails_the_check_is_left_out_and_recording_goes_on(api, project):
    # Written around the settings page (a shell, a data migration): ingest must not fail.
    Project.objects.filter(pk=project.pk).update(
        redaction_patterns=["(a+)+$", "[", 7, "cust-[0-9]{6}"], redaction_keys={"not": "a list"}
    )
    r = api.intent("pay:1", request={"customer": "cust-123456"})
    assert r.status_code == 201
    assert Effect.objects.get(key="pay:1").request == {"customer": REDACTED}


def test_a_projects_backtracking_pattern_stalls_neither_its_ingest_nor_another_project(
    api, project, client
):
    # b_admin saves (a|a)+b, which takes Python's re exponential time on "aaa…": RE2 runs
    # it in linear time, so B's intent holding 10,000 "a"s is answered, and A's request too.
    b = Project.objects.create(name="beta")
    b_admin = User.objects.create_user("b_admin")
    Membership.objects.create(project=b, user=b_admin, role=Role.ADMIN)
    saved = logged_in(b_admin).post(
        f"/settings/{b.pk}/redaction/", {"patterns": "(a|a)+b", "keys": ""}
    )
    assert saved.status_code == 302
    assert Project.objects.get(pk=b.pk).redaction_patterns == ["(a|a)+b"]
    _, raw = ApiKey.issue(b)
    b_api = Api(client, raw)
    flood = "a" * 10_000
    answered = b_api.intent("pay:1", request={"note": flood, "then": flood + "b"})
    assert answered.status_code == 201
    assert Effect.objects.get(project=b).request == {"note": flood, "then": REDACTED}
    assert api.intent("pay:2").status_code == 201
    mine = Effect.objects.get(project=project, key="pay:2")
    assert api.get(f"effects/{mine.pk}").status_code == 200


def test_a_long_secret_across_the_old_scan_windows_edge_is_redacted(api, project):
    # A PEM key (over 4 KB, the old windows' overlap) straddling 256 KB, where the old scan
    # cut the text: neither window held all of it, so it was stored as sent.
    project.redaction_patterns = [r"-----BEGIN KEY-----[A-Za-z0-9+/=\n]+-----END KEY-----"]
    project.save()
    key = "-----BEGIN KEY-----\n" + "QUJD\n" * 2000 + "-----END KEY-----"
    note = "x" * (256 * 1024 - 5000) + key + "y" * 10_000
    assert len(key) > 4 * 1024 and len(note.encode()) < 1024 * 1024
    assert api.intent("deploy:1", request={"note": note}).status_code == 201
    stored = Effect.objects.get(key="deploy:1").request["note"]
    assert "QUJD" not in stored and stored.startswith("x" * 1000) and stored.endswith("y" * 1000)
