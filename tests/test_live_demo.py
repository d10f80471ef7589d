"""The living demo: its agents, using the real SDK and OpenTelemetry over HTTP, bring every
scenario to life on a live server; then every page they and the reconcilers left behind opens,
for each role, without a server error, a template error or (in Chromium) a console error.

The crawl is what the tests of seeded rows cannot be: what agents and reconcilers actually
leave behind (a provider's time as JSON text, an approval decided by someone else, a run
still waiting) is what the pages must open.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import Q
from django.template import VariableDoesNotExist
from django.template.context import BaseContext
from django.test import Client

from durability.models import (
    Approval,
    AuditAction,
    Case,
    Effect,
    Membership,
    Probe,
    Project,
    Reason,
    Role,
    State,
)
from tests.browser import CHROMIUM, browser, watched_page
from tests.ports import free_port
from trajectories.models import Run, Span

__all__ = ["browser"]  # the browser fixture, asked for by name when Chromium is there

EVERY_STATE = set(State.values)
EVERY_REASON = set(Reason.values)
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
        # Crashed agents were restarted, and reconcilers settled some effects on their own,
        # with the provider's time of the refund as their evidence.
        "a planned crash": "crashed, as planned" in printed,
        "a reconciler's find": Probe.objects.filter(
            effect__in=live, settled="probe_found", evidence__observed_at__isnull=False
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


# -- the crawl -------------------------------------------------------------------------------

# Links the crawl does not follow: downloads, Django's admin, logging out, the API.
LEAVES = ("/admin/", "/logout/", "/api/", "/v1/", "/static/")
# The crawl opens each page it is given as `every` page; any other page it reaches is one of
# its shape (path and query names, ids and values aside), and each shape is opened this often
# per role and per kind (full page, or fragment as htmx asks for it): three times by the
# admin, whose crawl opens the instances of a shape that differ in ids and query values, and
# once by the operator and the viewer, to whom a role changes what a page offers or refuses
# (as `_every` gives them one page of each kind).
PER_SHAPE = {"admin": 3, "operator": 1, "viewer": 1}
LINK = re.compile(r'\s(href|hx-get)="([^"#]*)"')


def _shape(url: str) -> str:
    parts = urlsplit(url)
    names = sorted({pair.split("=")[0] for pair in parts.query.split("&") if pair})
    return re.sub(r"\d+", "N", parts.path) + "?" + "&".join(names)


class TemplateLookups(logging.Handler):
    """Django's template engine logs every variable it could not resolve (and shows nothing):
    a missing key, an optional relation that is None, a variable a view does not always pass
    are the templates' way; an object without the attribute a template asks of it is a typo
    that shows nothing where a value should be, and is noted here."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.typos: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, VariableDoesNotExist) or len(error.params) != 2:
            return
        name, owner = error.params
        if owner is None or isinstance(owner, Mapping | BaseContext | list | tuple | str):
            return
        template = record.args[1] if isinstance(record.args, tuple) else "?"
        self.typos[f"{template}: {type(owner).__name__} has no {name!r}"] += 1


