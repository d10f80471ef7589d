"""Deleting a project: never through the admin's cascading delete page; its keys revoked at
once, then its rows deleted by a job in batches, resumable, leaving other projects alone."""

from __future__ import annotations

from io import StringIO

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import ProgrammingError, connection, models, transaction
from rq.job import Job

from durability.models import (
    ApiKey,
    AuditEntry,
    Membership,
    Project,
    ReconcilerConfig,
    Role,
    State,
)
from durability.retention import jobs as retention_jobs
from durability.retention import projects
from tests.authority.support import grant, supersede
from tests.desk.support import logged_in
from tests.ledger import support as ledger
from tests.retention.support import policy, succeeded
from tests.trajectories.support import chat, post_traces, queue, request, tool, work

__all__ = ["queue"]  # the fixture

ADMIN_PAGE = "/admin/durability/project/"


def project_rows(project: Project) -> dict[str, int]:
    """The rows of the project in every table whose model names Project, or names a model
    that does, read from the models' relations (not from the code under test)."""
    direct = {
        model: f.attname
        for model in apps.get_models()
        for f in model._meta.concrete_fields
        if isinstance(f, models.ForeignKey) and f.related_model is Project
    }
    through = {
        model: f"{f.name}__{direct[f.related_model]}"
        for model in apps.get_models()
        if model not in direct
        for f in model._meta.concrete_fields
        if isinstance(f, models.ForeignKey) and f.related_model in direct
    }
    counts = {
        model._meta.label: model._base_manager.filter(**{path: project.pk}).count()
        for model, path in (direct | through).items()
    }
    counts["durability.Project"] = Project.objects.filter(pk=project.pk).count()
    return counts


def stocked(project: Project, client, key: str) -> None:
    """A project with a bit of everything: effects in several states with their attempts,
    receipts, cases, a resolution, audit entries; grants, one superseding another; an
    approval; a reconciler, a webhook source, a retention policy; a run with its spans."""
    ledger.everything(project)
    succeeded(project, "paid")
    ledger.effect_in(project, State.NOT_HAPPENED, "gone")
    ledger.effect_in(project, State.AWAITING_APPROVAL, "asks")
    ledger.effect_in(project, State.TIMED_OUT, "unsure")
    supersede(grant(project, name="refunds"), name="refunds v2")
    policy(project)
    ReconcilerConfig.objects.create(
        project=project, target="stripe", kind="http", config={"url": "http://x/{key}"}
    )
    spans = request(chat("a1b2c3d4e5f60718"), tool("0102030405060708", parent="a1b2c3d4e5f60718"))
    assert post_traces(client, key, spans).status_code == 200


@pytest.fixture
def alpha(project, api, alice, client) -> Project:
    stocked(project, client, api.key)
    return project


@pytest.fixture
def beta(other_api, client) -> Project:
    beta = Project.objects.get(api_keys__prefix=other_api.key[:11])
    stocked(beta, client, other_api.key)
    return beta


def _nonzero(counts: dict[str, int]) -> set[str]:
    return {label for label, count in counts.items() if count}


def test_the_stocked_project_holds_rows_in_the_tables_that_matter(alpha):
    held = _nonzero(project_rows(alpha))
    assert {
        "durability.ApiKey",
        "durability.Membership",
        "durability.Effect",
        "durability.Attempt",
        "durability.Receipt",
        "durability.Case",
        "durability.Resolution",
        "durability.AuditEntry",
        "durability.Grant",
        "durability.Approval",
        "durability.RetentionPolicy",
        "durability.ReconcilerConfig",
        "trajectories.Run",
        "trajectories.RunTrace",
        "trajectories.Span",
        "trajectories.RequestedToolCall",
    } <= held


def test_the_deletion_covers_every_table_that_names_a_project(db):
    covered = {owned.label for owned in projects.owned_tables()}
    assert covered == set(project_rows(Project(pk=0))) - {"durability.Project"}


def test_the_admin_refuses_the_cascading_delete(admin_client, alpha):
    assert admin_client.get(f"{ADMIN_PAGE}{alpha.pk}/delete/").status_code in (302, 403)
    r = admin_client.post(ADMIN_PAGE, {"action": "delete_selected", "_selected_action": alpha.pk})
    assert Project.objects.filter(pk=alpha.pk).exists()
    change = admin_client.get(f"{ADMIN_PAGE}{alpha.pk}/change/").content.decode()
    assert f'href="{ADMIN_PAGE}{alpha.pk}/delete-in-background/"' in change
    listing = admin_client.get(ADMIN_PAGE).content.decode()
    assert 'value="delete_selected"' not in listing
    assert 'value="delete_in_background"' in listing
    assert r.status_code in (200, 302)


