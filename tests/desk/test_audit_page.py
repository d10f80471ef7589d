"""The audit log page and `manage.py verifyaudit`."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from durability.desk import case_actions
from durability.models import AuditEntry, Effect
from tests.desk.support import logged_in, search, uncertain_case
from tests.ledger import support as ledger


def _ids(response) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="audit-(\d+)"', response.content.decode())]


@pytest.fixture
def desk(alice):
    return logged_in(alice)


def test_it_lists_the_projects_entries_newest_first(project, desk, other_api):
    case = uncertain_case(project)
    other_api.intent("theirs")
    r = desk.get("/audit/")
    shown = _ids(r)
    assert (
        shown
        == sorted(AuditEntry.objects.filter(project=project).values_list("pk", flat=True))[::-1]
    )
    assert f'href="/cases/{case.pk}/"' in r.content.decode()


def test_filters_by_user_effect_action_and_time(project, desk):
    case = uncertain_case(project, "k1")
    uncertain_case(project, "k2")
    case_actions.case_comment(project=project, case_id=case.pk, actor="user:alice", body="hm")
    mine = AuditEntry.objects.get(actor="user:alice")
    assert _ids(desk.get("/audit/?actor=alice")) == [mine.pk]
    assert _ids(desk.get("/audit/?actor=user:alice")) == [mine.pk]
    k2 = Effect.objects.get(key="k2")
    assert set(_ids(desk.get(f"/audit/?effect={k2.pk}"))) == set(
        AuditEntry.objects.filter(effect=k2).values_list("pk", flat=True)
    )
    timeouts = _ids(desk.get("/audit/?action=timeout"))
    assert len(timeouts) == 2
    future = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert _ids(desk.get(f"/audit/?since={future}")) == []
    assert len(_ids(desk.get(f"/audit/?until={future}"))) == AuditEntry.objects.count()
    # An effect by its key too (and an unknown key matches nothing).
    assert _ids(desk.get("/audit/?effect=k2")) == _ids(desk.get(f"/audit/?effect={k2.pk}"))
    assert _ids(desk.get("/audit/?effect=abc")) == []


def test_older_entries_come_by_keyset(project, desk):
    for i in range(40):
        ledger.intent(project, f"k{i}")
        ledger.timeout(project, f"k{i}")
    everything = list(
        AuditEntry.objects.filter(project=project).order_by("-id").values_list("pk", flat=True)
    )
    assert len(everything) > 100
    first = desk.get("/audit/")
    seen = _ids(first)
    more = search(r'hx-get="\?([^"]+)"', first.content.decode()).group(1).replace("&amp;", "&")
    seen += _ids(desk.get(f"/audit/?{more}", headers={"HX-Request": "true"}))
    assert seen == everything


def test_verifyaudit_says_each_chain_holds(project, other_api):
    uncertain_case(project)
    out = StringIO()
    call_command("verifyaudit", stdout=out)
    assert (
        f"alpha: {AuditEntry.objects.filter(project=project).count()} entries, the chain holds."
        in out.getvalue()
    )
    assert "beta: 0 entries, the chain holds." in out.getvalue()


def test_verifyaudit_names_the_first_broken_entry_and_fails(project):
    case = uncertain_case(project)
    ledger.intent(project, "k2")
    victim = AuditEntry.objects.filter(effect=case.effect).order_by("seq")[1]
    # Someone with the database owner's rights edits history behind the trigger's back.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # triggers off
        cursor.execute(
            "UPDATE durability_auditentry SET actor = 'user:nobody' WHERE id = %s", [victim.pk]
        )
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("verifyaudit", stdout=out)
    assert failed.value.returncode == 1
    assert f"alpha: BROKEN at entry {victim.pk} (effect {case.effect_id}, seq 2," in out.getvalue()


def test_verifyaudit_can_check_one_project_and_rejects_unknown_names(project):
    out = StringIO()
    call_command("verifyaudit", "--project", "alpha", stdout=out)
    assert out.getvalue().startswith("alpha: ")
    with pytest.raises(CommandError, match="No project is named 'nope'"):
        call_command("verifyaudit", "--project", "nope")


def test_entries_show_the_effects_key_and_name_an_api_key_by_its_name(project, desk):
    from durability.models import ApiKey

    key, _ = ApiKey.issue(project, name="demo agents")
    ledger.intent(project, "refund:H-1", actor=f"api:{key.prefix}", kind="refund")

    html = desk.get("/audit/").content.decode()

    assert f"demo agents (key {key.prefix}…)" in html
    assert f">api:{key.prefix}<" not in html
    assert '<code class="key">refund:H-1</code>' in html


def test_a_case_story_names_the_api_key_that_acted_by_its_name(project, desk):
    from durability.models import ApiKey, Case

    named, _ = ApiKey.issue(project, name="refund bot")
    unnamed, _ = ApiKey.issue(project)
    ledger.intent(project, "refund:H-2", actor=f"api:{named.prefix}", kind="refund")
    ledger.timeout(project, "refund:H-2")
    case = Case.objects.get(effect__key="refund:H-2")

    html = desk.get(f"/cases/{case.pk}/").content.decode()

    assert f"refund bot (key {named.prefix}…)</span>" in html
    assert "an agent (key" not in html
    assert unnamed.prefix not in html
    effect_html = desk.get(f"/effects/{case.effect_id}/").content.decode()
    assert f"refund bot (key {named.prefix}…)</span>" in effect_html
