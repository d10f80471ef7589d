"""The git reconciler against real repositories: local paths, and remotes by URL."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime

import pytest

from durability.models import Case, Effect, ReconcilerConfig
from durability.reconcilers.base import reconciler_for
from durability.reconcilers.reconciling import effect_probe

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@example.com",
    "GIT_COMMITTER_DATE": "2024-05-01T12:00:00+00:00",
    "GIT_AUTHOR_DATE": "2024-05-01T12:00:00+00:00",
}


def run_git(repo, *args) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository with two commits, an annotated and a lightweight tag, and a branch."""
    path = tmp_path_factory.mktemp("deploys")
    run_git(path, "init", "--quiet", "--initial-branch=main")
    (path / "app.txt").write_text("v1\n")
    run_git(path, "add", "app.txt")
    run_git(path, "commit", "--quiet", "-m", "release 1")
    first = run_git(path, "rev-parse", "HEAD")
    run_git(path, "tag", "-a", "v1.0.0", "-m", "release 1")
    (path / "app.txt").write_text("v2\n")
    run_git(path, "commit", "--quiet", "-am", "release 2")
    second = run_git(path, "rev-parse", "HEAD")
    run_git(path, "tag", "deployed-2")
    run_git(path, "branch", "release/2", second)
    return {"path": path, "first": first, "second": second}


def probe(effect, **config):
    return reconciler_for("git", config).probe(effect)


def effect(**request) -> Effect:
    return Effect(key="deploy:42", kind="deploy", target="git", request=request, attempt_count=1)


@pytest.fixture(params=["path", "url"])
def where(request, repo):
    """The same repository, as a local path and as a remote (file:// URL)."""
    return str(repo["path"]) if request.param == "path" else repo["path"].as_uri()


def test_an_existing_commit_is_found_with_its_date(repo, where):
    answer = probe(effect(sha=repo["first"]), repository=where, commit="{request[sha]}")
    assert answer.answer == "found"
    assert answer.external_id == repo["first"] and answer.system == "git"
    assert answer.observed_at == datetime.fromisoformat("2024-05-01T12:00:00+00:00")
    assert answer.data == {"repository": where, "commit": repo["first"]}


def test_an_abbreviated_sha_is_found_as_the_full_one(repo, where):
    answer = probe(effect(sha=repo["second"][:10]), repository=where, commit="{request[sha]}")
    assert answer.answer == "found" and answer.external_id == repo["second"]


def test_a_missing_commit_is_not_found(repo, where):
    answer = probe(effect(sha="0" * 40), repository=where, commit="{request[sha]}")
    assert answer.answer == "not_found"


def test_an_annotated_tag_is_found_as_its_commit(repo, where):
    answer = probe(effect(version="1.0.0"), repository=where, tag="v{request[version]}")
    assert answer.answer == "found" and answer.external_id == repo["first"]
    assert answer.data["ref"] == "refs/tags/v1.0.0"


def test_a_lightweight_tag_and_a_branch_are_found(repo, where):
    assert probe(effect(), repository=where, tag="deployed-2").external_id == repo["second"]
    answer = probe(effect(n=2), repository=where, ref="refs/heads/release/{request[n]}")
    assert answer.answer == "found" and answer.external_id == repo["second"]


def test_a_missing_tag_or_ref_is_not_found(repo, where):
    assert probe(effect(), repository=where, tag="v9.9.9").answer == "not_found"
    assert probe(effect(), repository=where, ref="refs/heads/nope").answer == "not_found"


def test_names_that_look_like_options_are_not_taken_as_options(repo, where, tmp_path):
    pwned = tmp_path / "pwned"
    answer = probe(effect(), repository=where, tag=f"--output={pwned}")
    assert answer.answer == "not_found"
    assert probe(effect(), repository=where, commit="--all").answer == "unknown"
    assert probe(effect(), repository="--upload-pack=touch /tmp/x", tag="v1").answer == "unknown"
    assert not pwned.exists()


def test_an_invalid_ref_name_answers_unknown(repo):
    answer = probe(effect(), repository=str(repo["path"]), ref="refs/heads/a..b")
    assert answer.answer == "unknown" and "not a valid ref name" in answer.detail


def test_a_directory_that_is_not_a_repository_answers_unknown(tmp_path):
    assert probe(effect(), repository=str(tmp_path), tag="v1").answer == "unknown"
    answer = probe(effect(), repository=str(tmp_path / "missing"), commit="abcdef1")
    assert answer.answer == "unknown" and "no such directory" in answer.detail


def test_an_unreachable_remote_answers_unknown(tmp_path):
    answer = probe(effect(), repository=(tmp_path / "missing").as_uri(), tag="v1")
    assert answer.answer == "unknown" and "ls-remote failed" in answer.detail


def test_a_remote_that_does_not_answer_answers_unknown_after_the_timeout(silent_git_server):
    # The server never says a word: only the probe's own timeout can end the call.
    answer = probe(effect(), repository=silent_git_server, tag="v1", timeout_s=0.5)
    assert answer.answer == "unknown" and "took longer than 0.5s" in answer.detail


