"""The demo: its seeding shows every state and every case reason, and its simulated agents,
using the real SDK and OpenTelemetry over HTTP, keep producing them on a live server."""

from __future__ import annotations

import io
import re
import socket
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from durability.models import Approval, Case, Effect, Membership, Probe, Project, Reason, State
from tests.ports import free_port
from trajectories.models import Run, Span

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


# What the live agents make happen on their own (the seeded history has the rest).
AGENTS = {"RF", "REL", "SUP"}
LIVE_STATES = {"succeeded", "failed", "timed_out", "awaiting_approval", "denied"}
LIVE_REASONS = {
    "uncertain",
    "late_success",
    "duplicate_effect",
    "key_reuse_conflict",
    "version_drift",
    "approval_required",
    "authority_denied",
    "unauthorized_effect",
}


def _not_seen_yet(project: Project, seeded: set[int], printed: str) -> list[str]:
    """What of every scenario the live agents have not shown yet: nothing once all is there."""
    live = Effect.objects.filter(project=project).exclude(pk__in=seeded)
    runs = Run.objects.filter(project=project, run_id__in=live.values("run_id"))
    spans = Span.objects.filter(run__in=runs)
    cases = Case.objects.filter(project=project)
    checks = {
        "effects of all three agents": {e.run_id.split("-")[0] for e in live} == AGENTS,
        "each live state": set(live.values_list("state", flat=True)) >= LIVE_STATES,
        "each live reason": set(cases.filter(effect__in=live).values_list("reason", flat=True))
        >= LIVE_REASONS,
        # The provider's dashboard reported a refund no agent made.
        "two orphan receipts": cases.filter(reason="orphan_receipt").count() >= 2,
        # Crashed agents were restarted, and reconcilers settled some effects on their own.
        "a planned crash": "crashed, as planned" in printed,
        "a reconciler's find": Probe.objects.filter(
            effect__in=live, settled="probe_found"
        ).exists(),
        # Their trajectories arrived over OTLP: runs named as the tickets, with model and tool
        # spans; and their run events said how each went.
        "runs of all three agents": {run.run_id.split("-")[0] for run in runs} == AGENTS,
        "agent, model and tool spans": {"agent", "model", "tool"}
        <= set(spans.values_list("kind", flat=True)),
        "runs that went well and badly": {"ok", "error"}
        <= set(runs.values_list("status", flat=True)),
        # Together with the seeded history: every state and every reason.
        "every state": set(project.effects.values_list("state", flat=True)) == EVERY_STATE,
        "every reason": set(cases.values_list("reason", flat=True)) == EVERY_REASON,
    }
    return [what for what, seen in checks.items() if not seen]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(900)
def test_the_agents_bring_every_scenario_to_life(live_server, settings, tmp_path):
    # No Redis: the agents' supervisor runs the sweeps and probes itself, as in `bin/demo`.
    settings.REDIS_URL = ""
    port = free_port()
    project, _ = _seed(tmp_path, port)
    seeded = set(project.effects.values_list("pk", flat=True))
    out = io.StringIO()
    missing = ["anything: the agents never ran"]

    def everything_seen() -> bool:
        missing[:] = _not_seen_yet(project, seeded, out.getvalue())
        return not missing

    # The agents run until every scenario has been seen, or for ten minutes at most.
    call_command(
        "demoagents",
        url=live_server.url,
        provider_port=port,
        dir=tmp_path,
        seconds=600,
        pace=0.3,
        until=everything_seen,
        stdout=out,
    )
    assert missing == []
