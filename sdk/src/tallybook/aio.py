"""AsyncTallybook: the same surface for asyncio code.

The blocking work (HTTP, fsync) runs in the default executor through
`asyncio.to_thread`, sharing the sync client's transport, spool and rules; the event
loop is never blocked, and the run context and current span follow into the thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from tallybook.client import (
    Base,
    Block,
    EffectOptions,
    Observed,
    P,
    ReceiptSlot,
    T,
    ToolOptions,
    check_options,
    in_doubt,
    polls,
    still_in_doubt,
)
from tallybook.records import EffectStatus, Receipt
from tallybook.tools import ReceiptFrom, ToolCall

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack


class AsyncToolDecorator(Protocol):
    def __call__(self, fn: Callable[P, Awaitable[T]], /) -> Callable[P, Coroutine[Any, Any, T]]: ...


class AsyncEffect(Block):
    """`async with tb.effect(...) as fx`: the intent on entry, the outcome on exit."""

    _tb: AsyncTallybook

    async def __aenter__(self) -> Self:
        body = self._begin()
        fail_open = self._options.get("fail_open")
        try:
            answer = await asyncio.to_thread(self._tb._intent, self.key, body, fail_open)
            while (step := self._before_giving_up(answer)) is not None:
                assert answer is not None
                if step == "probe":
                    found = self._options["on_in_doubt"](in_doubt(self.key, answer))
                    if inspect.isawaitable(found):
                        found = await found
                    if (receipt := self._probe_body(answer, found)) is None:
                        continue
                    await asyncio.to_thread(self._tb._record, "receipts", receipt)
                else:
                    await self._tb.wait_for(self.key, timeout=step)
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
                await asyncio.to_thread(self._tb._report, failure)
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
        body = self._failure_once(error, definitive)
        await asyncio.to_thread(self._tb._record, "failures", body)

    async def _record_receipt(self, **fields: Any) -> Receipt:
        body, receipt = self._receipt_once(**fields)
        if body is not None:
            await asyncio.to_thread(self._tb._record, "receipts", body)
        return receipt


class AsyncTallybook(Base):
    """The Tallybook client for asyncio; see `Tallybook` for the arguments."""

    def effect(self, key: str, **options: Unpack[EffectOptions]) -> AsyncEffect:
        """Make one external effect durable: `async with tb.effect("refund:42", ...) as fx:`."""
        return AsyncEffect(self, key, options)

    def tool(
        self,
        key: str | Callable[..., str],
        *,
        request: Callable[..., Any] | None = None,
        receipt: ReceiptFrom = None,
        **options: Unpack[ToolOptions],
    ) -> AsyncToolDecorator:
        """Decorate an async tool function that performs an effect; see `Tallybook.tool`."""
        check_options(options, ToolOptions, required=("kind", "target"))

        def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
            call = ToolCall(fn, key, system=options["target"], request=request, receipt=receipt)

            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                effect_key, body = call.bind(args, kwargs)
                async with self.effect(effect_key, request=body, **options) as fx:
                    if fx.completed:
                        replayed: T = call.replay(fx._done_before())
                        return replayed
                    result = await fn(*args, **kwargs)
                    fields, problem = call.evidence(result)
                    recorded = await fx.receipt(**fields)
                    if problem is not None:
                        raise problem
                    answer: T = call.answer(result, recorded)
                    return answer

            return wrapper

        return decorate

    async def receipt(
        self,
        key: str,
        *,
        system: str,
        external_id: str,
        observed_at: Observed = None,
        data: Any = None,
        attempt: int | None = None,
    ) -> Receipt:
        """Record a receipt outside an effect block; see `Tallybook.receipt`."""
        return await asyncio.to_thread(
            functools.partial(
                self._receipt_later,
                key,
                system=system,
                external_id=external_id,
                observed_at=observed_at,
                data=data,
                attempt=attempt,
            )
        )

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

    async def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every spooled receipt and failure is delivered; whether they are."""
        return await asyncio.to_thread(self._flush, timeout)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Deliver what the spool holds (unless the server is away), then stop sending."""
        await asyncio.to_thread(self._close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
