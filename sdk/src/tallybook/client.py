"""Tallybook, the synchronous client, and what it shares with the asyncio one.

The client records an intent before each effect and blocks on the answer; receipts
and failures go through the local spool (see `spool.py`) so none is lost. The run
context set by `run()` and `context()` lives in a ContextVar: it follows the code
through threads started with `contextvars.copy_context()` and through asyncio tasks.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypedDict,
    TypeVar,
)
from urllib.parse import quote

from tallybook import tracing
from tallybook.errors import (
    INTERRUPTIONS,
    EffectInDoubt,
    EffectUnsettled,
    IntentNotRecorded,
    RequestRejected,
    ServerUnavailable,
    TallybookError,
)
from tallybook.records import EffectStatus, Json, Receipt, iso8601
from tallybook.spool import Entry, Spool, default_root, spool_dir
from tallybook.transport import Retry, Transport

if TYPE_CHECKING:
    # Annotations only (never evaluated): Python 3.10 has these in typing_extensions' stubs.
    from typing_extensions import NotRequired, Self, Unpack

VERSION = "0.1.0"
DEFAULT_URL = "http://127.0.0.1:8000"
NO_RETRY = Retry(retries=0)
MAX_ERROR = 4000  # what the server keeps of a failure's error
APPROVAL = "approval_required"  # the case of an effect that waits for a person's approval
log = logging.getLogger("tallybook")

ReplayPolicy = Literal["never", "safe", "idempotent", "reconcile"]
Observed = datetime | float | str | None
R = TypeVar("R")
P = ParamSpec("P")


class Amount(TypedDict):
    """What an effect moves, for its grant's limits: `{"value": "12.50", "currency": "EUR"}`."""

    value: str
    currency: str


class ToolOptions(TypedDict):
    """What an effect declares besides its key and request."""

    kind: str
    target: str
    replay: NotRequired[ReplayPolicy]
    timeout_s: NotRequired[int]
    authority: NotRequired[dict[str, Any]]
    amount: NotRequired[Amount]
    # Seconds to wait for a person's approval when the grant requires one; without it (or
    # once it has passed) the block raises EffectInDoubt naming the approval.
    wait_for_approval: NotRequired[float]
    # Exceptions that mean the provider did nothing: reported as definitive failures.
    definitive_on: NotRequired[tuple[type[BaseException], ...]]
    fail_open: NotRequired[bool]


class EffectOptions(ToolOptions):
    request: NotRequired[Any]
    fingerprint: NotRequired[str]
    tool_call_id: NotRequired[str]


@dataclass(frozen=True)
class Scope:
    """The run an effect belongs to and the context it runs under."""

    run_id: str | None = None
    tool_call_id: str | None = None
    context: dict[str, Any] = field(default_factory=dict)


NO_SCOPE = Scope()
_scope: ContextVar[Scope] = ContextVar("tallybook_scope", default=NO_SCOPE)


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class ReceiptSlot(Generic[R]):
    """`fx.receipt`: the receipt on record (its attributes) and, called, how to record one."""

    __slots__ = ("_record", "_stored")

    def __init__(self, stored: Receipt | None, record: Callable[..., R]) -> None:
        self._stored = stored
        self._record = record

    def __call__(
        self, *, system: str, external_id: str, observed_at: Observed = None, data: Any = None
    ) -> R:
        return self._record(
            system=system, external_id=external_id, observed_at=observed_at, data=data
        )

    @property
    def stored(self) -> Receipt | None:
        return self._stored

    def __bool__(self) -> bool:
        return self._stored is not None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or self._stored is None:
            raise AttributeError(f"no receipt on record, so no {name!r}")
        return getattr(self._stored, name)

    def __repr__(self) -> str:
        return f"ReceiptSlot({self._stored!r})"


