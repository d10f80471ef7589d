"""Shared fixtures: a project with an API key, named personas, and a JSON API client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from durability.models import ApiKey, Membership, Project, Role
from tests import emptying, isolation
from tests.ledger import support as ledger

# The tests serve plain HTTP on 127.0.0.1, with DEBUG off: the production settings' HTTPS
# redirect and secure cookies are turned off as a local start turns them off, here (the
# settings were read before this file) and for the servers the tests start.
PLAIN_HTTP = ["SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"]
for _name in PLAIN_HTTP:
    os.environ[_name] = "0"
    setattr(settings, _name, False)


@dataclass
class Api:
    """A test client that speaks JSON to /api/v1/ with one project's key."""

    client: Client
    key: str

    def post(self, path: str, body: Any, **headers: str) -> Any:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.client.post(
            f"/api/v1/{path}",
            data=data,
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.key}", **headers},
        )

    def get(self, path: str, **params: str) -> Any:
        return self.client.get(
            f"/api/v1/{path}", params, headers={"Authorization": f"Bearer {self.key}"}
        )

    def intent(self, key: str = "k1", **fields: Any) -> Any:
        """An intent naming the project's catch-all grant unless `authority` is given."""
        body = {"key": key, "kind": "payment", "target": "stripe", "request": {"amount": 1}}
        body.update(fields)
        if "authority" not in body:
            project = Project.objects.get(api_keys__prefix=self.key[:11])
            body["authority"] = {"grant": ledger.everything(project).pk}
        return self.post("intents", body)

    def receipt(self, key: str = "k1", external_id: str = "ext-1", **fields: Any) -> Any:
        return self.post(
            "receipts", {"key": key, "system": "stripe", "external_id": external_id, **fields}
        )

    def timeout(self, key: str = "k1", reason: str = "no answer") -> Any:
        return self.post("timeouts", {"key": key, "reason": reason})

    def failure(self, key: str = "k1", error: str = "boom", definitive: bool = False) -> Any:
        return self.post("failures", {"key": key, "error": error, "definitive": definitive})


emptying.install()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--screenshots",
        metavar="DIR",
        type=Path,
        help="save the browser tests' screenshots (the README's) in DIR (bin/screenshots: "
        "docs/screenshots); without it, in each test's temporary folder",
    )


_POSTGRES = "django.db.backends.postgresql"
# The process that builds this code's templates while its xdist workers start (tests/isolation.py).
_template_builder: subprocess.Popen[bytes] | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before the run creates its test databases, drop those this checkout's killed runs left
    (tests/isolation.py): once, in the run's controller, not in each xdist worker. With
    workers, start building this code's templates now, unless an earlier run of the same code
    built them, while they start and collect the tests (each ~10 s of one core): they find
    them built, or wait for them (its lock)."""
    global _template_builder
    if hasattr(session.config, "workerinput"):
        return
    postgres = [d for d in settings.DATABASES.values() if d["ENGINE"] == _POSTGRES]
    for database in postgres:
        isolation.drop_dead_runs_databases(database)
    unbuilt = [d for d in postgres if not isolation.template_built(d)]
    if unbuilt and session.config.pluginmanager.has_plugin("dsession"):
        build = "from tests import isolation; isolation.build_templates()"
        # Its output is not shown: if it fails, the first worker builds the template again,
        # and its failure is the test run's.
        _template_builder = subprocess.Popen(
            [sys.executable, "-c", build],
            cwd=isolation.ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


# The living demo runs first: a minute and more on one worker, most of it its agents' waiting,
# beside which the other worker runs the rest of the suite. In its place in the collected
# order it started near the end, and one worker ran it alone while the other sat idle.
FIRST = ("tests/test_live_demo.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of FIRST first, the others in their collected order (a stable sort: every
    xdist worker collects the same order, as it must)."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the templates of other code that no run has used for a while (tests/isolation.py;
    this code's is kept for its next run), in the run's controller."""
    if hasattr(session.config, "workerinput"):
        return
    if _template_builder is not None:
        _template_builder.terminate()  # done long since, unless the run ended as it started
        _template_builder.wait()
    for database in settings.DATABASES.values():
        if database["ENGINE"] == _POSTGRES:
            isolation.drop_unused_templates(database)


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """pytest-django's, each PostgreSQL test database a copy of this code's template,
    migrated once for all the processes of its runs (tests/isolation.py), not migrated by
    each. Every database is set up, and pytest-django's --reuse-db and --no-migrations have
    no say: each run has databases of its own, migrated."""
    from django.test.utils import setup_databases, teardown_databases

    verbosity = request.config.option.verbose
    with django_db_blocker.unblock(), isolation.from_templates():
        databases = setup_databases(verbosity=verbosity, interactive=False)
    yield
    with django_db_blocker.unblock():
        teardown_databases(databases, verbosity=verbosity)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request: pytest.FixtureRequest) -> None:
    """This run's own test database (tests/isolation.py), then pytest-django's per-worker
    suffix."""
    for database in settings.DATABASES.values():
        test = database.setdefault("TEST", {})
        if database["ENGINE"] != "django.db.backends.sqlite3" and not test.get("NAME"):
            test["NAME"] = isolation.own_test_database(database["NAME"])
    request.getfixturevalue("django_db_modify_db_settings_parallel_suffix")


