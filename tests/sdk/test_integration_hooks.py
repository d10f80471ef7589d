"""`tallybook-hook` under the real Letta Code (the `letta` wheel, its own runtime), offline: a
fake OpenAI-compatible model asks for `git push` to a local remote. The push is an effect with
its commit as the receipt; a second run of the same task is told it was done and does not push
again, and a new commit under a task run of its own is pushed; a refused push's reason reaches
the model; a PermissionRequest for a push that needs a person's approval waits for it in the
desk. Claude Code's format is covered by replaying its documented hook input through the
script; a hook that cannot record the intent blocks the push."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durability.models import Approval, Case, Effect, Receipt, State
from tests.authority.support import grant
from tests.desk.support import logged_in
from tests.sdk.fake_model import FakeModel, call, say
from tests.sdk.support import alongside, wait_until
from trajectories.models import Run

BIN = Path(sys.executable).parent
LETTA = BIN / "letta"
PUSH = {"command": "git push origin main", "description": "Push the release"}
GIT = {
    "GIT_AUTHOR_NAME": "Release Bot",
    "GIT_AUTHOR_EMAIL": "bot@example.com",
    "GIT_COMMITTER_NAME": "Release Bot",
    "GIT_COMMITTER_EMAIL": "bot@example.com",
}
PUSH_EFFECT = {
    "tool": "Bash",
    "input": {"command": r"^git push\b"},
    "kind": "git_push",
    "target": "github",
    "receipt": {"pattern": r"\.\.(?P<id>[0-9a-f]{7,40})\s"},
}


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Repository:
    """A project with a remote on disk: what `git push` changes is the remote's head."""

    def __init__(self, root: Path) -> None:
        self.remote, self.folder = root / "remote.git", root / "project"
        git("init", "-q", "--bare", "-b", "main", str(self.remote), cwd=root)
        git("init", "-q", "-b", "main", str(self.folder), cwd=root)
        git("remote", "add", "origin", str(self.remote), cwd=self.folder)
        self.commit("first")
        git("push", "-q", "origin", "main", cwd=self.folder)

    def commit(self, message: str) -> str:
        git("commit", "-q", "--allow-empty", "-m", message, cwd=self.folder)
        return git("rev-parse", "HEAD", cwd=self.folder)

    @property
    def pushed(self) -> str:
        return git("--git-dir", str(self.remote), "rev-parse", "main", cwd=self.folder)


def letta_env(home: Path) -> dict[str, str]:
    return {**os.environ, **GIT, "HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}"}


