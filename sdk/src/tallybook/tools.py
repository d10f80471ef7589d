"""What `@tb.tool` knows about a tool function: its key, its request, where its receipt is.

Everything that can be wrong with a decoration is found when the function is decorated,
or when it is called and before its effect runs, never after the effect happened.
"""

from __future__ import annotations

import inspect
import json
import logging
import string
from collections.abc import Callable, Mapping
from typing import Any

from tallybook import scope
from tallybook.errors import TallybookError
from tallybook.records import Receipt

log = logging.getLogger("tallybook")

# Where the receipt of a tool's effect comes from: the result itself (None), the result's
# field holding the external id (a name), or a function of the result.
ReceiptFrom = None | str | Callable[[Any], Receipt]
# The ids a key template may name besides the tool's own arguments.
SCOPE_NAMES = ("run_id", "tool_call_id")
# A result larger than this (as JSON) is not kept with the receipt; the receipt still is.
MAX_RESULT = 256 * 1024


class ToolCall:
    """How a tool function's arguments become an effect's key and request, and its result a
    receipt; and what a call answers when the effect was done before."""

    def __init__(
        self,
        fn: Callable[..., Any],
        key: str | Callable[..., str],
        *,
        system: str,
        request: Callable[..., Any] | None = None,
        receipt: ReceiptFrom = None,
    ) -> None:
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.key, self.request, self.receipt, self.system = key, request, receipt, system
        params = set(self.signature.parameters)
        if isinstance(key, str):
            _check_names(self.name, "key template", template_names(key), {*params, *SCOPE_NAMES})
        else:
            _check_callable(self.name, "key", key, params)
        if request is not None:
            _check_callable(self.name, "request", request, params)
        if receipt is None and not _returns_receipt(fn):
            raise TypeError(
                f"{self.name} does not return a tallybook.Receipt: say where its receipt is, "
                "receipt='id' (the result's field with the external id) or "
                "receipt=lambda result: Receipt(...)"
            )
        if receipt is not None and not (isinstance(receipt, str) or callable(receipt)):
            raise TypeError(f"receipt= of {self.name} must be a field name or a function")

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """The effect's key and request for these arguments."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if isinstance(self.key, str):
            now = scope.current()
            ids = {"run_id": now.run_id, "tool_call_id": now.tool_call_id}
            for name in sorted(template_names(self.key) & set(ids) - set(arguments)):
                if ids[name] is None:
                    raise TallybookError(
                        f"The key of {self.name} names {{{name}}}, but none is current: call it "
                        "inside tb.run(...) (and tb.context(tool_call_id=...) for a tool call)"
                    )
            key = self.key.format(**{**ids, **arguments})
        else:
            key = _call_with(self.key, arguments)
        request = arguments if self.request is None else _call_with(self.request, arguments)
        return key, request

    def evidence(self, result: Any) -> tuple[dict[str, Any], TypeError | None]:
        """`fx.receipt`'s arguments for the result, and the error to raise once it is sent."""
        if self.receipt is None:
            if not isinstance(result, Receipt):
                raise TypeError(
                    f"{self.name} must return a tallybook.Receipt, not {type(result).__name__}"
                )
            return _fields(result, result.data), None
        if isinstance(self.receipt, str):
            made = Receipt(system=self.system, external_id=str(_field(result, self.receipt)))
        else:
            made = self.receipt(result)
        kept: dict[str, Any] = {"result": result}
        if made.data is not None:
            kept["data"] = made.data
        try:
            size = len(json.dumps(kept))
        except (TypeError, ValueError) as exc:
            # The effect happened: its receipt is sent all the same, then the bug is reported.
            return _fields(made, made.data), TypeError(
                f"The result of {self.name} is not JSON ({exc}); its receipt was recorded "
                "without it, and a repeated call answers with the Receipt"
            )
        if size > MAX_RESULT:
            log.warning("The result of %s (%d bytes) is not kept with its receipt", self.name, size)
            return _fields(made, made.data), None
        return _fields(made, kept), None

    def answer(self, result: Any, recorded: Receipt) -> Any:
        """What a call that performed the effect returns."""
        return recorded if self.receipt is None else result

    def replay(self, stored: Receipt) -> Any:
        """What a call returns for an effect done before: the result it returned then.

        A tool whose function returns its Receipt gets the Receipt; so does a call whose
        receipt carries no result (an operator or a reconciler found the effect).
        """
        if self.receipt is not None and isinstance(stored.data, dict) and "result" in stored.data:
            return stored.data["result"]
        return stored


def _fields(made: Receipt, data: Any) -> dict[str, Any]:
    return {
        "system": made.system,
        "external_id": made.external_id,
        "observed_at": made.observed_at,
        "data": data,
    }


def _field(result: Any, name: str) -> Any:
    value = result.get(name) if isinstance(result, Mapping) else getattr(result, name, None)
    if value is None or value == "":
        raise TypeError(f"the result has no {name!r} to take the receipt's external id from")
    return value


def _returns_receipt(fn: Callable[..., Any]) -> bool:
    # Under `from __future__ import annotations` the annotation is the string as written.
    returns = inspect.signature(fn).return_annotation
    return returns is Receipt or (isinstance(returns, str) and returns.split(".")[-1] == "Receipt")


def template_names(template: str, what: str | None = None) -> set[str]:
    """The names a str.format key template uses ("{order.id}" uses order); TypeError, saying
    `what` (by default "the key template '…'"), when it is no template or names no field."""
    what = what or f"the key template {template!r}"
    names = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TypeError(f"{what} is not a template: {exc}") from None
    for _, field, _, _ in parsed:
        if field is not None:
            if not field or field.isdigit():
                raise TypeError(f"{what} must name its fields ('refund:{{order}}')")
            names.add(field.split(".")[0].split("[")[0])
    return names


def _check_callable(tool: str, role: str, fn: Callable[..., Any], params: set[str]) -> None:
    accepts = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts):
        return
    _check_names(tool, f"{role} function", {p.name for p in accepts}, params)


def _check_names(tool: str, role: str, names: set[str], known: set[str]) -> None:
    if unknown := names - known:
        raise TypeError(
            f"the {role} of {tool} names {', '.join(sorted(unknown))}, which {tool} does not take"
        )


def _call_with(fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    """Call a key or request function with the tool's arguments it names."""
    accepts = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts.values()):
        return fn(**arguments)
    return fn(**{name: value for name, value in arguments.items() if name in accepts})