@pytest.fixture(scope="session", autouse=True)
def _own_redis_database() -> Iterator[isolation.RedisClaim | None]:
    """This process's own Redis database (tests/isolation.py), for the rest of the session:
    for its queues, its live server and the processes its tests start."""
    if not settings.REDIS_URL:
        yield None
        return
    claim = isolation.RedisClaim(settings.REDIS_URL)
    settings.REDIS_URL = os.environ["REDIS_URL"] = claim.url
    settings.RQ_QUEUES = {
        name: {**queue, "URL": claim.url} for name, queue in settings.RQ_QUEUES.items()
    }
    yield claim
    claim.release()


@pytest.fixture(autouse=True)
def _redis_claim_renewed(_own_redis_database: isolation.RedisClaim | None) -> None:
    if _own_redis_database is not None:
        _own_redis_database.renew()


@pytest.fixture
def screenshots(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a browser test saves its screenshots: never a tracked file unless asked."""
    chosen: Path | None = request.config.getoption("screenshots")
    folder = request.config.invocation_params.dir / chosen if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """Test users have throwaway passwords: hash them cheaply (the default takes ~1s)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _reconcilers_reach_local_servers(settings: Any) -> None:
    """The tests' fake providers and git servers listen on 127.0.0.1, which reconcilers may
    not reach unless allowed (as bin/demo allows it): tests of that rule set it back."""
    settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture(autouse=True)
def _git_reconcilers_read_the_tests_folders(settings: Any, tmp_path_factory: Any) -> None:
    """The tests' git repositories live under pytest's temporary folder, which a git
    reconciler may not read unless allowed (as bin/demo allows its own): tests of that
    rule set it back."""
    settings.TALLYBOOK_RECONCILER_GIT_ROOTS = [str(tmp_path_factory.getbasetemp())]


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="alpha")


@pytest.fixture
def api_key(project: Project) -> str:
    _, raw = ApiKey.issue(project)
    return raw


@pytest.fixture
def api(client: Client, api_key: str) -> Api:
    return Api(client, api_key)


@pytest.fixture
def other_api(client: Client, db: None) -> Api:
    """A second project's key: a stranger to `project`."""
    other = Project.objects.create(name="beta")
    _, raw = ApiKey.issue(other)
    return Api(client, raw)


@pytest.fixture
def alice(project: Project) -> User:
    """An operator, member of `project`."""
    user = User.objects.create_user("alice", password="password")
    Membership.objects.create(project=project, user=user, role=Role.OPERATOR)
    return user


@pytest.fixture
def mallory(db: None) -> User:
    """A logged-in stranger with no membership in `project`."""
    return User.objects.create_user("mallory", password="password")


@pytest.fixture
def viewer(project: Project) -> User:
    """A member of `project` who may only read."""
    user = User.objects.create_user("victor")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    return user


@pytest.fixture
def admin(project: Project) -> User:
    """An admin of `project`."""
    user = User.objects.create_user("ada")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def outsider(db: None) -> User:
    """An admin of another project: a stranger to `project` with a project of their own."""
    user = User.objects.create_user("olga")
    Membership.objects.create(
        project=Project.objects.create(name="gamma"), user=user, role=Role.ADMIN
    )
    return user
