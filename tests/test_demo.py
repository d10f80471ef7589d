"""The demo: its seeding shows every state and every case reason, and its simulated agents,
using the real SDK and OpenTelemetry over HTTP, keep producing them on a live server."""

from __future__ import annotations

import io
import re
import socket

import pytest
from django.core.management import call_command

from durability.models import Case, Effect, Probe, Project, Reason, State
from trajectories.models import Run, Span

EVERY_STATE = set(State.values)
EVERY_REASON = set(Reason.values)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@pytest.mark.django_db(transaction=True)
def test_the_agents_bring_every_scenario_to_life(live_server, settings, tmp_path):
    # No Redis: the agents' supervisor runs the sweeps and probes itself, as in `bin/demo`.
    settings.REDIS_URL = ""
    port = _free_port()
    project, _ = _seed(tmp_path, port)
    seeded = set(project.effects.values_list("pk", flat=True))
    out = io.StringIO()
    call_command(
        "demoagents",
        url=live_server.url,
        provider_port=port,
        dir=tmp_path,
        seconds=75,
        pace=0.3,
        stdout=out,
    )
    live = Effect.objects.filter(project=project).exclude(pk__in=seeded)
    assert {e.run_id.split("-")[0] for e in live} == {"RF", "REL", "SUP"}
    states = set(live.values_list("state", flat=True))
    assert {"succeeded", "failed", "timed_out", "awaiting_approval", "denied"} <= states
    reasons = set(Case.objects.filter(effect__in=live).values_list("reason", flat=True))
    assert {
        "uncertain",
        "late_success",
        "duplicate_effect",
        "key_reuse_conflict",
        "version_drift",
        "approval_required",
        "authority_denied",
        "unauthorized_effect",
    } <= reasons
    # The provider's dashboard reported a refund no agent made.
    assert Case.objects.filter(project=project, reason="orphan_receipt").count() >= 2
    # Crashed agents were restarted, and reconcilers settled some effects on their own.
    assert "crashed, as planned" in out.getvalue()
    assert Probe.objects.filter(effect__in=live, settled="probe_found").exists()
    # Their trajectories arrived over OTLP: runs named as the tickets, with model and tool spans.
    runs = Run.objects.filter(project=project, run_id__in=live.values("run_id"))
    assert {run.run_id.split("-")[0] for run in runs} == {"RF", "REL", "SUP"}
    kinds = set(Span.objects.filter(run__in=runs).values_list("kind", flat=True))
    assert {"agent", "model", "tool"} <= kinds
    # And their run events said how each went.
    assert {"ok", "error"} <= set(runs.values_list("status", flat=True))
    # Together with the seeded history: every state and every reason.
    everything = Effect.objects.filter(project=project)
    assert set(everything.values_list("state", flat=True)) == EVERY_STATE
    assert set(Case.objects.filter(project=project).values_list("reason", flat=True)) == (
        EVERY_REASON
    )
