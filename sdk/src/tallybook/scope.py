"""The run an effect belongs to, and the context it runs under, for the code running now.

It lives in a ContextVar, set by `Tallybook.run()` and `Tallybook.context()`: it follows
the code through threads started with `contextvars.copy_context()` and through asyncio
tasks, and needs no client to be read (the OpenTelemetry span processor reads it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Scope:
    run_id: str | None = None
    tool_call_id: str | None = None
    context: dict[str, Any] = field(default_factory=dict)


# Never changed in place: entering a scope sets a new one.
OUTSIDE = Scope()
_scope: ContextVar[Scope] = ContextVar("tallybook_scope", default=OUTSIDE)


def current() -> Scope:
    return _scope.get()


def current_run() -> str | None:
    """The id of the run given to the innermost `tb.run(...)` around this code, if any."""
    return _scope.get().run_id


def without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


@contextmanager
def entered(
    *, run_id: str | None = None, tool_call_id: str | None = None, **context: Any
) -> Iterator[None]:
    """Inside, the scope is the current one with these ids, and the context added to."""
    now = _scope.get()
    token = _scope.set(
        replace(
            now,
            run_id=run_id or now.run_id,
            tool_call_id=tool_call_id or now.tool_call_id,
            context={**now.context, **without_none(context)},
        )
    )
    try:
        yield
    finally:
        _scope.reset(token)
