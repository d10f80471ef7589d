"""Which tool calls are effects, declared in a JSON file: what `tallybook-mcp` and
`tallybook-hook` read, so one declaration serves an MCP tool behind the proxy and a coding
agent's tool behind its hooks.

    {"run": "release-bot",                       # optional: the run every call belongs to
     "effects": [
       {"tool": "Bash", "input": {"command": "^git push\\b"},
        "kind": "git_push", "target": "github",
        "receipt": {"pattern": "\\.\\.(?P<id>[0-9a-f]{7,40})"}},
       {"tool": "refund", "kind": "payment", "target": "stripe", "key": "refund:{order}",
        "replay": "reconcile", "receipt": {"field": "id"}}]}

A call is the first declaration whose `tool` is the call's tool and whose `input` patterns
(regular expressions, searched in the input's fields) all match; others are not effects.
The key is the declaration's template over the input's fields, the patterns' named groups,
`tool` and `run_id`; else the run, the tool and a fingerprint of the identifying input
(the fields the patterns read, else all of it): a model's retry gets a new call id but
the same input, so the key survives it. Everything is checked when the file is read.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tallybook.client import REPLAY_POLICIES, EffectOptions, ReplayPolicy
from tallybook.integrations._tool_calls import (
    TOOL_CALL,
    canonical_json,
    default_key,
    field_at,
)
from tallybook.tools import template_names

FIELDS = frozenset(
    {
        "tool",
        "input",
        "kind",
        "target",
        "key",
        "replay",
        "timeout_s",
        "authority",
        "amount",
        "receipt",
        "failure",
        "wait_for_approval",
    }
)
RECEIPT_FIELDS = frozenset({"pattern", "field", "system"})


class DeclarationError(ValueError):
    """The declarations file is wrong; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class Declaration:
    """One kind of tool call that is an effect."""

    tool: str
    kind: str
    target: str
    input: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    key: str | None = None
    replay: ReplayPolicy = "never"
    # The attempt's deadline; None leaves it to the project's (`effect_timeout_s`).
    timeout_s: int | None = None
    authority: dict[str, Any] | None = None
    amount: dict[str, str] | None = None
    receipt_pattern: re.Pattern[str] | None = None
    receipt_field: str | None = None
    system: str | None = None
    definitive_failure: bool = False
    wait_for_approval: float | None = None

    def matches(self, tool: str, arguments: Mapping[str, Any]) -> dict[str, str] | None:
        """The patterns' named groups when the call is this effect, else None."""
        if tool != self.tool:
            return None
        groups: dict[str, str] = {}
        for name, pattern in self.input.items():
            value = arguments.get(name)
            if value is None:
                return None
            found = pattern.search(value if isinstance(value, str) else canonical_json(value))
            if found is None:
                return None
            groups.update({k: v for k, v in found.groupdict().items() if v is not None})
        return groups


@dataclass(frozen=True)
class Call:
    """A tool call that is a declared effect: its key, request and options."""

    declaration: Declaration
    tool: str
    arguments: Mapping[str, Any]
    groups: Mapping[str, str]
    run_id: str | None

    @property
    def request(self) -> dict[str, Any]:
        """What identifies the call: the fields the patterns read, else every argument (a
        shell command's model-written description is no part of the push)."""
        names = self.declaration.input
        if names:
            return {name: self.arguments[name] for name in names}
        return dict(self.arguments)

    @property
    def key(self) -> str:
        template = self.declaration.key
        if template is None:
            return default_key(self.tool, self.run_id, self.request)
        names = {**self.arguments, **self.groups, "tool": self.tool, "run_id": self.run_id}
        try:
            return template.format(**names)
        except (KeyError, IndexError, AttributeError) as exc:
            raise DeclarationError(
                f"the key template {template!r} of {self.tool!r} names {exc}, which this call "
                f"does not have (it has {', '.join(sorted(map(str, names)))})"
            ) from None

    def options(self, tool_call_id: str | None = None) -> EffectOptions:
        d = self.declaration
        options: EffectOptions = {
            "kind": d.kind,
            "target": d.target,
            "replay": d.replay,
            "request": self.request,
        }
        if d.timeout_s is not None:
            options["timeout_s"] = d.timeout_s
        if tool_call_id:
            options["tool_call_id"] = tool_call_id
        if d.authority is not None:
            options["authority"] = d.authority
        if d.amount is not None:
            options["amount"] = {"value": d.amount["value"], "currency": d.amount["currency"]}
        if d.wait_for_approval is not None:
            options["wait_for_approval"] = d.wait_for_approval
        return options

    def provider_id(self, text: str, structured: Any = None) -> str | None:
        """The provider's id in the tool's output: the declared field of its structured
        result (or of its text read as JSON), else the declared pattern's match in its text."""
        d = self.declaration
        if d.receipt_field is not None:
            try:
                return str(field_at(text if structured is None else structured, d.receipt_field))
            except TypeError:
                pass  # not there: the pattern, else no provider id
        if d.receipt_pattern is not None:
            found = d.receipt_pattern.search(text)
            if found is not None:
                named = found.groupdict().get("id")
                return named or (found.group(1) if found.re.groups else found.group(0))
        return None

    def receipt(self, text: str, structured: Any = None, *, call: str) -> dict[str, Any]:
        """The receipt's system and external id: the provider's id when the output has it,
        else the call itself (`call`, a tool call id or the key) under TOOL_CALL."""
        found = self.provider_id(text, structured)
        if found is None:
            return {"system": TOOL_CALL, "external_id": call}
        return {"system": self.declaration.system or self.declaration.target, "external_id": found}


