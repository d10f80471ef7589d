"""AsyncTallybook: the same surface for asyncio code.

The blocking work (HTTP, fsync) runs in the default executor through
`asyncio.to_thread`, sharing the sync client's transport, spool and rules; the event
loop is never blocked, and the run context and current span follow into the thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from tallybook.client import (
    Base,
    Block,
    EffectOptions,
    P,
    ReceiptSlot,
    ToolCall,
    ToolOptions,
    polls,
    still_in_doubt,
    tool_receipt,
)
from tallybook.records import EffectStatus, Receipt

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack


class AsyncToolDecorator(Protocol):
    def __call__(
        self, fn: Callable[P, Awaitable[Receipt]], /
    ) -> Callable[P, Coroutine[Any, Any, Receipt]]: ...


class AsyncEffect(Block):
    """`async with tb.effect(...) as fx`: the intent on entry, the outcome on exit."""

    async def __aenter__(self) -> Self:
        body = self._begin()
        fail_open = self._options.get("fail_open")
        try:
            answer = await asyncio.to_thread(self._tb._intent, self.key, body, fail_open)
            if (patience := self._awaits_approval(answer)) is not None:
                assert isinstance(self._tb, AsyncTallybook)
                await self._tb.wait_for(self.key, timeout=patience)
                answer = await asyncio.to_thread(self._tb._intent, self.key, body, fail_open)
            self._answered(answer)
        except BaseException as exc:
            self._span.end(exc)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        failure, unsettled = self._exit_plan(exc)
        try:
            if failure is not None:
                await asyncio.to_thread(self._tb._report, failure, exc)
        finally:
            self._span.end(exc or unsettled)
        if unsettled is not None:
            raise unsettled

    @property
    def receipt(self) -> ReceiptSlot[Coroutine[Any, Any, Receipt]]:
        """The receipt on record; `await fx.receipt(system=..., external_id=...)` records one."""
        return ReceiptSlot(self._stored, self._record_receipt)

    async def fail(self, error: str | BaseException, *, definitive: bool = False) -> None:
        """The effect failed; `definitive=True` when the provider said nothing happened."""
        await asyncio.to_thread(self._tb._record, "failures", self._failure_body(error, definitive))
        self._settled = True

    async def _record_receipt(self, **fields: Any) -> Receipt:
        body = self._receipt_body(**fields)
        return self._receipt_recorded(
            body, await asyncio.to_thread(self._tb._record, "receipts", body)
        )


class AsyncTallybook(Base):
    """The Tallybook client for asyncio; see `Tallybook` for the arguments."""

    def effect(self, key: str, **options: Unpack[EffectOptions]) -> AsyncEffect:
        """Make one external effect durable: `async with tb.effect("refund:42", ...) as fx:`."""
        return AsyncEffect(self, key, options)

    def tool(
        self, key: str | Callable[..., str], **options: Unpack[ToolOptions]
    ) -> AsyncToolDecorator:
        """Decorate an async tool function that performs an effect and returns its `Receipt`."""

        def decorate(
            fn: Callable[P, Awaitable[Receipt]],
        ) -> Callable[P, Coroutine[Any, Any, Receipt]]:
            call = ToolCall(fn, key)

            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Receipt:
                effect_key, request = call.bind(args, kwargs)
                async with self.effect(effect_key, request=request, **options) as fx:
                    if fx.completed:
                        return fx._done_before()
                    return await fx.receipt(**tool_receipt(await fn(*args, **kwargs), fn))

            return wrapper

        return decorate

    async def wait_for(
        self, key: str, *, timeout: float = 300.0, poll: float = 1.0
    ) -> EffectStatus:
        """Poll until the effect's decision is no longer `wait` (a person settled its case).

        Raises EffectInDoubt when it still is after `timeout` seconds.
        """
        pauses = polls(timeout, poll)
        while (status := await asyncio.to_thread(self._status, key)).decision == "wait":
            pause = next(pauses, None)
            if pause is None:
                raise still_in_doubt(key, status, timeout)
            await asyncio.sleep(pause)
        return status

    async def aclose(self) -> None:
        """Stop the spool's delivery thread; what it holds waits for the next client."""
        await asyncio.to_thread(self._close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
