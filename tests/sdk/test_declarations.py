"""The declarations file of tallybook-mcp and tallybook-hook: checked when it is read, each
mistake named by its entry and field; a call's key survives a model's retry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tallybook.integrations._declarations import DeclarationError, parse

PUSH = {"tool": "Bash", "input": {"command": r"^git push (?P<remote>\S+)"}, "kind": "git_push"}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({**PUSH, "target": "github", "replay": "sometimes"}, "replay must be one of"),
        ({**PUSH}, "target is required"),
        ({**PUSH, "target": "github", "input": {"command": "("}}, "input.command is not a regular"),
        ({**PUSH, "target": "github", "key": "push:{}"}, "key must name its fields"),
        ({**PUSH, "target": "github", "key": "push:{remote"}, "key is not a template"),
        ({**PUSH, "target": "github", "receipt": "id"}, "receipt must be an object"),
        ({**PUSH, "target": "github", "timeout_s": 0}, "timeout_s must be a positive"),
        ({**PUSH, "target": "github", "failure": "maybe"}, "failure must be 'uncertain'"),
        ({**PUSH, "target": "github", "amount": {"value": 5}}, "amount must be"),
        ({**PUSH, "target": "github", "recipt": {}}, "unknown field(s) recipt"),
    ],
)
def test_a_wrong_declaration_is_refused_where_it_is(entry, says):
    with pytest.raises(DeclarationError) as refused:
        parse({"effects": [{"tool": "Bash", "kind": "x", "target": "y"}, entry]})
    assert "effects[1]" in str(refused.value) and says in str(refused.value), refused.value


def test_the_default_key_is_the_run_the_tool_and_the_identifying_input():
    declared = parse({"effects": [{**PUSH, "target": "github"}]})
    asked = declared.call("Bash", {"command": "git push origin main", "description": "Push"}, "a1")
    retried = declared.call("Bash", {"command": "git push origin main", "description": "Go"}, "a1")
    assert asked is not None and retried is not None
    # The model reworded its description: the same push, the same request.
    assert asked.key == retried.key and asked.key.startswith("Bash:a1:")
    assert asked.request == {"command": "git push origin main"}
    assert declared.call("Bash", {"command": "ls"}, "a1") is None
    assert declared.call("Write", {"command": "git push origin main"}, "a1") is None


def test_a_key_template_names_the_input_and_the_patterns_groups():
    declared = parse({"effects": [{**PUSH, "target": "github", "key": "{tool}:{run_id}:{remote}"}]})
    asked = declared.call("Bash", {"command": "git push origin main"}, "a1")
    assert asked is not None and asked.key == "Bash:a1:origin"
    missing = parse({"effects": [{**PUSH, "target": "github", "key": "push:{branch}"}]})
    call = missing.call("Bash", {"command": "git push origin main"}, "a1")
    assert call is not None
    with pytest.raises(DeclarationError, match="names 'branch'"):
        _ = call.key


def test_the_proxy_refuses_to_start_with_a_wrong_declaration(tmp_path: Path):
    effects = tmp_path / "tallybook.json"
    effects.write_text('{"effects": [{"tool": "refund", "kind": "payment"}]}')
    done = subprocess.run(
        [sys.executable, "-m", "tallybook.integrations.mcp", "--effects", str(effects), "--"]
        + [sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "tallybook.json: effects[0].target is required" in done.stderr, done.stderr


def test_an_attempts_deadline_is_the_projects_unless_declared():
    declared = parse(
        {
            "effects": [
                {**PUSH, "target": "github"},
                {**PUSH, "tool": "Sh", "target": "x", "timeout_s": 60},
            ]
        }
    )
    default = declared.call("Bash", {"command": "git push origin main"}, "a1")
    named = declared.call("Sh", {"command": "git push origin main"}, "a1")
    assert default is not None and named is not None
    assert "timeout_s" not in default.options()
    assert named.options()["timeout_s"] == 60


def test_the_proxy_without_the_mcp_extra_says_how_to_install_it():
    # The `mcp` package made unimportable, as it is without the extra.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['mcp'] = None; "
            "from tallybook.integrations._mcp_command import main; sys.exit(main(['--help']))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "pip install 'tallybook-sdk[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