class Block:
    """One effect block: the intent's answer and what leaving the block reports.

    The I/O is done by the sync and async subclasses; this holds the rules.
    """

    def __init__(self, tb: Base, key: str, options: EffectOptions) -> None:
        # The options are typed for mypy; a typo must fail at run time too, not be dropped.
        if unknown := set(options) - set(EffectOptions.__annotations__):
            raise TypeError(f"unknown effect option(s): {', '.join(sorted(unknown))}")
        if missing := {"kind", "target"} - set(options):
            raise TypeError(f"an effect needs {' and '.join(sorted(missing))}")
        self._tb = tb
        self.key = key
        self._options = options
        self._definitive_on = options.get("definitive_on", ())
        self._span = tracing.EffectSpan(tb.tracer_provider, key, options["kind"], options["target"])
        self.decision: str | None = None
        self.reason: str | None = None
        self.effect: Json | None = None
        self.attempt: int | None = None
        self.completed = False
        self.recorded = False
        self._stored: Receipt | None = None
        self._settled = False

    @property
    def url(self) -> str | None:
        """The effect's page for an operator."""
        return self.effect["url"] if self.effect else None

    def _begin(self) -> Json:
        """Start the effect's span and build its intent."""
        self._span.start()
        scope = _scope.get()
        options = self._options
        trace_id, span_id = self._span.ids
        return _without_none(
            {
                "key": self.key,
                "kind": options["kind"],
                "target": options["target"],
                "request": options.get("request"),
                "fingerprint": options.get("fingerprint"),
                "replay": options.get("replay", "never"),
                "timeout_s": options.get("timeout_s"),
                "run_id": scope.run_id,
                "tool_call_id": options.get("tool_call_id", scope.tool_call_id),
                "trace_id": trace_id,
                "span_id": span_id,
                "worker": self._tb.worker,
                "context": scope.context or None,
                "authority": options.get("authority"),
                "amount": options.get("amount"),
            }
        )

    def _awaits_approval(self, answer: Json | None) -> float | None:
        """How long to wait for the approval this answer asks for, if the block waits."""
        case = (answer or {}).get("case") or {}
        if answer is None or answer["decision"] != "wait" or case.get("reason") != APPROVAL:
            return None
        return self._options.get("wait_for_approval")

    def _answered(self, answer: Json | None) -> None:
        """Take the intent's answer: carry on, or raise the interruption report."""
        if answer is None:
            self.decision = "unrecorded"
            self._span.note(decision=self.decision)
            return
        self.decision, self.reason, self.effect = (
            answer["decision"],
            answer["reason"],
            answer["effect"],
        )
        self.attempt = answer["effect"]["attempt"]
        self._span.note(decision=answer["decision"], effect_id=answer["effect"]["id"])
        if answer["decision"] in INTERRUPTIONS:
            raise INTERRUPTIONS[answer["decision"]](self.key, answer)
        self.recorded = True
        if answer["decision"] == "completed":
            self.completed = True
            self._stored = Receipt.from_json(answer["receipt"]) if answer["receipt"] else None

    def _receipt_body(
        self, *, system: str, external_id: str, observed_at: Observed, data: Any
    ) -> Json:
        trace_id, span_id = self._span.receipt_ids()
        return _without_none(
            {
                "key": self.key,
                "system": system,
                "external_id": external_id,
                "observed_at": iso8601(observed_at),
                "data": data,
                "attempt": self.attempt,
                "trace_id": trace_id,
                "span_id": span_id,
            }
        )

    def _receipt_recorded(self, body: Json, answer: Json | None) -> Receipt:
        """The receipt is on record (or in the spool, on its way): the effect is settled."""
        self._settled = True
        self._stored = (
            Receipt.from_json(answer["receipt"])
            if answer
            else Receipt(
                system=body["system"],
                external_id=body["external_id"],
                observed_at=body.get("observed_at"),
                data=body.get("data"),
                key=self.key,
                attempt=self.attempt,
            )
        )
        return self._stored

    def _done_before(self) -> Receipt:
        """The receipt of an effect completed before; a `completed` answer always has one."""
        if self._stored is None:
            raise TallybookError(f"{self.key!r} is completed, but no receipt came with the answer")
        return self._stored

    def _failure_body(self, error: str | BaseException, definitive: bool) -> Json:
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        return {"key": self.key, "error": error[:MAX_ERROR] or "failed", "definitive": definitive}

    def _exit_plan(self, exc: BaseException | None) -> tuple[Json | None, EffectUnsettled | None]:
        """The failure that leaving the block reports, and the error for leaving it unsettled."""
        if self.completed or self._settled:
            return None, None
        if exc is not None:
            return self._failure_body(exc, isinstance(exc, self._definitive_on)), None
        unsettled = EffectUnsettled(
            f"The effect block for {self.key!r} was left with neither a receipt nor a failure; "
            "call fx.receipt(...) after the effect or fx.fail(...) when it did not happen. "
            "Tallybook now treats its outcome as unknown."
        )
        return self._failure_body(unsettled, False), unsettled