@contextmanager
def template_lookups() -> Iterator[TemplateLookups]:
    handler = TemplateLookups()
    logger = logging.getLogger("django.template")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the debug records are this handler's alone
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@dataclass
class Crawl:
    """Every page reachable from `start` for one logged-in client, and what went wrong."""

    client: Client
    role: str
    # The pages opened whatever their shape (url, as a fragment).
    every: set[tuple[str, bool]]
    opened: int = 0
    problems: list[str] = field(default_factory=list)
    # One page of each shape, for the browser's pass.
    samples: dict[str, str] = field(default_factory=dict)

    def run(self, start: list[tuple[str, bool]]) -> None:
        queue = deque([*sorted(self.every), *start])
        seen: set[tuple[str, bool]] = set()
        shapes: Counter[tuple[str, bool]] = Counter()
        while queue:
            page = queue.popleft()
            shape = (_shape(page[0]), page[1])
            if page in seen or (page not in self.every and shapes[shape] >= PER_SHAPE[self.role]):
                continue
            seen.add(page)
            shapes[shape] += 1
            queue.extend(self.open(*page))

    def open(self, url: str, fragment: bool) -> Iterator[tuple[str, bool]]:
        headers = {"HX-Request": "true"} if fragment else {}
        response = self.client.get(url, headers=headers)
        self.opened += 1
        status = response.status_code
        # A viewer is refused what needs another role (403); nothing else may fail or be missing.
        if status >= 500 or status == 404 or (status == 403 and self.role != "viewer"):
            self.problems.append(f"{self.role} {url}{' (htmx)' if fragment else ''}: {status}")
        if status != 200 or not response["Content-Type"].startswith("text/html"):
            return
        if not fragment:
            self.samples.setdefault(_shape(url), url)
        for attribute, href in LINK.findall(response.content.decode()):
            link = urlsplit(unescape(href))
            if link.netloc or not link.path.startswith("/") or link.path.startswith(LEAVES):
                continue
            if link.path.endswith((".csv", ".json")):
                continue
            yield link.path + (f"?{link.query}" if link.query else ""), attribute == "hx-get"


def _people(project: Project) -> dict[str, User]:
    """The seeded operator and admin, and a viewer."""
    people = {
        role: User.objects.get(membership__project=project, membership__role=role)
        for role in (Role.ADMIN, Role.OPERATOR)
    }
    viewer = User.objects.create_user("viewer", password="password")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    return {"admin": people[Role.ADMIN], "operator": people[Role.OPERATOR], "viewer": viewer}


# Where each role's crawl starts: the pages the header leads to, the search, and the audit log
# of each kind of entry.
START = ["/", "/queue/", "/queue/?grouped=1", "/effects/", "/runs/", "/audit/", "/approvals/"]
START += ["/authority/", "/search/?q=refund", "/search/?q=RF-0001"]
START += [f"/audit/?action={action}" for action in AuditAction.values]


def _one_of_each(objects: Any, kind: Any) -> list[Any]:
    """The first of `objects` (by id) of each `kind` (a function of one of them)."""
    chosen: dict[Any, Any] = {}
    for row in objects.order_by("pk"):
        chosen.setdefault(kind(row), row)
    return list(chosen.values())


def _every(project: Project, seeded: set[int], role: str) -> set[tuple[str, bool]]:
    """The pages a role's crawl opens whatever their shape. The admin's: every case and
    approval, and every effect the agents made or a case is about (the seeded routine is the
    same few pages many times over), their runs, and each of their spans' detail as htmx asks
    for it (no role changes those; the full page of a span is its run's page with it open).
    The operator's and the viewer's: one case for each reason, severity, open or closed,
    assigned or not and snoozed or not, one approval for each status, one effect for each
    state and agent, and the effect of one case of each reason: each kind of page each
    scenario leaves, as each role sees it (the other instances of a kind differ in ids and
    text, which the admin's crawl opens)."""
    cases = Case.objects.filter(project=project)
    effects = Effect.objects.filter(project=project).exclude(
        Q(pk__in=seeded) & ~Q(pk__in=cases.values("effect_id"))
    )
    approvals = Approval.objects.filter(project=project)
    if role != "admin":
        kinds = _one_of_each(
            cases,
            lambda c: (
                c.reason,
                c.severity,
                c.closed is None,
                c.assignee_id is None,
                c.snoozed_until is None,
            ),
        )
        cases = cases.filter(pk__in=[c.pk for c in kinds])
        picked = [e.pk for e in _one_of_each(effects, lambda e: (e.state, e.agent))]
        every_case = Case.objects.filter(project=project)
        picked += [c.effect_id for c in _one_of_each(every_case, lambda c: c.reason)]
        effects = effects.filter(pk__in=picked)
        approvals = approvals.filter(
            pk__in=[a.pk for a in _one_of_each(approvals, lambda a: a.status)]
        )
    pages = [c.get_absolute_url() for c in cases]
    pages += [a.get_absolute_url() for a in approvals]
    pages += [e.get_absolute_url() for e in effects]
    every = {(page, False) for page in pages}
    if role == "admin":
        runs = Run.objects.filter(project=project, run_id__in=effects.values("run_id"))
        every |= {(run.get_absolute_url(), False) for run in runs}
        spans = Span.objects.filter(project=project, run__in=runs)
        every |= {(span.get_absolute_url(), True) for span in spans}
    return every


