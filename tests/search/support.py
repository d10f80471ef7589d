"""Helpers for the search's specifications: the page's groups, read back from its HTML."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client

from durability.models import Project
from trajectories.models import Run, RunTrace


def found(client: Client, q: str, **params: str) -> dict[str, list[str]]:
    """The search page for `q`: each kind's results, as the text of their first cells, in
    the page's order."""
    r = client.get("/search/", {"q": q, **params})
    assert r.status_code == 200, r.content
    return groups_of(r.content.decode())


def groups_of(html: str) -> dict[str, list[str]]:
    groups = {}
    for kind, body in re.findall(
        r'<section class="search-group" id="found-(\w+)"(.*?)</section>', html, re.S
    ):
        groups[kind] = [
            re.sub(r"\s+", " ", cell).strip()
            for cell in re.findall(r"<tr>\s*<td><a [^>]*>(.*?)</a>", body, re.S)
        ]
    return groups


def run(project: Project, run_id: str, *traces: str, **fields: Any) -> Run:
    made = Run.objects.create(project=project, run_id=run_id, **fields)
    for trace_id in traces:
        RunTrace.objects.create(project=project, trace_id=trace_id, run=made)
    return made