def tool_receipt(made: object, fn: Callable[..., Any]) -> dict[str, Any]:
    """The receipt a decorated tool function returned, as the arguments of `fx.receipt`."""
    if not isinstance(made, Receipt):
        raise TypeError(
            f"{fn.__qualname__} must return a tallybook.Receipt, not {type(made).__name__}"
        )
    return {
        "system": made.system,
        "external_id": made.external_id,
        "observed_at": made.observed_at,
        "data": made.data,
    }


class ToolDecorator(Protocol):
    def __call__(self, fn: Callable[P, Receipt], /) -> Callable[P, Receipt]: ...


class ToolCall:
    """How a decorated tool function's arguments become an effect's key and request."""

    def __init__(self, fn: Callable[..., Any], key: str | Callable[..., str]) -> None:
        self.key = key
        self.signature = inspect.signature(fn)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        request = dict(bound.arguments)
        key = self.key.format(**request) if isinstance(self.key, str) else self.key(*args, **kwargs)
        return key, request


class Base:
    """Configuration, the run context and the (blocking) conversation with the server."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        spool: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 30.0,
        fail_open: bool = False,
        worker: str | None = None,
        tracer_provider: Any = None,
    ) -> None:
        url = url or os.environ.get("TALLYBOOK_URL") or DEFAULT_URL
        api_key = api_key or os.environ.get("TALLYBOOK_API_KEY")
        if not api_key:
            raise TallybookError("No API key: pass api_key=... or set TALLYBOOK_API_KEY")
        self._transport = Transport(
            url,
            api_key,
            timeout=timeout,
            retry=Retry(retries, backoff, max_backoff),
            user_agent=f"tallybook-python/{VERSION} python/{sys.version.split()[0]}",
        )
        root = Path(spool) if spool is not None else default_root()
        self.spool = Spool(spool_dir(root, self._transport.url, api_key))
        self.fail_open = fail_open
        self.tracer_provider = tracer_provider
        self._worker_given = worker
        self._worker, self._worker_pid = worker or _new_worker(), os.getpid()
        self._closed = threading.Event()
        self._pump_lock = threading.Lock()
        self._pump_thread: threading.Thread | None = None
        if self.spool.pending():
            self._pump_start()

    @property
    def url(self) -> str:
        return self._transport.url

    @property
    def worker(self) -> str:
        """This process's identity: asking again for its own pending attempt is a retry."""
        if self._worker_pid != os.getpid() and not self._worker_given:
            # A forked child is another process: its attempts are not its parent's.
            self._worker, self._worker_pid = _new_worker(), os.getpid()
        return self._worker

    # -- the run context -----------------------------------------------------------------

    @contextmanager
    def run(
        self,
        workflow: str,
        *,
        version: str | None = None,
        run_id: str | None = None,
        **context: Any,
    ) -> Iterator[str]:
        """Effects inside belong to this run; yields its id.

        Give a stable `run_id` (a ticket id, a job id) so that a restarted process is
        recognised as the same run resuming.
        """
        run_id = run_id or secrets.token_hex(16)
        current = _scope.get()
        fields = {"workflow": workflow, "workflow_version": version, **context}
        scope = replace(
            current, run_id=run_id, context={**current.context, **_without_none(fields)}
        )
        token = _scope.set(scope)
        try:
            yield run_id
        finally:
            _scope.reset(token)

    @contextmanager
    def context(
        self,
        *,
        model: str | None = None,
        code_version: str | None = None,
        tools: dict[str, str] | list[str] | None = None,
        memory_digest: str | None = None,
        policy_version: str | None = None,
        tool_call_id: str | None = None,
        **extras: Any,
    ) -> Iterator[None]:
        """Add to the context every intent inside carries; `tool_call_id` names the call."""
        current = _scope.get()
        fields = {
            "model": model,
            "code_version": code_version,
            "tools": tools,
            "memory_digest": memory_digest,
            "policy_version": policy_version,
            **extras,
        }
        scope = replace(
            current,
            tool_call_id=tool_call_id or current.tool_call_id,
            context={**current.context, **_without_none(fields)},
        )
        token = _scope.set(scope)
        try:
            yield
        finally:
            _scope.reset(token)

    # -- talking to the server (blocking; the async client runs these in threads) ----------

    def _intent(self, key: str, body: Json, fail_open: bool | None) -> Json | None:
        """Record an intent; the answer, or None when the server is away and we fail open."""
        try:
            # Events spooled earlier go first: a receipt must not arrive after a later intent.
            self._flush(wait=True)
            response = self._transport.request("POST", "/api/v1/intents", body)
        except ServerUnavailable as exc:
            if not (self.fail_open if fail_open is None else fail_open):
                raise IntentNotRecorded(key, exc) from exc
            log.warning("Tallybook is away; %r runs unrecorded (fail_open): %s", key, exc)
            self.spool.release(self.spool.put("intents", body))
            self._pump_start()
            return None
        if response.status not in (200, 201, 409):
            raise IntentNotRecorded(key, _rejected(response.status, response.body))
        answer: Json = response.body
        return answer

    def _record(self, endpoint: str, body: Json) -> Json | None:
        """Spool an event, then send it; the answer, or None when it waits in the spool."""
        entry = self.spool.put(endpoint, body)
        if self._pump_running():
            # The server is known to be away: the pump delivers it, in order, when it is back.
            self.spool.release(entry)
            return None
        try:
            return self._deliver(entry, None)
        except ServerUnavailable:
            return None

    def _report(self, failure: Json, exc: BaseException | None) -> None:
        """Report how a block ended without masking the exception that ended it."""
        try:
            self._record("failures", failure)
        except RequestRejected as rejected:
            log.error("Tallybook refused the failure of %r: %s", failure["key"], rejected)
            if exc is not None and sys.version_info >= (3, 11):
                exc.add_note(f"Tallybook refused the failure report: {rejected}")

    def _deliver(self, entry: Entry, retry: Retry | None) -> Json | None:
        try:
            response = self._transport.request(
                "POST", f"/api/v1/{entry.endpoint}", entry.body, retry=retry
            )
        except BaseException as exc:
            self.spool.release(entry)
            if isinstance(exc, ServerUnavailable):
                self._pump_start()
            raise
        if response.status < 300 or (entry.endpoint == "intents" and response.status == 409):
            self.spool.done(entry)
            answer: Json = response.body
            return answer
        if entry.endpoint == "failures" and response.status in (404, 409):
            # The server settled the effect some other way first; it knows better.
            log.warning(
                "Tallybook did not apply the failure of %r: %s", entry.body["key"], response.body
            )
            self.spool.done(entry)
            return None
        self.spool.reject(entry, json.dumps(response.body))
        raise _rejected(response.status, response.body)

    def _flush(self, *, wait: bool, retry: Retry | None = None) -> None:
        """Send spooled events oldest first; stops at the first the server cannot take."""
        for path in self.spool.pending():
            entry = self.spool.claim(path, wait=wait)
            if entry is None:
                continue
            try:
                self._deliver(entry, retry)
            except RequestRejected:
                continue  # set aside in the spool's rejected folder, and logged

    def _pump_running(self) -> bool:
        with self._pump_lock:
            return self._pump_thread is not None and self._pump_thread.is_alive()

    def _pump_start(self) -> None:
        with self._pump_lock:
            if self._closed.is_set():
                return
            if self._pump_thread is None or not self._pump_thread.is_alive():
                self._pump_thread = threading.Thread(
                    target=self._pump, name="tallybook-spool", daemon=True
                )
                self._pump_thread.start()

    def _pump(self) -> None:
        """Deliver what the spool holds, backing off while the server is away."""
        failures = 0
        while not self._closed.is_set():
            try:
                self._flush(wait=False, retry=NO_RETRY)
            except ServerUnavailable:
                failures += 1
            except Exception:
                log.exception("Tallybook spool delivery failed")
                failures += 1
            else:
                failures = 0
                with self._pump_lock:
                    if not self.spool.pending():
                        self._pump_thread = None
                        return
            # Entries are left: the server is away, or another sender holds them.
            self._closed.wait(self._transport.retry.delay(min(failures, 16)))

    def _status(self, key: str) -> EffectStatus:
        response = self._transport.request("GET", f"/api/v1/effects?key={quote(key, safe='')}")
        if response.status != 200:
            raise _rejected(response.status, response.body)
        return EffectStatus.from_json(response.body)

    def _close(self) -> None:
        with self._pump_lock:
            self._closed.set()
            pump = self._pump_thread
        if pump is not None:
            pump.join(timeout=self._transport.timeout)
        self._transport.close()
        if left := len(self.spool.pending()):
            log.warning(
                "%d Tallybook event(s) wait in %s for the next client", left, self.spool.directory
            )


