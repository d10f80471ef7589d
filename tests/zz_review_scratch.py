from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from durability import audit
from durability.models import AuditAction, AuditEntry, Case, Effect, Project, Reason, Receipt, Severity


def test_orphans_duplicate_case_names_the_first_receipt(api):
    api.receipt("k1", "re_1")
    api.receipt("k1", "re_2")
    api.intent("k1")
    case = Case.objects.get(reason="duplicate_effect")
    first = Receipt.objects.get(external_id="re_1")
    assert case.detail.get("first") == first.pk, (case.summary, case.detail)


@pytest.mark.django_db(transaction=True)
def test_failing_staged_write_in_own_trail_commits_nothing(project):
    ran = []
    with pytest.raises(IntegrityError):
        with audit.trail(project, "t") as trail:
            Case.objects.create(project=project, reason=Reason.ORPHAN_RECEIPT,
                                severity=Severity.HIGH, summary="immediate")
            transaction.on_commit(lambda: ran.append(1))
            trail.add(AuditAction.CASE_OPENED)
            bad = Receipt(project=project, key="k", system="s", external_id="x",
                          effect_id=999999999)  # FK checked at COMMIT (deferred)
            trail.stage(bad)
    assert not connection.in_atomic_block and connection.get_autocommit()
    assert Case.objects.count() == 0 and Receipt.objects.count() == 0
    assert AuditEntry.objects.count() == 0 and ran == []
    # The connection is usable afterwards, and the next trail commits.
    with audit.trail(project, "t") as trail:
        trail.add(AuditAction.CASE_OPENED)
    assert AuditEntry.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_python_error_mid_send_commits_nothing(project):
    with pytest.raises(ValueError):
        with audit.trail(project, "t") as trail:
            trail.add(AuditAction.CASE_OPENED)
            ok = Receipt(project=project, key="k", system="s", external_id="x")
            trail.stage(ok)
            e = Effect(project=project, key="u")  # never saved
            bad = Receipt(project=project, key="k", system="s", external_id="y", effect=e)
            trail.stage(bad)
    assert Receipt.objects.count() == 0 and AuditEntry.objects.count() == 0
    assert not connection.in_atomic_block


def test_times_parse_as_iso_text_and_not_numbers(api):
    api.intent("k1")
    ok = api.receipt("k1", "e1", observed_at="2026-01-01T00:00:00Z")
    assert ok.status_code == 201, ok.content
    num = api.receipt("k1", "e2", observed_at=1767225600)
    assert num.status_code == 400, num.content
