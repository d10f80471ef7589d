"""Which rooms may import which (docs/architecture.md, "Import rules at a glance"): every
module of durability/ and trajectories/ is read with `ast`, nothing is imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("durability", "trajectories")
# A dotted path in a string (an RQ job, `import_module`) is an import too.
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def imports_of(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for every module the file imports, in any scope; `from a import b`
    names `a.b` (`b` may be a module of `a` or a name in it: either way it lies within `a`),
    so a rule can allow one name of a module (`authority.grants.GrantQuery`)."""
    package = list(path.relative_to(root).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}"
        elif isinstance(node, ast.Constant) and DOTTED.fullmatch(str(node.value)):
            yield node.lineno, str(node.value)


# The rooms, as the table of docs/architecture.md has them. `holds`: the files of the room
# (a folder ends with /); a room may always import its own modules. `may_import`: dotted
# prefixes of what else it may import: a module, or one name of a module.
CORE = tuple(
    f"durability.{name}"
    for name in (
        "models",
        "audit",
        "rows",
        "pipeline",
        "redaction",
        "inbound",
        "site",
        "jobs",
        "tallies",
        "notices",
        "exports",
        "paging",
    )
)
MODELS = ("durability.models",)
LEDGER = ("durability.ledger",)
ACCOUNTS = ("durability.accounts",)


@dataclass(frozen=True)
class Room:
    name: str
    holds: tuple[str, ...]
    may_import: tuple[str, ...]
    rule: str  # the table's "may import" column, for the failure message

    @property
    def own(self) -> tuple[str, ...]:
        # (A package's __init__.py is not its package: wiring holds durability/__init__.py.)
        return tuple(
            held.removesuffix("/").removesuffix(".py").replace("/", ".")
            for held in self.holds
            if not held.endswith("__init__.py")
        )


ROOMS = (
    # The models are the floor every room stands on: they import no room, nor the rest of
    # the core (a plug-in they need is named in settings and imported by dotted path).
    Room("models", ("durability/models/",), (), "Django, the standard library, each other"),
    Room(
        "shared core",
        tuple(f"{module.replace('.', '/')}.py" for module in CORE if module not in MODELS),
        MODELS,
        "Django, the standard library, each other, models",
    ),
    Room("accounts", ("durability/accounts/",), CORE, "shared core"),
    Room("retention", ("durability/retention/",), CORE, "shared core"),
    Room("ledger", ("durability/ledger/",), CORE, "shared core"),
    Room(
        "api",
        ("durability/api/",),
        (*CORE, *LEDGER, "durability.authority.grants.GrantQuery"),
        "shared core, ledger, authority's GrantQuery",
    ),
    *(
        Room(
            room,
            (f"durability/{room}/",),
            CORE + LEDGER + ACCOUNTS,
            "shared core, ledger, accounts",
        )
        for room in ("desk", "authority", "reconcilers")
    ),
    Room(
        "search",
        ("durability/search/",),
        (*CORE, *ACCOUNTS, "trajectories.models"),
        "shared core, accounts, trajectories.models",
    ),
    Room(
        "trajectories",
        ("trajectories/",),
        ("durability.models", "durability.accounts")
        + ("durability.api.decorators", "durability.api.schemas", "durability.api.signals")
        + ("durability.ledger.signals", "durability.jobs", "durability.redaction")
        + ("durability.inbound", "durability.rows", "durability.pipeline", "durability.paging")
        + ("durability.admin.ReadOnly",),
        "models, accounts, api.decorators/schemas/signals, ledger.signals, jobs, redaction,"
        " inbound, rows, pipeline, paging,"
        " admin.ReadOnly",
    ),
    Room(
        "project wiring",
        tuple(
            f"durability/{name}.py"
            for name in (
                "settings",
                "urls",
                "cron",
                "openapi",
                "apps",
                "admin",
                "wsgi",
                "asgi",
                "replica",
            )
        )
        + ("durability/__init__.py",),
        APPS,
        "everything",
    ),
    Room(
        # Wiring-like: they use the rooms from outside, but never trajectories.
        "commands, demo, template tags",
        ("durability/management/", "durability/demo/", "durability/templatetags/"),
        ("durability",),
        "any room of durability/, no trajectories",
    ),
    Room(
        # 0004 creates the role groups with accounts.roles.groups_sync.
        "migrations",
        ("durability/migrations/",),
        CORE + ACCOUNTS,
        "shared core, accounts",
    ),
)
# The exceptions to a row, by file. The demo's seed stores its agents' trajectories as the
# events API does (the events ingest and the links it makes), so that seeded cases have runs
# and spans as live ones do.
EXCEPTIONS = {
    "durability/management/commands/demo.py": ("trajectories.ingest", "trajectories.links"),
}
# Across every room: a page view (a `views` module) is imported only by its own room (its
# urls.py); the ledger's row already rules out every view.
VIEWS = "views"