def _new_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _rejected(status: int, body: Any) -> RequestRejected:
    if isinstance(body, dict):
        return RequestRejected(status, str(body.get("error", body)), body.get("fields"))
    return RequestRejected(status, str(body))


def polls(timeout: float, poll: float) -> Iterator[float]:
    """The pauses of a poll that gives up after `timeout` seconds, growing to 10 s."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        yield min(poll, left)
        poll = min(poll * 1.5, 10.0)


def still_in_doubt(key: str, status: EffectStatus, timeout: float) -> EffectInDoubt:
    case = next((c for c in status.cases if c.reason == "uncertain"), None) or next(
        iter(status.cases), None
    )
    answer = {
        "decision": status.decision,
        "reason": f"Still waiting after {timeout:g} s: {status.reason}",
        "effect": status.effect,
        "case": asdict(case) if case else None,
    }
    return EffectInDoubt(key, answer)


class Effect(Block):
    """`with tb.effect(...) as fx`: the intent is recorded on entry, the outcome on exit."""

    def __enter__(self) -> Self:
        body = self._begin()
        fail_open = self._options.get("fail_open")
        try:
            answer = self._tb._intent(self.key, body, fail_open)
            if (patience := self._awaits_approval(answer)) is not None:
                # Approved (or denied) in time: ask again, and the answer says which.
                assert isinstance(self._tb, Tallybook)
                self._tb.wait_for(self.key, timeout=patience)
                answer = self._tb._intent(self.key, body, fail_open)
            self._answered(answer)
        except BaseException as exc:
            self._span.end(exc)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        failure, unsettled = self._exit_plan(exc)
        try:
            if failure is not None:
                self._tb._report(failure, exc)
        finally:
            self._span.end(exc or unsettled)
        if unsettled is not None:
            raise unsettled

    @property
    def receipt(self) -> ReceiptSlot[Receipt]:
        """The receipt on record; `fx.receipt(system=..., external_id=...)` records one."""
        return ReceiptSlot(self._stored, self._record_receipt)

    def fail(self, error: str | BaseException, *, definitive: bool = False) -> None:
        """The effect failed; `definitive=True` when the provider said nothing happened."""
        self._tb._record("failures", self._failure_body(error, definitive))
        self._settled = True

    def _record_receipt(self, **fields: Any) -> Receipt:
        body = self._receipt_body(**fields)
        return self._receipt_recorded(body, self._tb._record("receipts", body))


class Tallybook(Base):
    """The Tallybook client. Thread-safe; one per process is plenty.

    `url` and `api_key` default to $TALLYBOOK_URL and $TALLYBOOK_API_KEY; `spool` to
    $TALLYBOOK_SPOOL_DIR, else the user's cache folder. With `fail_open=True` an effect
    whose intent cannot be recorded runs anyway (and its intent is spooled).
    """

    def effect(self, key: str, **options: Unpack[EffectOptions]) -> Effect:
        """Make one external effect durable: `with tb.effect("refund:42", ...) as fx:`."""
        return Effect(self, key, options)

    def tool(self, key: str | Callable[..., str], **options: Unpack[ToolOptions]) -> ToolDecorator:
        """Decorate a tool function that performs an effect and returns its `Receipt`.

        The key is a template of the arguments ("refund:{order_id}") or a function of
        them; the arguments are the request. An effect already done is not repeated:
        the call returns the stored receipt.
        """

        def decorate(fn: Callable[P, Receipt]) -> Callable[P, Receipt]:
            call = ToolCall(fn, key)

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> Receipt:
                effect_key, request = call.bind(args, kwargs)
                with self.effect(effect_key, request=request, **options) as fx:
                    if fx.completed:
                        return fx._done_before()
                    return fx.receipt(**tool_receipt(fn(*args, **kwargs), fn))

            return wrapper

        return decorate

    def wait_for(self, key: str, *, timeout: float = 300.0, poll: float = 1.0) -> EffectStatus:
        """Poll until the effect's decision is no longer `wait` (a person settled its case).

        Raises EffectInDoubt when it still is after `timeout` seconds.
        """
        pauses = polls(timeout, poll)
        while (status := self._status(key)).decision == "wait":
            pause = next(pauses, None)
            if pause is None:
                raise still_in_doubt(key, status, timeout)
            time.sleep(pause)
        return status

    def close(self) -> None:
        """Stop the spool's delivery thread; what it holds waits for the next client."""
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