def test_the_action_asks_for_the_name_and_refuses_another(admin_client, alpha, api):
    r = admin_client.post(
        ADMIN_PAGE, {"action": "delete_in_background", "_selected_action": alpha.pk}
    )
    confirm = f"{ADMIN_PAGE}{alpha.pk}/delete-in-background/"
    assert r.status_code == 302 and r["Location"] == confirm
    assert "Type the project&#x27;s name" in admin_client.get(confirm).content.decode()
    r = admin_client.post(confirm, {"name": "alph"})
    assert r.status_code == 400
    assert "This is not the project&#x27;s name (alpha)." in r.content.decode()
    assert Project.objects.get(pk=alpha.pk).deleting is None
    assert api.intent("still-here").status_code == 201


def test_the_action_revokes_the_keys_at_once_and_enqueues_the_job(
    admin_client, alpha, beta, api, other_api, client, queue, django_capture_on_commit_callbacks
):
    assert api.intent("cached").status_code == 201  # the key is in this process's cache
    before = project_rows(beta)
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(f"{ADMIN_PAGE}{alpha.pk}/delete-in-background/", {"name": "alpha"})
    assert r.status_code == 302
    assert Project.objects.get(pk=alpha.pk).deleting is not None
    assert not ApiKey.objects.filter(project=alpha, revoked_at=None).exists()
    assert not Membership.objects.filter(project=alpha).exists()
    assert api.intent("after").status_code == 401
    spans = request(chat("1111111111111111", trace_id="5" * 32))
    assert post_traces(client, api.key, spans).status_code == 401
    [job_id] = queue.job_ids
    job = Job.fetch(job_id, connection=queue.connection)
    assert job.func_name == "durability.retention.jobs.project_delete"
    assert job.args == (alpha.pk,)

    work(queue)

    assert not _nonzero(project_rows(alpha))
    assert project_rows(beta) == before
    assert other_api.intent("beta-goes-on").status_code == 201


def test_the_member_no_longer_sees_the_project(alpha, alice):
    desk = logged_in(alice)
    assert "paid" in desk.get("/effects/").content.decode()
    projects.project_delete_begin(project=alpha, actor="test")
    r = desk.get("/effects/")
    assert "paid" not in r.content.decode()


def test_a_membership_committed_just_after_the_mark_shows_the_project_to_no_one(alpha, alice):
    """The mark deletes the members it sees; one added by a request committing just after
    it stays until the deletion's last pass, and must give nothing meanwhile."""
    projects.project_delete_begin(project=alpha, actor="test")
    Membership.objects.create(project=alpha, user=alice, role=Role.ADMIN)
    desk = logged_in(alice)

    landing = desk.get("/effects/")
    assert "not a member of any project" in landing.content.decode()
    assert "paid" not in landing.content.decode()
    assert desk.post("/projects/switch/", {"project": alpha.pk}).status_code == 404
    assert desk.post(f"/settings/{alpha.pk}/keys/", {"name": "late"}).status_code == 404
    assert not ApiKey.objects.filter(project=alpha, revoked_at=None).exists()


def test_the_job_deletes_every_row_of_the_project_in_batches(alpha, beta):
    before = project_rows(beta)
    projects.project_delete_begin(project=alpha, actor="test")
    done = projects.project_delete(project_id=alpha.pk, batch=2)
    assert done.finished
    assert done.batches > len(done.rows)  # more than one batch of some tables
    assert not _nonzero(project_rows(alpha))
    assert project_rows(beta) == before


def test_an_interrupted_deletion_completes_when_run_again(
    alpha, beta, monkeypatch, queue, django_capture_on_commit_callbacks
):
    before = project_rows(beta)
    projects.project_delete_begin(project=alpha, actor="test")
    real = projects._batch_delete
    calls = []

    def crashing(owned, project_id, batch):
        calls.append(owned.label)
        if len(calls) > 1:
            raise RuntimeError("the worker died")
        return real(owned, project_id, batch)

    monkeypatch.setattr(projects, "_batch_delete", crashing)
    with pytest.raises(RuntimeError):
        retention_jobs.project_delete(alpha.pk)
    assert Project.objects.filter(pk=alpha.pk).exists()
    assert _nonzero(project_rows(alpha))
    monkeypatch.setattr(projects, "_batch_delete", real)

    with django_capture_on_commit_callbacks(execute=True):
        assert retention_jobs.projects_delete_resume() == 1  # a job for it, run by a worker
    work(queue)
    assert not _nonzero(project_rows(alpha))
    assert project_rows(beta) == before