def room_of(path: Path, root: Path = ROOT) -> Room | None:
    """The room holding the file: the longest of the `holds` that matches."""
    relative = path.relative_to(root).as_posix()
    held = [
        (len(entry), room)
        for room in ROOMS
        for entry in room.holds
        if relative == entry or (entry.endswith("/") and relative.startswith(entry))
    ]
    return max(held, key=lambda pair: pair[0])[1] if held else None


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _model_names(app: str, root: Path) -> set[str]:
    """The classes of the app's models: its models.py, or every module of its models/."""
    found = [root / app / "models.py", *sorted((root / app / "models").glob("*.py"))]
    return {
        node.name.lower()
        for models in found
        if models.exists()
        for node in ast.parse(models.read_text()).body
        if isinstance(node, ast.ClassDef)
    }


def _is_module(path: Path) -> bool:
    return path.is_dir() or path.with_suffix(".py").exists()


def violations(paths: list[Path], root: Path = ROOT) -> list[str]:
    """One line per import that breaks its room's row: the file, the import, the rule."""
    # Django names a model by its label in strings ("durability.effect" in a migration's
    # foreign key): that is the app's models module.
    labels = {app: _model_names(app, root) for app in APPS}
    found = []
    for path in paths:
        room = room_of(path, root)
        where = path.relative_to(root).as_posix()
        if room is None:
            found.append(f"{where} sits in no room of the table")
            continue
        for line, module in imports_of(path, root):
            app, _, rest = module.partition(".")
            if app not in APPS:
                continue  # Django, the standard library, third-party packages
            first = rest.split(".")[0]
            if first.lower() in labels[app] and not _is_module(root / app / first):
                module = f"{app}.models.{rest}"
            own = _within(module, room.own)
            allowed = room.may_import + EXCEPTIONS.get(where, ())
            if not own and VIEWS in module.split("."):
                found.append(
                    f"{where}:{line} imports {module}: a room never imports another"
                    " room's page views"
                )
            elif not own and not _within(module, allowed):
                found.append(f"{where}:{line} imports {module}: {room.name} may import {room.rule}")
    return found


def modules_of(root: Path = ROOT) -> list[Path]:
    return sorted(path for app in APPS for path in (root / app).rglob("*.py"))


def test_every_module_of_both_apps_sits_in_a_room():
    assert modules_of(), "the check reads nothing"
    found = violations([path for path in modules_of() if room_of(path) is None])
    assert not found, "\n".join(found)


@pytest.mark.parametrize("room", ROOMS, ids=[room.name for room in ROOMS])
def test_the_room_imports_only_what_its_row_of_the_table_allows(room):
    paths = [path for path in modules_of() if room_of(path) == room]
    assert paths, f"no module sits in {room.name}"
    found = violations(paths)
    assert not found, "\n".join(found)


def test_the_layout_check_sees_every_kind_of_import(tmp_path):
    # Guards the tests above against passing because they read nothing.
    source = tmp_path / "durability" / "ledger" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "import trajectories.links\n"
        "from durability.desk import views\n"
        "from ..authority import grants\n"
        "def later():\n"
        "    from durability.accounts.access import project_access\n"
        "JOB = 'trajectories.jobs.effect_link'\n"
    )
    modules = {module for _, module in imports_of(source, root=tmp_path)}
    assert {
        "trajectories.links",
        "durability.desk.views",
        "durability.authority.grants",
        "durability.accounts.access.project_access",
        "trajectories.jobs.effect_link",
    } <= modules


def test_a_violation_names_the_file_the_import_and_the_rule(tmp_path):
    files = {
        "durability/models/effects.py": (
            "class Effect: ...\n"
            "from durability.models.projects import Project\n"  # allowed
            "from durability.reconcilers.base import Reconciler\n"
        ),
        "durability/models/projects.py": "class Project: ...\n",
        "durability/ledger/probe.py": (
            "from durability.models import Effect\n"  # allowed
            "def later():\n"
            "    from durability.api.decorators import authorize\n"
        ),
        "durability/api/views.py": (
            "from durability.authority.grants import GrantQuery\n"  # allowed
            "from durability.authority.grants import grant_create\n"
        ),
        "durability/templatetags/probes.py": "from durability.reconcilers.views import PANEL\n",
        "trajectories/migrations/0001_runs.py": "TO = 'durability.effect'\n",  # allowed
        "durability/elsewhere.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(modules_of(tmp_path), root=tmp_path) == [
        "durability/api/views.py:2 imports durability.authority.grants.grant_create:"
        " api may import shared core, ledger, authority's GrantQuery",
        "durability/elsewhere.py sits in no room of the table",
        "durability/ledger/probe.py:3 imports durability.api.decorators.authorize:"
        " ledger may import shared core",
        "durability/models/effects.py:3 imports durability.reconcilers.base.Reconciler:"
        " models may import Django, the standard library, each other",
        "durability/templatetags/probes.py:1 imports durability.reconcilers.views.PANEL:"
        " a room never imports another room's page views",
    ]
