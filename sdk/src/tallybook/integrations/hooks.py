"""`tallybook-hook`: Letta Code's and Claude Code's command hooks, making declared tool calls
effects.

In `.letta/settings.json` (or `.claude/settings.json`), for PreToolUse, PostToolUse,
PostToolUseFailure and PermissionRequest:

    {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [{"type": "command",
                                                           "command": "tallybook-hook"}]}], …}}

and beside it `tallybook.json` declares which tool calls are effects (see
`tallybook.integrations._declarations`): a tool's name and patterns over its input (a Bash
command matching `^git push`, an MCP tool's name), with kind, target, key, replay policy and
how the receipt is read from the tool's output.

Each hook reads the event from standard input. PreToolUse (and PermissionRequest) records the
intent: `proceed` lets the tool run (exit 0); any other decision blocks it (exit 2) with the
reason and the case's URL on standard error, which the agent reads; `completed` tells it what
was done before and its receipt. PostToolUse records the receipt read from the output,
PostToolUseFailure a failure. The run is `TALLYBOOK_RUN_ID` (one per task: a new commit
to push is a new task), else the declarations' `run`, else the agent (Letta Code's
`agent_id`, stable per working folder for ever) or Claude Code's session.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tallybook.client import Tallybook
from tallybook.errors import EffectInterrupted, TallybookError
from tallybook.integrations._declarations import (
    Call,
    DeclarationError,
    Declarations,
    client_options,
    load,
)
from tallybook.integrations._tool_calls import run_event
from tallybook.spool import default_root

__all__ = ["main"]

ALLOW, BLOCK, ERROR = 0, 2, 1
# Where each agent keeps its settings, and so the declarations beside them.
SETTINGS = (".letta", ".claude")
DECLARATIONS = "tallybook.json"
# What the tool's output is kept of with the receipt.
MAX_OUTPUT = 16_000


@dataclass(frozen=True)
class Event:
    """A hook's input, in either agent's field names."""

    name: str
    tool: str
    input: Any
    call_id: str | None
    run_id: str | None
    folder: Path
    agent: str  # the workflow: "letta-code" or "claude-code"
    raw: Mapping[str, Any]

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> Event:
        letta = "event_type" in raw
        return cls(
            name=str(raw.get("event_type") or raw.get("hook_event_name") or ""),
            tool=str(raw.get("tool_name") or ""),
            input=raw.get("tool_input") or {},
            call_id=raw.get("tool_call_id") or raw.get("tool_use_id"),
            run_id=raw.get("agent_id") or raw.get("session_id"),
            folder=Path(raw.get("working_directory") or raw.get("cwd") or os.getcwd()),
            agent="letta-code" if letta else "claude-code",
            raw=raw,
        )

    def output(self) -> tuple[str, bool]:
        """The tool's output as text, and whether the tool reported an error."""
        result = self.raw.get("tool_result")  # Letta Code: {"status", "output"}
        if isinstance(result, Mapping):
            return _text(result.get("output")), result.get("status") == "error"
        response = self.raw.get("tool_response")  # Claude Code: the tool's own answer
        if isinstance(response, Mapping) and ("stdout" in response or "stderr" in response):
            both = [_text(response.get("stdout")), _text(response.get("stderr"))]
            return "\n".join(part for part in both if part), False
        if isinstance(response, list):  # an MCP tool's content blocks
            texts = [b.get("text") for b in response if isinstance(b, Mapping) and "text" in b]
            if texts:
                return "\n".join(_text(t) for t in texts), False
        return _text(response), False

    def error(self) -> str:
        return _text(self.raw.get("error_message") or self.raw.get("error") or "the tool failed")