def letta(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(LETTA), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


class LettaHome:
    """A home that Letta Code's own commands set up for the local backend and an
    OpenAI-compatible model at a placeholder URL: each Letta Code process starts its Node
    runtime (a second or two), so the set-up is done once and copied (copy()), rather than run
    again by each test."""

    PLACEHOLDER = "http://127.0.0.1:9/placeholder-model/v1"

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.home.mkdir(parents=True)
        env = letta_env(self.home)
        letta(root, env, "backend", "local")
        letta(
            root,
            env,
            "connect",
            "openai-compatible",
            "--base-url",
            self.PLACEHOLDER,
            "--api-key",
            "fake",
        )

    def copy(self, home: Path, model_url: str) -> None:
        """The set-up home at `home`, connected to the model at `model_url` instead."""
        shutil.copytree(self.home, home)
        connected = 0
        for path in home.rglob("*"):
            if path.is_file() and self.PLACEHOLDER in (text := path.read_text()):
                path.write_text(text.replace(self.PLACEHOLDER, model_url))
                connected += 1
        assert connected, "Letta Code's home names the model's URL nowhere"


class Letta:
    """Letta Code in a home of its own, on the local backend, with the fake model.

    The home is a copy of `template` (a LettaHome: what Letta Code's own `letta backend local`
    and `letta connect openai-compatible` wrote, once per module), with the model's URL put in
    place of the one it was connected to."""

    def __init__(
        self,
        root: Path,
        folder: Path,
        model: FakeModel,
        env: dict[str, str],
        template: LettaHome,
    ) -> None:
        self.folder = folder
        home = root / "home"
        template.copy(home, model.url)
        self.env = letta_env(home) | env

    def letta(self, *args: str) -> subprocess.CompletedProcess[str]:
        return letta(self.folder, self.env, *args)

    def run(self, prompt: str, *, yolo: bool = True) -> str:
        # Without --yolo, Letta Code asks (PermissionRequest) before a shell command runs.
        options = ["--yolo"] if yolo else ["--permission-mode", "default"]
        return self.letta("--backend", "local", "-p", prompt, *options).stdout

    def hooks(self, effects: list[dict[str, Any]], *, wait: int = 60_000) -> None:
        settings = self.folder / ".letta"
        settings.mkdir(exist_ok=True)
        (settings / "tallybook.json").write_text(json.dumps({"effects": effects}))
        hook = [{"matcher": "*", "hooks": [{"type": "command", "command": "tallybook-hook"}]}]
        waiting = [
            {
                "matcher": "*",
                "hooks": [{"type": "command", "command": "tallybook-hook", "timeout": wait}],
            }
        ]
        events = ("PreToolUse", "PostToolUse", "PostToolUseFailure")
        hooks: dict[str, Any] = dict.fromkeys(events, hook) | {"PermissionRequest": waiting}
        (settings / "settings.json").write_text(json.dumps({"hooks": hooks}))


@pytest.fixture(scope="module")
def letta_home(tmp_path_factory: pytest.TempPathFactory) -> LettaHome:
    return LettaHome(tmp_path_factory.mktemp("letta"))


@pytest.fixture
def env(live_server: Any, api_key: str, spool_root: Path) -> dict[str, str]:
    """What the agent's hooks get from its environment."""
    return {
        "TALLYBOOK_URL": live_server.url,
        "TALLYBOOK_API_KEY": api_key,
        # A loaded machine's slow answer is no reason to refuse a test's effect.
        "TALLYBOOK_INTENT_BUDGET": "30",
        "TALLYBOOK_SPOOL_DIR": str(spool_root),
    }


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    return Repository(tmp_path)


def test_a_push_is_an_effect_with_its_commit_and_a_second_run_is_told_it_was_done(
    tmp_path, repo, env, letta_home
):
    first = repo.commit("release notes")
    script = [call("Bash", PUSH), say("Pushed.")] * 3
    with FakeModel(script) as model:
        # One run per task, named for what it pushes (a cron job's `TALLYBOOK_RUN_ID`).
        agent = Letta(
            tmp_path,
            repo.folder,
            model,
            {**env, "TALLYBOOK_RUN_ID": f"push-{first}"},
            letta_home,
        )
        agent.hooks([PUSH_EFFECT])

        said = agent.run("Push the release.")

        assert repo.pushed == first, said
        effect = Effect.objects.get()
        wait_until(lambda: Receipt.objects.filter(effect=effect).exists(), what="the receipt")
        effect.refresh_from_db()
        assert (effect.state, effect.kind, effect.target) == (State.SUCCEEDED, "git_push", "github")
        assert effect.run_id == f"push-{first}", "the run is the task"
        assert effect.tool_call_id == "call_1"
        receipt = Receipt.objects.get(effect=effect)
        assert receipt.system == "github" and first.startswith(receipt.external_id)

        # The same task again (a cron job resuming it): told it was done, not pushed again.
        agent.run("Push the release.")

        assert repo.pushed == first, "pushed again"
        told = model.tool_results()[-1]
        assert "Already done" in told and receipt.external_id in told, told
        assert Effect.objects.count() == 1

        # A new commit is a new task, under a run of its own: it is pushed.
        second = repo.commit("more notes")
        agent.env["TALLYBOOK_RUN_ID"] = f"push-{second}"
        said = agent.run("Push the release.")

        assert repo.pushed == second, said
        assert Effect.objects.filter(run_id=f"push-{second}").count() == 1
        assert Effect.objects.count() == 2


def test_a_refused_push_is_not_performed_and_its_reason_reaches_the_model(
    tmp_path, repo, env, project, letta_home
):
    emails = grant(project, name="emails only", kinds=["email"])
    before = repo.pushed
    repo.commit("release notes")
    with FakeModel([call("Bash", PUSH), say("Could not push.")]) as model:
        agent = Letta(tmp_path, repo.folder, model, env, letta_home)
        agent.hooks([{**PUSH_EFFECT, "authority": {"grant": emails.pk}}])

        agent.run("Push the release.")

        assert repo.pushed == before, "the refused push was performed"
        told = model.tool_results()[-1]
        effect = Effect.objects.get()
        assert effect.state == State.DENIED
        case = Case.objects.get(effect=effect)
        assert "Not performed" in told and f"/cases/{case.pk}/" in told, told


def test_a_permission_request_for_a_gated_push_waits_for_an_approval_in_the_desk(
    tmp_path, repo, env, project, alice, letta_home
):
    gated = grant(project, name="releases", requires_approval=True)
    release = repo.commit("release notes")
    with FakeModel([call("Bash", PUSH), say("Pushed.")]) as model:
        agent = Letta(tmp_path, repo.folder, model, env, letta_home)
        agent.hooks([{**PUSH_EFFECT, "authority": {"grant": gated.pk}, "wait_for_approval": 60}])

        def approve() -> None:
            wait_until(lambda: Approval.objects.exists(), 60, "the approval to be asked for")
            assert repo.pushed != release, "pushed before it was approved"
            approval = Approval.objects.get()
            signed = logged_in(alice).post(
                f"/approvals/{approval.pk}/sign/", {"verdict": "approve", "reason": "release day"}
            )
            assert signed.status_code in (200, 302)

        with alongside(approve):
            said = agent.run("Push the release.", yolo=False)

        assert "[hook:PermissionRequest] tallybook-hook" in said, said

        assert repo.pushed == release
        effect = Effect.objects.get()
        wait_until(lambda: Receipt.objects.filter(effect=effect).exists(), what="the receipt")
        effect.refresh_from_db()
        assert effect.state == State.SUCCEEDED
        assert not Case.objects.filter(effect=effect, reason="uncertain").exists()


def hook(
    event: dict[str, Any], env: dict[str, str], folder: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "tallybook-hook")],
        input=json.dumps(event),
        cwd=folder,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_claude_codes_hook_input_records_the_push_and_its_receipt(tmp_path, env):
    folder = tmp_path / "project"
    (folder / ".claude").mkdir(parents=True)
    (folder / ".claude" / "tallybook.json").write_text(json.dumps({"effects": [PUSH_EFFECT]}))
    # Claude Code's documented hook input (https://code.claude.com/docs/en/hooks).
    common = {
        "session_id": "abc123",
        "transcript_path": str(tmp_path / "transcript.jsonl"),
        "cwd": str(folder),
        "permission_mode": "default",
        "tool_name": "Bash",
        "tool_input": PUSH,
    }
    pre = {**common, "hook_event_name": "PreToolUse", "tool_use_id": "toolu_01"}
    post = {
        **common,
        "hook_event_name": "PostToolUse",
        "tool_use_id": "toolu_01",
        "tool_response": {
            "stdout": "",
            "stderr": "To github.com:acme/app.git\n   4b825dc..9fceb02  main -> main\n",
            "interrupted": False,
            "isImage": False,
        },
    }

    assert hook(pre, env, folder).returncode == 0
    assert hook(post, env, folder).returncode == 0

    effect = Effect.objects.get()
    assert (effect.run_id, effect.tool_call_id) == ("abc123", "toolu_01")
    wait_until(lambda: Receipt.objects.filter(effect=effect).exists(), what="the receipt")
    assert Receipt.objects.get(effect=effect).external_id == "9fceb02"
    # The model retries the push: a new tool use id, the same command, told it is done.
    again = hook({**pre, "tool_use_id": "toolu_02"}, env, folder)
    assert again.returncode == 2 and "9fceb02" in again.stderr, again.stderr
    # An undeclared command is none of the hook's business.
    other = {**pre, "tool_input": {"command": "ls"}, "tool_use_id": "toolu_03"}
    assert hook(other, env, folder).returncode == 0
    assert Effect.objects.count() == 1
    # The session's end ends its run.
    ended = {**common, "hook_event_name": "SessionEnd", "reason": "prompt_input_exit"}
    assert hook(ended, env, folder).returncode == 0
    run = Run.objects.get(run_id="abc123")
    assert (run.workflow, run.status) == ("claude-code", "ok") and run.ended is not None