def _browser_pass(browser: Any, live_url: str, password: str, pages: list[str]) -> list[str]:
    """Open `pages` in Chromium as the operator; returns what went wrong on them: a server
    error, a script's error, a refusal of the Content Security Policy."""
    page, violations, errors = watched_page(browser, live_url)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/login/")
    page.fill("input[name=username]", "operator")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/$"))
    problems: list[str] = []
    for path in pages:
        response = page.goto(path)
        if response is None or response.status >= 500:
            problems.append(f"browser {path}: {response.status if response else 'no answer'}")
        problems += [f"browser {path}: {error}" for error in errors]
        errors.clear()
    page.context.close()
    # Each refusal names its page.
    return problems + [f"browser: {violation}" for violation in violations]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(900)
def test_the_living_demo_brings_every_scenario_to_life_and_every_page_opens(
    live_server, settings, tmp_path: Path, request: pytest.FixtureRequest
):
    # No Redis: the agents' supervisor runs the sweeps and probes itself, as in `bin/demo`.
    settings.REDIS_URL = ""
    port = free_port()
    out = io.StringIO()
    call_command("demo", provider_port=port, dir=tmp_path, stdout=out)
    project = Project.objects.get(name="demo")
    operator_password = re.search(r"^Operator login: operator / (\S+)$", out.getvalue(), re.M)
    assert operator_password is not None
    seeded = set(project.effects.values_list("pk", flat=True))
    printed = io.StringIO()
    missing = ["anything: the agents never ran"]

    def everything_seen() -> bool:
        missing[:] = _not_seen_yet(project, seeded, printed.getvalue())
        return not missing

    # The agents run until every scenario has been seen, or for ten minutes at most, at a
    # fifth of their pauses (the slow provider still answers after the deadline and a sweep).
    call_command(
        "demoagents",
        url=live_server.url,
        provider_port=port,
        dir=tmp_path,
        seconds=600,
        pace=0.2,
        until=everything_seen,
        stdout=printed,
    )
    assert missing == []

    # Every page each role can reach, and every variable a template asked of an object that
    # has no such attribute.
    started, cpu = time.monotonic(), time.process_time()
    crawls: dict[str, Crawl] = {}
    with template_lookups() as lookups:
        for role, user in _people(project).items():
            client = Client(raise_request_exception=False)
            client.force_login(user)
            crawl = Crawl(client, role, _every(project, seeded, role))
            crawl.run([(page, False) for page in START])
            crawls[role] = crawl
    took = time.monotonic() - started
    opened = sum(c.opened for c in crawls.values())
    print(
        f"crawl: {opened} pages and fragments opened in {took:.1f} s "
        f"({time.process_time() - cpu:.1f} s of this process's CPU)"
    )
    assert [p for c in crawls.values() for p in c.problems] == []
    assert dict(lookups.typos) == {}

    # A page of each shape the operator opened, in Chromium: no script fails on any of them.
    if CHROMIUM.exists():
        sample = sorted(crawls["operator"].samples.values())
        browser = request.getfixturevalue("browser")
        assert _browser_pass(browser, live_server.url, operator_password[1], sample) == []
        print(f"browser: {len(sample)} pages opened")
