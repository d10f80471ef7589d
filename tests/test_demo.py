"""The demo: its seeding shows every state and every case reason, over a week of history with
the agents' runs, and its logins for each role. Its simulated agents at work on a live server,
and every page they leave behind, are tests/test_live_demo.py's."""

from __future__ import annotations

import io
import re
import socket
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from durability.models import Approval, Membership, Project, Reason, State
from trajectories.models import Run

EVERY_STATE = set(State.values)
EVERY_REASON = set(Reason.values)


def _seed(tmp_path, port: int = 8765) -> tuple[Project, str]:
    out = io.StringIO()
    call_command("demo", provider_port=port, dir=tmp_path, stdout=out)
    return Project.objects.get(name="demo"), out.getvalue()


def test_each_seeding_starts_a_fresh_project_with_every_state_and_case_reason(db, tmp_path):
    old, _ = _seed(tmp_path)
    project, printed = _seed(tmp_path)
    assert set(project.effects.values_list("state", flat=True)) == EVERY_STATE
    assert set(project.cases.values_list("reason", flat=True)) == EVERY_REASON
    assert re.search(r"^Operator login: operator / \S+$", printed, re.M)
    assert re.search(r"^Admin login: admin / \S+$", printed, re.M)
    roles = dict(Membership.objects.filter(project=project).values_list("user__username", "role"))
    assert roles == {"operator": "operator", "admin": "admin"}
    assert re.search(r"^API key: tb_\S+$", printed, re.M)
    # The release bot's repository exists, for the git reconciler to ask.
    assert (tmp_path / "release-repo" / ".git").is_dir()
    # The audit table refuses DELETE: the previous demo is archived, not deleted.
    old.refresh_from_db()
    assert old.name.startswith("demo (archived ") and old.effects.exists()
    assert not old.members.exists() and project.members.count() == 2
    assert not old.reconcilers.filter(enabled=True).exists()


def test_the_seeded_history_looks_like_a_deployments_past(db, tmp_path):
    project, _ = _seed(tmp_path)
    now = timezone.now()
    created = sorted(project.effects.values_list("created", flat=True))
    # A week of work, not one moment: effects on each of the past days, the last minutes ago.
    assert now - created[0] > timedelta(days=6)
    days = {(now - moment).days for moment in created}
    assert days >= set(range(7))
    assert timedelta(0) < now - created[-1] < timedelta(hours=1)
    opened = sorted(project.cases.values_list("opened", flat=True))
    assert now - opened[0] > timedelta(hours=12)
    # Every approval decided through the approvals service: none left open for an effect
    # that no longer awaits one.
    for approval in Approval.objects.filter(project=project).select_related("effect"):
        assert (approval.status == "open") == (approval.effect.state == "awaiting_approval")
    assert Approval.objects.get(effect__key="refund:H-112").status == "approved"
    # Each seeded case's effect has its run: the agent's span, the model request and the tool
    # call that made it.
    for case in project.cases.exclude(reason="orphan_receipt").select_related("effect"):
        run = Run.objects.get(project=project, run_id=case.effect.run_id)
        assert {"agent", "model", "tool"} <= set(run.spans.values_list("kind", flat=True))
        assert run.spans.filter(tool_call_id=case.effect.tool_call_id).exists(), case


def test_the_agents_say_so_when_their_providers_port_is_taken(db, tmp_path):
    project, _ = _seed(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot listen on port {port}"):
            call_command("demoagents", provider_port=port, dir=tmp_path, url="http://127.0.0.1:9")