def test_a_failed_command_in_claude_codes_format_is_a_failure_definitive_when_declared(
    tmp_path, env
):
    folder = tmp_path / "project"
    (folder / ".claude").mkdir(parents=True)
    declared = {**PUSH_EFFECT, "failure": "definitive"}
    (folder / ".claude" / "tallybook.json").write_text(json.dumps({"effects": [declared]}))
    common = {"session_id": "s2", "cwd": str(folder), "tool_name": "Bash", "tool_input": PUSH}
    pre = {**common, "hook_event_name": "PreToolUse", "tool_use_id": "toolu_01"}
    failed = {
        **common,
        "hook_event_name": "PostToolUseFailure",
        "tool_use_id": "toolu_01",
        "error": "! [rejected] main -> main (fetch first)",
        "is_interrupt": False,
    }

    assert hook(pre, env, folder).returncode == 0
    assert hook(failed, env, folder).returncode == 0

    wait_until(
        lambda: Effect.objects.get().state == State.FAILED, what="the failure to be recorded"
    )
    # A definitive failure may be retried: the next push runs.
    assert hook({**pre, "tool_use_id": "toolu_02"}, env, folder).returncode == 0


def test_a_wrong_declaration_blocks_every_tool_and_says_where(tmp_path, env):
    folder = tmp_path / "project"
    (folder / ".letta").mkdir(parents=True)
    wrong = {**PUSH_EFFECT, "replay": "sometimes"}
    (folder / ".letta" / "tallybook.json").write_text(json.dumps({"effects": [wrong]}))
    event = {
        "event_type": "PreToolUse",
        "working_directory": str(folder),
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
        "tool_call_id": "call_1",
        "agent_id": "agent-1",
    }

    done = hook(event, env, folder)

    assert done.returncode == 2
    assert "effects[0] (Bash).replay must be one of" in done.stderr, done.stderr


