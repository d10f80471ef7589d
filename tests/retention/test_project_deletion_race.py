"""A write racing its project's deletion: a request that authenticated (or found its webhook
source, or its membership) before the project was marked, and whose transaction commits after
the deletion's last pass deleted the project row, is answered as it would be a moment later,
never with a 500; nothing of it is stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client

from durability import pipeline
from durability.models import AuditAction, AuditEntry, Membership, Project, Role
from durability.retention import projects
from tests.api.support import signed, stripe_source
from tests.conftest import Api
from tests.desk.support import logged_in
from tests.ledger import support as ledger
from tests.retention.test_project_deletion import project_rows
from tests.trajectories.support import PROTOBUF, chat, post_traces, request

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_KEY = {"error": "Missing, wrong or revoked API key"}


def _delete(project_id: int, failed: list[BaseException]) -> None:
    try:
        project = Project.objects.get(pk=project_id)
        projects.project_delete_begin(project=project, actor="test")
        assert projects.project_delete(project_id=project_id).finished
    except BaseException as exc:
        failed.append(exc)
    finally:
        connections.close_all()


def _a_write(sql: str) -> bool:
    return "INSERT INTO" in sql.upper() or sql == "COMMIT"


@contextmanager
def deleted_at_first_write(
    project: Project, at: Callable[[str], bool] = _a_write
) -> Iterator[None]:
    """The project marked and deleted to its last row by another connection (as by the job,
    in another process) just as this connection sends its next INSERT through Django's cursor
    (or the ledger's writes and COMMIT, its own pipeline: `durability.pipeline.send`; or the
    statement `at` picks): the request has authenticated, and its transaction commits after
    the project row is gone."""
    failed: list[BaseException] = []
    fired: list[str] = []

    def delete_first(sql: str) -> None:
        if not fired and at(sql):
            fired.append(sql)
            other = threading.Thread(target=_delete, args=(project.pk, failed))
            other.start()
            other.join(timeout=60)
            assert not other.is_alive(), "the deletion waited for the request"

    def deleting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        delete_first(sql)
        return execute(sql, params, many, context)

    sending = pipeline.send

    def deleting_before_the_writes(conn: Any, statements: Any, **options: Any) -> None:
        if options.get("commit"):
            delete_first("COMMIT")
        sending(conn, statements, **options)

    with (
        connection.execute_wrapper(deleting),
        mock.patch.object(pipeline, "send", deleting_before_the_writes),
    ):
        yield
    assert fired, "the request wrote nothing"
    assert not failed, failed
    assert not Project.objects.filter(pk=project.pk).exists()


def _nothing_left(project: Project) -> None:
    assert not {label for label, count in project_rows(project).items() if count}


def test_an_intent_committing_after_its_project_was_deleted_is_a_401(api: Api, project):
    assert api.intent("before", authority=None).status_code == 201  # the key is cached
    with deleted_at_first_write(project):
        r = api.intent("racing", authority=None)
    assert (r.status_code, r.json()) == (401, UNKNOWN_KEY)
    assert r["WWW-Authenticate"] == 'Bearer realm="tallybook"'
    _nothing_left(project)


def test_a_receipt_committing_after_its_project_was_deleted_is_a_401(api: Api, project):
    assert api.intent("before", authority=None).status_code == 201
    with deleted_at_first_write(project):
        r = api.receipt("never-intended", external_id="ext-9")
    assert (r.status_code, r.json()) == (401, UNKNOWN_KEY)
    _nothing_left(project)


def test_a_first_request_of_the_process_racing_the_deletion_is_a_401(api: Api, project):
    """Not cached: the key is read at the front door, and no keys version is checked later."""
    ledger.everything(project)
    with deleted_at_first_write(project):
        r = api.intent("racing")
    assert (r.status_code, r.json()) == (401, UNKNOWN_KEY)
    _nothing_left(project)


def test_a_span_batch_committing_after_its_project_was_deleted_is_a_401_in_otlp(
    api: Api, project, client
):
    with deleted_at_first_write(project):
        r = post_traces(client, api.key, request(chat("4444444444444444", trace_id="8" * 32)))
    assert r.status_code == 401
    assert r["Content-Type"] == PROTOBUF
    assert r["WWW-Authenticate"] == 'Bearer realm="tallybook"'
    _nothing_left(project)


def test_an_event_batch_committing_after_its_project_was_deleted_is_a_401(api: Api, project):
    with deleted_at_first_write(project):
        r = api.post("events", {"events": [{"id": "e-1", "type": "run", "run_id": "racing"}]})
    assert (r.status_code, r.json()) == (401, UNKNOWN_KEY)
    _nothing_left(project)


def test_a_webhook_delivery_committing_after_its_project_was_deleted_is_a_404(client, project):
    source = stripe_source(project)
    refund = {"id": "re_1", "amount": 5, "currency": "eur", "metadata": {"tallybook_key": "r:1"}}
    body = json.dumps({"id": "evt_1", "created": 1_760_000_000, "data": {"object": refund}})
    with deleted_at_first_write(project):
        r = client.post(
            f"/hooks/{source.name}/",
            data=body,
            content_type="application/json",
            headers=signed(body.encode(), str(int(time.time())), source.secret),
        )
    assert (r.status_code, r.json()) == (404, {"error": "No such webhook source"})
    _nothing_left(project)


def test_a_page_write_committing_after_its_project_was_deleted_is_a_404(project):
    admin = User.objects.create_user("ada", password="password")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    desk = logged_in(admin)
    with deleted_at_first_write(project):
        r = desk.post(f"/settings/{project.pk}/keys/", {"name": "racing"})
    assert r.status_code == 404
    _nothing_left(project)


def _foreign_keys_at_once(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """Foreign keys checked at each INSERT, not deferred to the commit (where a trail's chain
    head read finds a deleted project first): the refusal a write meets when its project went
    before its foreign key was checked."""
    if sql.upper().startswith("INSERT INTO"):
        execute("SET CONSTRAINTS ALL IMMEDIATE", None, False, context)
    return execute(sql, params, many, context)


def test_a_webhook_source_whose_project_was_deleted_under_it_is_a_404_not_a_name_taken(project):
    admin = User.objects.create_user("ada", password="password")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    desk = logged_in(admin)
    form = {"name": "racing", "kind": "generic", "system": "stripe", "tolerance_s": 300}
    form["mapping"] = '{"key": "data.key", "external_id": "data.id"}'
    with connection.execute_wrapper(_foreign_keys_at_once), deleted_at_first_write(project):
        r = desk.post("/authority/webhooks/", form)
    assert r.status_code == 404
    _nothing_left(project)


def test_a_lockout_racing_the_deletion_of_one_of_the_users_projects_is_audited_in_the_rest(
    project, caplog
):
    """The user's projects were read before the deletion, whose last pass went before the
    audit entry's chain head was read: no server error, and the other projects audit it."""
    alice = User.objects.create_user("alice", password="password")
    beta = Project.objects.create(name="beta")
    for each in (project, beta):
        Membership.objects.create(project=each, user=alice, role=Role.VIEWER)
    client = Client(raise_request_exception=False)
    guess = {"username": "alice", "password": "not-the-password"}
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post("/login/", guess).status_code == 200

    def chain_head_read(sql: str) -> bool:
        return sql.startswith('SELECT "durability_project"') and "FOR NO KEY UPDATE" in sql

    with deleted_at_first_write(project, at=chain_head_read):
        r = client.post("/login/", guess)
    assert r.status_code == 429
    assert not [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert not AuditEntry.objects.filter(project_id=project.pk).exists()
    assert AuditEntry.objects.filter(project=beta, action=AuditAction.LOGIN_LOCKED_OUT).exists()
    _nothing_left(project)
