"""The demo: its seeding shows every state and every case reason, and its simulated agents,
using the real SDK and OpenTelemetry over HTTP, keep producing them on a live server."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command

from durability.models import Case, Effect, Probe, Project, Reason, State
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
    assert re.search(r"^API key: tb_\S+$", printed, re.M)
    # The release bot's repository exists, for the git reconciler to ask.
    assert (tmp_path / "release-repo" / ".git").is_dir()
    # The audit table refuses DELETE: the previous demo is archived, not deleted.
    old.refresh_from_db()
    assert old.name.startswith("demo (archived ") and old.effects.exists()
    assert not old.members.exists() and project.members.count() == 1
    assert not old.reconcilers.filter(enabled=True).exists()


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
