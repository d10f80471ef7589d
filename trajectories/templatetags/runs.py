"""Trajectories' pieces for other apps' pages: the overview's recent runs, a span's
messages and tool call (on the case, effect, approval and run pages)."""

from __future__ import annotations

from typing import Any

from django import template

from durability.models import Project
from trajectories import messages, people
from trajectories.models import Run, Span

register = template.Library()

RECENT_RUNS = 8


@register.inclusion_tag("trajectories/_recent_runs.html")
def recent_runs(project: Project) -> dict[str, Any]:
    """The runs started last (walks run_project_started_idx), with what the running ones
    wait on (`people.waits_of`)."""
    runs = list(Run.objects.filter(project=project).order_by("-started", "-id")[:RECENT_RUNS])
    waits = people.waits_of(project.pk, runs)
    for run in runs:
        run.waiting = waits.get(run.pk)  # type: ignore[attr-defined]
    return {"runs": runs}


@register.inclusion_tag("trajectories/_messages.html")
def span_messages(span: Span | None) -> dict[str, Any]:
    """A model span's messages, asked and answered, each part a few lines with "more"."""
    return {"conversation": messages.conversation_of(span), "span": span}


@register.inclusion_tag("trajectories/_tool_call.html")
def span_tool_call(span: Span | None) -> dict[str, Any]:
    """A tool span's call: the tool, its arguments and its result."""
    return {"call": messages.tool_call_of(span), "span": span}
