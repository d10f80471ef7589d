"""An effect and its open cases carry the kind, target and who made the latest intent, so
that the pages filter and count on them without reading attempts or effects."""

from __future__ import annotations

import importlib

from django.apps import apps

from durability.models import Case, Effect, Reason
from tests.desk.support import uncertain_case
from tests.ledger import support as ledger

MIGRATION = "durability.migrations.0020_effect_agent_hours"
CASES_MIGRATION = "durability.migrations.0021_case_names"


def test_an_effect_names_the_agent_of_its_latest_intent(project):
    ledger.intent(project, "k1", context={"workflow": "refund-bot"}, replay="safe")
    ledger.failure(project, "k1", definitive=True)
    ledger.intent(project, "k1", context={"workflow": "refund-bot", "agent": "refund-v2"})
    effect = Effect.objects.get(key="k1")
    assert (effect.agent, effect.workflow) == ("refund-v2", "refund-bot")


def test_the_migration_fills_in_the_agent_of_effects_recorded_before_it(project):
    ledger.intent(project, "old:1", context={"agent": "billing-agent", "workflow": "billing"})
    ledger.intent(project, "old:2", context={"workflow": "release-bot"})
    ledger.intent(project, "old:3")
    Effect.objects.update(agent="", workflow="")
    importlib.import_module(MIGRATION).agents_backfill(apps, None)
    assert dict(Effect.objects.values_list("key", "agent")) == {
        "old:1": "billing-agent",
        "old:2": "release-bot",
        "old:3": "",
    }
    assert Effect.objects.get(key="old:1").workflow == "billing"


def test_a_case_copies_its_effect_and_a_retry_updates_its_open_cases(project):
    ledger.intent(project, "k1", context={"workflow": "refund-bot"}, replay="safe")
    ledger.intent(project, "k1", context={"workflow": "refund-bot"}, request={"other": 1})
    conflict = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)
    assert (conflict.kind, conflict.target, conflict.agent) == ("payment", "stripe", "refund-bot")
    ledger.failure(project, "k1", definitive=True)
    ledger.intent(project, "k1", context={"agent": "refund-v2"}, run_id="run-7")
    conflict.refresh_from_db()
    assert (conflict.agent, conflict.workflow, conflict.run_id) == ("refund-v2", "", "run-7")


def test_the_migration_fills_in_the_names_of_cases_opened_before_it(project):
    case = uncertain_case(project, "old:1", context={"workflow": "release-bot"}, target="k8s")
    Case.objects.update(kind="", target="", agent="", workflow="")
    importlib.import_module(CASES_MIGRATION).names_backfill(apps, None)
    case.refresh_from_db()
    assert (case.kind, case.target, case.agent, case.workflow) == (
        "payment",
        "k8s",
        "release-bot",
        "release-bot",
    )
