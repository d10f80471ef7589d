"""Trajectories' pieces for other apps' pages: the overview's recent runs."""

from __future__ import annotations

from typing import Any

from django import template

from durability.models import Project
from trajectories.models import Run

register = template.Library()

RECENT_RUNS = 8


@register.inclusion_tag("trajectories/_recent_runs.html")
def recent_runs(project: Project) -> dict[str, Any]:
    """The runs started last; walks run_project_started_idx."""
    return {
        "runs": list(Run.objects.filter(project=project).order_by("-started", "-id")[:RECENT_RUNS])
    }