def test_a_span_sent_after_the_deletion_began_is_refused_and_nothing_remains(alpha, api, client):
    first = request(chat("2222222222222222", trace_id="6" * 32))
    assert post_traces(client, api.key, first).status_code == 200  # cached, as a live agent's
    projects.project_delete_begin(project=alpha, actor="test")
    late = request(chat("3333333333333333", trace_id="7" * 32))
    assert post_traces(client, api.key, late).status_code == 401
    assert retention_jobs.project_delete(alpha.pk)
    assert post_traces(client, api.key, late).status_code == 401
    assert not _nonzero(project_rows(alpha))


def test_a_project_not_marked_is_never_deleted(alpha):
    with pytest.raises(projects.Refused):
        projects.project_delete(project_id=alpha.pk)
    assert Project.objects.filter(pk=alpha.pk).exists()


def test_the_command_deletes_the_project_and_carries_on_after_an_interruption(alpha, beta):
    before = project_rows(beta)
    with pytest.raises(CommandError, match="No project is named 'nope'"):
        call_command("deleteproject", "nope", "--noinput")
    out = StringIO()
    call_command("deleteproject", "alpha", "--noinput", "--batch", "3", stdout=out)
    assert "alpha: keys revoked" in out.getvalue()
    assert "alpha: deleted, in " in out.getvalue()
    assert not _nonzero(project_rows(alpha))
    assert project_rows(beta) == before


def test_the_command_resumes_a_deletion_the_admin_began(alpha):
    projects.project_delete_begin(project=alpha, actor="test")
    out = StringIO()
    call_command("deleteproject", "alpha", stdout=out)  # no question: it was confirmed
    assert "carrying on" in out.getvalue()
    assert not Project.objects.filter(pk=alpha.pk).exists()


def test_the_audit_trail_of_a_live_project_stays_append_only(alpha):
    entries = AuditEntry.objects.filter(project=alpha).count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT durability_audit_delete(%s, 100)", [alpha.pk])
        assert cursor.fetchone() == (0,)
        cursor.execute("SELECT set_config('tallybook.audit_delete', 'on', true)")
        with (
            pytest.raises(ProgrammingError, match="append-only: DELETE refused"),
            transaction.atomic(),
        ):
            cursor.execute("DELETE FROM durability_auditentry WHERE project_id = %s", [alpha.pk])
    assert AuditEntry.objects.filter(project=alpha).count() == entries


@pytest.mark.django_db(transaction=True)
def test_a_row_written_while_the_deletion_runs_is_deleted_on_a_walk_again(alpha, monkeypatch):
    """A scheduled job's row (here an attempt) written after its table was walked names an
    effect the next batch deletes: that batch's commit is refused, and the deletion walks the
    tables again instead of failing."""
    from durability.models import Attempt, Effect

    projects.project_delete_begin(project=alpha, actor="test")
    real = projects._batch_delete
    effect = Effect.objects.filter(project=alpha).order_by("pk").first()
    written = []

    def meanwhile(owned, project_id, batch):
        if owned.model is Effect and not written:
            written.append(
                Attempt.objects.create(
                    project_id=alpha.pk, effect_id=effect.pk, number=99, context={}
                )
            )
        return real(owned, project_id, batch)

    monkeypatch.setattr(projects, "_batch_delete", meanwhile)

    assert projects.project_delete(project_id=alpha.pk).finished
    assert written
    assert not _nonzero(project_rows(alpha))


def test_a_staff_user_without_the_delete_permission_cannot_delete_in_the_background(
    client, alpha, api
):
    from django.contrib.auth.models import Permission, User

    staff = User.objects.create_user("editor", password="pw-editor-1234", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(codename="change_project"),
        Permission.objects.get(codename="view_project"),
    )
    client.force_login(staff)
    confirm = f"{ADMIN_PAGE}{alpha.pk}/delete-in-background/"

    assert client.get(confirm).status_code == 403
    assert client.post(confirm, {"name": "alpha"}).status_code == 403
    assert Project.objects.get(pk=alpha.pk).deleting is None
    assert api.intent("still-here").status_code == 201
