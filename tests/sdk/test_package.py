"""tallybook-sdk as an agent gets it: the wheel and the sdist build with the standard
tooling, and the wheel alone, in fresh virtualenvs of the oldest and the newest Python
supported, installs nothing else and records a real effect on a running server."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from uv import find_uv_bin

from durability.models import Effect, Receipt
from tests.sdk.support import ROOT, find_python

HERE = Path(__file__).parent
# What opentelemetry-api brings along (its only requirement).
OTEL = {"opentelemetry-api", "typing-extensions", "typing_extensions"}


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist, built from a copy of sdk/ so the checkout stays as it was;
    once per run: the first of the run's xdist workers to need them builds them (in the
    workers' common temporary folder, under a lock) and the others wait and take them."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # every worker's base folder is in it: one per run
    work, built = shared / "sdk-build", shared / "sdk-build" / "dist"
    with (shared / "sdk-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.is_dir():
            shutil.rmtree(work, ignore_errors=True)  # a build that failed before
            source = shutil.copytree(
                ROOT / "sdk",
                work / "sdk",
                ignore=shutil.ignore_patterns("build", "dist", "*.egg-info"),
            )
            # The build's isolated environments made by uv rather than pip: the same
            # setuptools backend, in a second rather than several.
            _run(
                sys.executable,
                "-m",
                "build",
                "--installer",
                "uv",
                "--outdir",
                work / "building",
                source,
            )
            (work / "building").rename(built)
    return built


def test_the_wheel_holds_the_sdk_alone_and_the_sdist_its_readme_and_changelog(dist):
    (wheel,) = dist.glob("tallybook_sdk-*.whl")
    (sdist,) = dist.glob("tallybook_sdk-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "tallybook",
        wheel.name.rsplit("-", 3)[0] + ".dist-info",
    }
    assert "tallybook/py.typed" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    requires = [line for line in metadata.decode().splitlines() if line.startswith("Requires-")]
    # Nothing but the standard library unless an extra asks for more.
    assert requires[0] == "Requires-Python: >=3.10"
    assert 'Requires-Dist: opentelemetry-api<2,>=1.20; extra == "otel"' in requires
    assert all("; extra == " in line for line in requires[1:]), requires
    with tarfile.open(sdist) as archive:
        files = {Path(name).name for name in archive.getnames()}
    assert {"README.md", "CHANGELOG.md", "pyproject.toml", "py.typed"} <= files


def _fresh_virtualenv(base: Path, venv: Path) -> Path:
    """What `python -m venv` makes: a virtualenv with the pip (and before 3.12 the
    setuptools) that the interpreter's ensurepip bundles. uv installs those very wheels, in a
    fraction of a second where ensurepip's pip takes seconds to install itself."""
    _run(base, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    bundled = _run(
        python, "-c", "import ensurepip, pathlib; print(pathlib.Path(ensurepip.__file__).parent)"
    )
    wheels = sorted((Path(bundled.strip()) / "_bundled").glob("*.whl"))
    assert any(w.name.startswith("pip-") for w in wheels), wheels
    _run(find_uv_bin(), "pip", "install", "--quiet", "--python", python, "--no-index", *wheels)
    return python


@pytest.mark.parametrize(("version", "extra"), [("3.10", ""), ("3.13", "[otel]")])
def test_a_fresh_virtualenv_gets_only_the_sdk_and_records_an_effect(
    dist, version, extra, live_server, api_key, tmp_path
):
    (wheel,) = dist.glob("tallybook_sdk-*.whl")
    venv = tmp_path / "venv"
    python = _fresh_virtualenv(find_python(version), venv)
    # The SDK from the wheel, offline; the extra's opentelemetry-api from the package index.
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        *(("--no-index",) if not extra else ()),
        f"{wheel}{extra}",
    )

    listed = json.loads(_run(python, "-m", "pip", "list", "--format=json"))
    installed = {p["name"].lower() for p in listed} - {"pip", "setuptools"}
    assert installed == {"tallybook-sdk"} | (OTEL & installed if extra else set())
    assert not extra or "opentelemetry-api" in installed

    out = json.loads(
        _run(
            python,
            HERE / "installed_agent.py",
            live_server.url,
            api_key,
            tmp_path / "spool",
            cwd=tmp_path,
        )
    )

    assert out["file"].startswith(str(venv)) and out["python"] == [
        int(n) for n in version.split(".")
    ]
    assert out["server_code"] == [] and out["otel"] == bool(extra) and out["delivered"]
    assert out["results"] == [{"id": "msg-for-ann@example.com"}] * 2
    effect = Effect.objects.get()
    assert (effect.key, effect.state) == ("email:venv-1:ann@example.com", "succeeded")
    assert Receipt.objects.get().data == {"result": {"id": "msg-for-ann@example.com"}}