def test_a_commit_found_in_the_repository_settles_a_deploy(api, project, repo):
    ReconcilerConfig.objects.create(
        project=project,
        target="github",
        kind="git",
        config={"repository": str(repo["path"]), "commit": "{request[sha]}"},
    )
    api.intent("deploy:42", kind="deploy", target="github", request={"sha": repo["second"]})
    api.timeout("deploy:42")
    effect = Effect.objects.get(key="deploy:42")

    probe_row = effect_probe(effect_id=effect.pk)

    assert probe_row is not None and probe_row.settled == "probe_found"
    assert Effect.objects.get(pk=effect.pk).state == "succeeded"
    assert Case.objects.get(effect=effect).closed is not None
    body = api.intent(
        "deploy:42", kind="deploy", target="github", request={"sha": repo["second"]}
    ).json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == repo["second"]
    assert body["receipt"]["system"] == "git"


def test_a_commit_dated_outside_the_range_of_reported_times_answers_unknown(tmp_path):
    run_git(tmp_path, "init", "--quiet", "--initial-branch=main")
    env = {**GIT_ENV, "GIT_COMMITTER_DATE": "1990-01-01T00:00:00+00:00"}
    subprocess.run(
        ["git", "-C", str(tmp_path), "commit", "--quiet", "--allow-empty", "-m", "old"],
        env=env,
        check=True,
    )
    sha = run_git(tmp_path, "rev-parse", "HEAD")
    answer = probe(effect(sha=sha), repository=str(tmp_path), commit="{request[sha]}")
    assert answer.answer == "unknown"
    assert "committer date" in answer.detail and "must lie between" in answer.detail


@pytest.fixture
def elsewhere(tmp_path_factory):
    """A repository outside the git roots (like another project's, or the server's own)."""
    path = tmp_path_factory.mktemp("elsewhere")
    run_git(path, "init", "--quiet", "--initial-branch=main")
    run_git(path, "commit", "--quiet", "--allow-empty", "-m", "secret")
    run_git(path, "tag", "v1")
    return path


@pytest.fixture
def roots(settings, tmp_path_factory):
    """Only the folder `allowed` is a git root; returns it."""
    root = tmp_path_factory.mktemp("allowed")
    settings.TALLYBOOK_RECONCILER_GIT_ROOTS = [str(root)]
    return root


@pytest.mark.parametrize("template", ["/{request[repo]}", "file:///{request[repo]}"])
def test_the_agents_data_reads_no_repository_outside_the_git_roots(roots, elsewhere, template):
    answer = probe(effect(repo=str(elsewhere).lstrip("/")), repository=template, tag="v1")
    assert answer.answer == "unknown"
    assert "TALLYBOOK_RECONCILER_GIT_ROOTS" in answer.detail


@pytest.mark.parametrize("where", ["path", "url"])
def test_no_repository_is_read_on_the_servers_disk_by_default(settings, repo, where):
    settings.TALLYBOOK_RECONCILER_GIT_ROOTS = []
    path = repo["path"]
    answer = probe(
        effect(), repository=str(path) if where == "path" else path.as_uri(), tag="v1.0.0"
    )
    assert answer.answer == "unknown" and "lists none" in answer.detail


@pytest.mark.parametrize("where", ["path", "url"])
def test_a_dot_dot_segment_leaves_no_git_root(roots, elsewhere, where):
    climb = "/".join([".."] * len(roots.parts)) + str(elsewhere)
    template = f"{roots}/{{request[repo]}}"
    if where == "url":
        template = roots.as_uri() + "/{request[repo]}"
    answer = probe(effect(repo=climb), repository=template, tag="v1")
    assert answer.answer == "unknown" and ".. segment" in answer.detail


@pytest.mark.parametrize("where", ["path", "url"])
def test_a_symlink_leaves_no_git_root(roots, elsewhere, where):
    (roots / "link").symlink_to(elsewhere)
    repository = str(roots / "link") if where == "path" else (roots / "link").as_uri()
    answer = probe(effect(), repository=repository, tag="v1")
    assert answer.answer == "unknown" and "not under" in answer.detail


def test_a_folder_under_a_git_root_is_no_way_into_a_repository_above_it(settings, tmp_path):
    """Git would look for a repository in the folders above: the server's own checkout."""
    run_git(tmp_path, "init", "--quiet", "--initial-branch=main")
    run_git(tmp_path, "commit", "--quiet", "--allow-empty", "-m", "the app")
    run_git(tmp_path, "tag", "v1")
    (tmp_path / "repos").mkdir()
    settings.TALLYBOOK_RECONCILER_GIT_ROOTS = [str(tmp_path / "repos")]
    answer = probe(effect(), repository=str(tmp_path / "repos"), tag="v1")
    assert answer.answer == "unknown" and "not a git repository" in answer.detail


def test_a_repository_under_a_git_root_is_read(roots):
    run_git(roots, "init", "--quiet", "--initial-branch=main")
    run_git(roots, "commit", "--quiet", "--allow-empty", "-m", "release")
    run_git(roots, "tag", "v1")
    assert (
        probe(effect(repo="."), repository=f"{roots}/{{request[repo]}}", tag="v1").answer == "found"
    )