class Attempts:
    """Which worker asks for a key: the one that asked first in this tool call, so that the
    hooks of one call (PermissionRequest, then PreToolUse, each a process of its own) are one
    attempt, and a call asked again after its tool had started (a crash, a restart) is
    another process resuming, which the server answers with an uncertain case."""

    def __init__(self, root: Path) -> None:
        self.root = root / "hook-attempts"

    def _path(self, run_id: str | None, key: str) -> Path:
        name = hashlib.sha256(f"{run_id}\0{key}".encode()).hexdigest()[:32]
        return self.root / name

    def worker(self, run_id: str | None, key: str, event: str) -> str:
        known = self._read(run_id, key)
        # Letta Code asks for permission before PreToolUse, Claude Code after it: either way
        # the second hook of the call continues the first's attempt. A PreToolUse after a
        # started one is a new call.
        if known and (event == "PermissionRequest" or not known.get("started")):
            return str(known["worker"])
        worker = f"tallybook-hook:{secrets.token_hex(6)}"
        self._write(run_id, key, {"worker": worker, "started": False})
        return worker

    def started(self, run_id: str | None, key: str, worker: str) -> None:
        self._write(run_id, key, {"worker": worker, "started": True})

    def ended(self, run_id: str | None, key: str) -> None:
        self._path(run_id, key).unlink(missing_ok=True)

    def _read(self, run_id: str | None, key: str) -> dict[str, Any] | None:
        try:
            known = json.loads(self._path(run_id, key).read_text())
        except (OSError, ValueError):
            return None
        return known if isinstance(known, dict) and "worker" in known else None

    def _write(self, run_id: str | None, key: str, state: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(run_id, key)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(path)


def handle(event: Event, declarations: Declarations, attempts: Attempts) -> tuple[int, str]:
    """What the hook answers: an exit code and what to write (stderr when blocking, stdout
    otherwise)."""
    run_id = os.environ.get("TALLYBOOK_RUN_ID") or declarations.run or event.run_id
    if event.name in ("SessionStart", "SessionEnd"):
        if declarations.effects and run_id:
            status = "running" if event.name == "SessionStart" else "ok"
            named = {"agent": event.raw["agent_name"]} if event.raw.get("agent_name") else {}
            with Tallybook(**client_options()) as tb:
                run_event(tb, run_id, status=status, workflow=event.agent, **named)
        return ALLOW, ""
    call = declarations.call(event.tool, event.input, run_id)
    if call is None:
        return ALLOW, ""
    try:
        key = call.key
    except DeclarationError as exc:
        return (BLOCK if event.name in ("PreToolUse", "PermissionRequest") else ERROR), str(exc)
    if event.name in ("PreToolUse", "PermissionRequest"):
        return _ask(event, call, key, attempts)
    if event.name == "PostToolUse":
        text, failed = event.output()
        if failed:
            return ALLOW, ""  # Letta Code says so again in PostToolUseFailure
        with Tallybook(**client_options()) as tb:
            receipt = call.receipt(text, call=event.call_id or key)
            tb.receipt(key, **receipt, data={"output": text[:MAX_OUTPUT]})
        attempts.ended(call.run_id, key)
        return ALLOW, ""
    if event.name == "PostToolUseFailure":
        with Tallybook(**client_options()) as tb:
            definitive = call.declaration.definitive_failure
            tb._record("failures", {"key": key, "error": event.error(), "definitive": definitive})
        attempts.ended(call.run_id, key)
        return ALLOW, ""
    return ALLOW, ""


def _ask(event: Event, call: Call, key: str, attempts: Attempts) -> tuple[int, str]:
    """Record the intent; let the tool run only on `proceed`."""
    worker = attempts.worker(call.run_id, key, event.name)
    with (
        Tallybook(worker=worker, **client_options()) as tb,
        tb.run(event.agent, run_id=call.run_id),
    ):
        try:
            with tb.effect(key, **call.options(event.call_id)) as fx:
                if fx.completed:
                    receipt = fx.receipt.stored
                    done = f"{receipt.system}:{receipt.external_id}" if receipt else "on record"
                    attempts.ended(call.run_id, key)
                    return BLOCK, (
                        f"Already done: {key!r} was performed before (receipt {done}). "
                        "Do not do it again; carry on from there."
                    )
                if event.name == "PreToolUse":
                    attempts.started(call.run_id, key, worker)
                fx.hand_off()  # PostToolUse, another process, reports the outcome
        except EffectInterrupted as report:
            return BLOCK, f"Not performed: {report}"
    if event.name == "PermissionRequest":
        allow = {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}
        return ALLOW, json.dumps({"hookSpecificOutput": allow})
    return ALLOW, ""


def declarations_for(event: Event, given: str | None) -> Declarations:
    """The declarations named on the command line, else the first `tallybook.json` beside
    the agent's settings in the working folder; none declares nothing."""
    if given:
        return load(given)
    for folder in SETTINGS:
        path = event.folder / folder / DECLARATIONS
        if path.is_file():
            return load(path)
    return Declarations()


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tallybook-hook",
        description="Letta Code and Claude Code hooks: declared tool calls recorded in Tallybook.",
    )
    parser.add_argument(
        "--effects", help="the declarations file (default: tallybook.json in .letta/ or .claude/)"
    )
    args = parser.parse_args(argv)
    try:
        raw = json.load(sys.stdin)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        print(f"tallybook-hook: the hook's input is not a JSON object: {exc}", file=sys.stderr)
        return ERROR
    event = Event.read(raw)
    blocks = event.name in ("PreToolUse", "PermissionRequest")
    try:
        declarations = declarations_for(event, args.effects)
        code, said = handle(event, declarations, Attempts(default_root()))
    except DeclarationError as exc:
        # Nothing is known to be safe with a wrong declaration: the tool does not run.
        code, said = (BLOCK if blocks else ERROR), f"tallybook-hook: {exc}"
    except TallybookError as exc:
        code, said = (BLOCK if blocks else ERROR), f"tallybook-hook: {exc}"
    except Exception as exc:
        # Anything else (a spool folder it cannot write, a bug): the agent reads any exit
        # but 2 as "carry on", so a tool that could be an effect does not run unrecorded.
        said = f"tallybook-hook: {type(exc).__name__}: {exc}"
        code = BLOCK if blocks else ERROR
    if said:
        print(said, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
