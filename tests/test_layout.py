"""Which rooms may import which: read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURABILITY = ROOT / "durability"
# Project-level wiring may import both apps.
WIRING = {DURABILITY / name for name in ("urls.py", "openapi.py", "cron.py", "settings.py")}
# Rooms the ledger never imports: it is imported by them, never the other way round.
NOT_FOR_THE_LEDGER = (
    "trajectories",
    "durability.desk",
    "durability.authority",
    "durability.accounts",
)
# A dotted path in a string (an RQ job, `import_module`) is an import too.
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def imports_of(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for every module the file imports, in any scope; `from a import b`
    names both `a` and `a.b`, as `b` may be a module."""
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
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Constant) and DOTTED.fullmatch(str(node.value)):
            yield node.lineno, str(node.value)


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _where(path: Path, line: int, module: str) -> str:
    return f"{path.relative_to(ROOT)}:{line} imports {module}"


def test_the_ledger_imports_no_trajectories_no_views_and_none_of_the_rooms_that_use_it():
    found = [
        _where(path, line, module)
        for path in sorted((DURABILITY / "ledger").glob("*.py"))
        for line, module in imports_of(path)
        if _within(module, NOT_FOR_THE_LEDGER) or "views" in module.split(".")
    ]
    assert found == []


def test_nothing_in_durability_but_the_project_wiring_imports_trajectories():
    found = [
        _where(path, line, module)
        for path in sorted(DURABILITY.rglob("*.py"))
        if path not in WIRING
        for line, module in imports_of(path)
        if _within(module, ("trajectories",))
    ]
    assert found == []


def test_the_layout_check_sees_every_kind_of_import(tmp_path):
    # Guards the two tests above against passing because they read nothing.
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