@dataclass(frozen=True)
class Declarations:
    """A declarations file, read and checked."""

    effects: tuple[Declaration, ...] = ()
    run: str | None = None
    path: Path | None = None

    def call(self, tool: str, arguments: Any, run_id: str | None) -> Call | None:
        """The call as a declared effect in run `run_id` (the caller's choice: a run the
        command line or environment names, else `run`, else the agent's), or None when no
        declaration covers it."""
        if not isinstance(arguments, Mapping):
            arguments = {"input": arguments}
        for declaration in self.effects:
            groups = declaration.matches(tool, arguments)
            if groups is not None:
                return Call(declaration, tool, arguments, groups, run_id)
        return None

    @property
    def tools(self) -> frozenset[str]:
        return frozenset(d.tool for d in self.effects)


def client_options() -> dict[str, Any]:
    """What the console scripts' clients take from the environment besides the URL, key and
    spool: `TALLYBOOK_INTENT_BUDGET`, the seconds an intent may take (2 by default)."""
    budget = os.environ.get("TALLYBOOK_INTENT_BUDGET")
    if not budget:
        return {}
    try:
        seconds = float(budget)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise DeclarationError(
            f"TALLYBOOK_INTENT_BUDGET={budget!r} must be a positive number of seconds"
        )
    return {"intent_budget": seconds}


def load(path: str | Path) -> Declarations:
    """Read and check a declarations file; DeclarationError says what is wrong where."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DeclarationError(f"{path}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise DeclarationError(f"{path}: not JSON ({exc})") from None
    return parse(raw, path)


def parse(raw: Any, path: Path | None = None) -> Declarations:
    where = f"{path}: " if path else ""
    if not isinstance(raw, dict):
        raise DeclarationError(f"{where}must be a JSON object with an 'effects' list")
    if unknown := set(raw) - {"effects", "run"}:
        raise DeclarationError(f"{where}unknown field(s) {', '.join(sorted(unknown))}")
    run = raw.get("run")
    if run is not None and (not isinstance(run, str) or not run):
        raise DeclarationError(f"{where}'run' must be a non-empty string")
    effects = raw.get("effects", [])
    if not isinstance(effects, list):
        raise DeclarationError(f"{where}'effects' must be a list")
    declared = tuple(_declaration(entry, f"{where}effects[{i}]") for i, entry in enumerate(effects))
    return Declarations(declared, run, path)


def _declaration(entry: Any, where: str) -> Declaration:
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where} must be an object")
    if unknown := set(entry) - FIELDS:
        raise DeclarationError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
    for name in ("tool", "kind", "target"):
        if not isinstance(entry.get(name), str) or not entry[name]:
            raise DeclarationError(f"{where}.{name} is required: a non-empty string")
    where = f"{where} ({entry['tool']})"
    patterns = entry.get("input", {})
    if not isinstance(patterns, dict) or not all(isinstance(v, str) for v in patterns.values()):
        raise DeclarationError(f"{where}.input must map input fields to regular expressions")
    compiled = {name: _regex(p, f"{where}.input.{name}") for name, p in patterns.items()}
    key = entry.get("key")
    if key is not None:
        if not isinstance(key, str) or not key:
            raise DeclarationError(f"{where}.key must be a template string")
        _template(key, f"{where}.key")
    replay = entry.get("replay", "never")
    if replay not in REPLAY_POLICIES:
        raise DeclarationError(f"{where}.replay must be one of {', '.join(REPLAY_POLICIES)}")
    timeout = entry.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0
    ):
        raise DeclarationError(f"{where}.timeout_s must be a positive number of seconds")
    authority = entry.get("authority")
    if authority is not None and not isinstance(authority, dict):
        raise DeclarationError(f"{where}.authority must be an object, e.g. {{'grant': 4}}")
    amount = entry.get("amount")
    if amount is not None and (
        not isinstance(amount, dict)
        or set(amount) != {"value", "currency"}
        or not all(isinstance(v, str) for v in amount.values())
    ):
        raise DeclarationError(f"{where}.amount must be {{'value': '12.50', 'currency': 'EUR'}}")
    receipt = entry.get("receipt", {})
    if not isinstance(receipt, dict) or (unknown := set(receipt) - RECEIPT_FIELDS):
        raise DeclarationError(
            f"{where}.receipt must be an object of 'pattern' (a regular expression over the "
            "tool's output), 'field' (a path in its structured result) and 'system'"
        )
    for name in ("field", "system"):
        if name in receipt and (not isinstance(receipt[name], str) or not receipt[name]):
            raise DeclarationError(f"{where}.receipt.{name} must be a non-empty string")
    pattern = receipt.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise DeclarationError(f"{where}.receipt.pattern must be a regular expression")
    failure = entry.get("failure", "uncertain")
    if failure not in ("uncertain", "definitive"):
        raise DeclarationError(
            f"{where}.failure must be 'uncertain' (a failed call may have done it) or "
            "'definitive' (a failed call did nothing)"
        )
    wait = entry.get("wait_for_approval")
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float))):
        raise DeclarationError(f"{where}.wait_for_approval must be a number of seconds")
    return Declaration(
        tool=entry["tool"],
        kind=entry["kind"],
        target=entry["target"],
        input=compiled,
        key=key,
        replay=replay,
        timeout_s=timeout,
        authority=authority,
        amount=amount,
        receipt_pattern=_regex(pattern, f"{where}.receipt.pattern") if pattern else None,
        receipt_field=receipt.get("field"),
        system=receipt.get("system"),
        definitive_failure=failure == "definitive",
        wait_for_approval=wait,
    )


def _regex(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise DeclarationError(f"{where} is not a regular expression: {exc}") from None


def _template(template: str, where: str) -> None:
    try:
        template_names(template, where)
    except TypeError as exc:
        raise DeclarationError(str(exc)) from None