def test_an_mcp_tool_behind_claude_codes_hooks_is_keyed_by_its_arguments(tmp_path, env):
    folder = tmp_path / "project"
    (folder / ".claude").mkdir(parents=True)
    refund = {
        "tool": "mcp__payments__refund",
        "kind": "payment",
        "target": "acme-pay",
        "key": "refund:{order}",
        "receipt": {"field": "id"},
    }
    (folder / ".claude" / "tallybook.json").write_text(json.dumps({"effects": [refund]}))
    common = {
        "session_id": "s3",
        "cwd": str(folder),
        "tool_name": "mcp__payments__refund",
        "tool_input": {"order": 7},
    }
    pre = {**common, "hook_event_name": "PreToolUse", "tool_use_id": "toolu_01"}
    # An MCP tool's response is its content blocks.
    post = {
        **common,
        "hook_event_name": "PostToolUse",
        "tool_use_id": "toolu_01",
        "tool_response": [{"type": "text", "text": '{"id": "re_7", "status": "succeeded"}'}],
    }

    assert hook(pre, env, folder).returncode == 0
    assert hook(post, env, folder).returncode == 0

    effect = Effect.objects.get(key="refund:7")
    wait_until(lambda: Receipt.objects.filter(effect=effect).exists(), what="the receipt")
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id) == ("acme-pay", "re_7")


def claude_push(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A Claude Code project declaring `git push`, and the PreToolUse of one."""
    folder = tmp_path / "project"
    (folder / ".claude").mkdir(parents=True)
    (folder / ".claude" / "tallybook.json").write_text(json.dumps({"effects": [PUSH_EFFECT]}))
    pre = {
        "session_id": "s4",
        "cwd": str(folder),
        "tool_name": "Bash",
        "tool_input": PUSH,
        "hook_event_name": "PreToolUse",
        "tool_use_id": "toolu_01",
    }
    return folder, pre


def test_a_wrong_intent_budget_blocks_the_push_and_says_so(tmp_path, env):
    folder, pre = claude_push(tmp_path)

    done = hook(pre, {**env, "TALLYBOOK_INTENT_BUDGET": "soon"}, folder)

    assert done.returncode == 2, done.stderr
    assert "TALLYBOOK_INTENT_BUDGET='soon' must be a positive number" in done.stderr
    assert not Effect.objects.exists()


def test_a_spool_it_cannot_write_blocks_the_push_rather_than_letting_it_run(tmp_path, env):
    folder, pre = claude_push(tmp_path)
    not_a_folder = tmp_path / "spool"
    not_a_folder.write_text("a file where the spool should be")

    done = hook(pre, {**env, "TALLYBOOK_SPOOL_DIR": str(not_a_folder)}, folder)

    assert done.returncode == 2, done.stderr
    assert "tallybook-hook:" in done.stderr
    assert not Effect.objects.exists()
