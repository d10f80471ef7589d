"""Tallybook, the synchronous client, and what it shares with the asyncio one.

The client records an intent before each effect and blocks on the answer, within a
budget of a couple of seconds; receipts and failures are written to the local spool
(see `spool.py`) and sent by a background thread, so none is lost and none makes the
agent wait. Nothing is read from the environment, and nothing touches the disk or the
network, until the client is first used.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
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
    get_args,
)
from urllib.parse import quote

from tallybook import scope, tracing
from tallybook.errors import (
    INTERRUPTIONS,
    EffectInDoubt,
    EffectUnsettled,
    IntentNotRecorded,
    ReceiptConflict,
    RequestRejected,
    ServerUnavailable,
    TallybookError,
)
from tallybook.records import EffectStatus, Json, Receipt, iso8601
from tallybook.spool import Entry, Spool, default_root, spool_dir
from tallybook.tools import ReceiptFrom, ToolCall
from tallybook.transport import Channel, Retry, Transport

if TYPE_CHECKING:
    # Annotations only (never evaluated): Python 3.10 has these in typing_extensions' stubs.
    from typing_extensions import NotRequired, Self, Unpack

VERSION = "0.1.0"
DEFAULT_URL = "http://127.0.0.1:8000"
NO_RETRY = Retry(retries=0)
# The spooled reports the sender sends in batches (POST /api/v1/<endpoint>/batch), and the
# most a batch holds (the server's MAX_BATCH).
BATCHED = ("receipts", "failures")
BATCH_ITEMS = 100
MAX_ERROR = 4000  # what the server keeps of a failure's error
APPROVAL = "approval_required"  # the case of an effect that waits for a person's approval
UNCERTAIN = "uncertain"  # the case of an effect that may or may not have happened
log = logging.getLogger("tallybook")

ReplayPolicy = Literal["never", "safe", "idempotent", "reconcile"]
REPLAY_POLICIES: tuple[ReplayPolicy, ...] = get_args(ReplayPolicy)
Observed = datetime | float | str | None
R = TypeVar("R")
T = TypeVar("T")
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
    # Seconds to wait, when the effect is in doubt, for a person or a reconciler to settle
    # it; then the block asks again, and runs, skips or raises as the answer says.
    wait_in_doubt: NotRequired[float]
    # Asked once when the effect is in doubt, before anyone else: the provider's receipt
    # if it did happen (recorded, and the block is `completed`), else None.
    on_in_doubt: NotRequired[Callable[[EffectInDoubt], Any]]
    # Exceptions that mean the provider did nothing: reported as definitive failures.
    definitive_on: NotRequired[tuple[type[BaseException], ...]]
    fail_open: NotRequired[bool]


class EffectOptions(ToolOptions):
    request: NotRequired[Any]
    fingerprint: NotRequired[str]
    tool_call_id: NotRequired[str]


@dataclass(frozen=True)
class Given:
    """The client's arguments, kept as given: the environment fills the gaps at first use."""

    url: str | None
    api_key: str | None
    spool: str | os.PathLike[str] | None
    timeout: float
    retry: Retry
    intent_budget: float
    fail_open: bool


# Set at first use and fixed from there on.
@dataclass(frozen=True)
class Config:
    transport: Channel
    spool: Spool
    fail_open: bool
    intent_budget: float


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


# What an effect block does with a `wait` answer before it gives up: ask the agent's
# probe, or wait that many seconds for a person.
Probe = Literal["probe"]


class Block:
    """One effect block: the intent's answer and what leaving the block reports.

    The I/O is done by the sync and async subclasses; this holds the rules.
    """

    def __init__(self, tb: Base, key: str, options: EffectOptions) -> None:
        check_options(options, EffectOptions, required=("kind", "target"))
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
        self._settled: str | None = None  # "receipt" or "failure", once reported
        self._probed = self._waited = False

    @property
    def url(self) -> str | None:
        """The effect's page for an operator."""
        return self.effect["url"] if self.effect else None

    def hand_off(self) -> None:
        """Its outcome is another process's to report (a hook's PostToolUse, with
        `tb.receipt(key, ...)`): leaving the block reports nothing."""
        self._settled = "handed off"

    def _begin(self) -> Json:
        """Start the effect's span and build its intent."""
        self._span.start()
        now = scope.current()
        options = self._options
        trace_id, span_id = self._span.ids
        return scope.without_none(
            {
                "key": self.key,
                "kind": options["kind"],
                "target": options["target"],
                "request": options.get("request"),
                "fingerprint": options.get("fingerprint"),
                "replay": options.get("replay", "never"),
                "timeout_s": options.get("timeout_s"),
                "run_id": now.run_id,
                "tool_call_id": options.get("tool_call_id", now.tool_call_id),
                "trace_id": trace_id,
                "span_id": span_id,
                "worker": self._tb.worker,
                "context": now.context or None,
                "authority": options.get("authority"),
                "amount": options.get("amount"),
            }
        )

    def _before_giving_up(self, answer: Json | None) -> Probe | float | None:
        """What to try on a `wait` answer before raising it: each at most once."""
        if answer is None or answer["decision"] != "wait":
            return None
        reason = (answer.get("case") or {}).get("reason")
        if reason == APPROVAL:
            patience = None if self._waited else self._options.get("wait_for_approval")
        elif reason == UNCERTAIN and "on_in_doubt" in self._options and not self._probed:
            self._probed = True
            return "probe"
        else:
            patience = None if self._waited else self._options.get("wait_in_doubt")
        self._waited = True
        return patience

    def _probe_body(self, answer: Json, found: object) -> Json | None:
        """The receipt an `on_in_doubt` probe found, for the attempt in doubt; None if none."""
        if found is None:
            return None
        if not isinstance(found, Receipt):
            raise TypeError(f"on_in_doubt must return a tallybook.Receipt or None, not {found!r}")
        self.attempt = answer["effect"]["attempt"]
        return self._receipt_body(**receipt_fields(found))

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
            raise INTERRUPTIONS[answer["decision"]].answered(self.key, answer)
        self.recorded = True
        if answer["decision"] == "completed":
            self.completed = True
            self._stored = Receipt.from_json(answer["receipt"]) if answer["receipt"] else None

    def _receipt_body(
        self, *, system: str, external_id: str, observed_at: Observed, data: Any
    ) -> Json:
        trace_id, span_id = self._span.receipt_ids()
        return receipt_body(
            self.key,
            system=system,
            external_id=external_id,
            observed_at=observed_at,
            data=data,
            attempt=self.attempt,
            ids=(trace_id, span_id),
        )

    def _receipt_once(self, **fields: Any) -> tuple[Json | None, Receipt]:
        """The receipt to send (None: this one is on record already) and the one to return.

        Raises before anything is sent when the block has another outcome already.
        """
        body = self._receipt_body(**fields)
        known = self._stored
        if known is not None and (known.system, known.external_id) == (
            body["system"],
            body["external_id"],
        ):
            return None, known
        self._one_outcome(f"a receipt {body['system']}:{body['external_id']}")
        self._settled = "receipt"
        self._stored = Receipt(
            system=body["system"],
            external_id=body["external_id"],
            observed_at=body.get("observed_at"),
            data=body.get("data"),
            key=self.key,
            attempt=self.attempt,
        )
        return body, self._stored

    def _failure_once(self, error: str | BaseException, definitive: bool) -> Json:
        self._one_outcome("a failure")
        self._settled = "failure"
        return self._failure_body(error, definitive)

    def _one_outcome(self, what: str) -> None:
        if self._stored is not None or self._settled is not None:
            had = (
                f"receipt {self._stored.system}:{self._stored.external_id}"
                if self._stored is not None
                else "failure"
            )
            raise ReceiptConflict(
                f"{self.key!r} already has its {had}; {what} was not sent. One block is one "
                "effect: if the provider really did it twice, report the second with "
                f"tb.receipt({self.key!r}, ...), which records it as a duplicate effect."
            )

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


def check_options(options: Any, declared: type[Any], *, required: tuple[str, ...]) -> None:
    """The options are typed for mypy; a typo must fail at run time too, not be dropped."""
    if unknown := set(options) - set(declared.__annotations__):
        raise TypeError(f"unknown effect option(s): {', '.join(sorted(unknown))}")
    if missing := set(required) - set(options):
        raise TypeError(f"an effect needs {' and '.join(sorted(missing))}")
    if "on_in_doubt" in options and not callable(options["on_in_doubt"]):
        raise TypeError("on_in_doubt must be a function of the EffectInDoubt report")
    for name in ("wait_for_approval", "wait_in_doubt", "timeout_s"):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"{name} must be a number of seconds, not {value!r}")


def receipt_fields(made: Receipt) -> dict[str, Any]:
    return {
        "system": made.system,
        "external_id": made.external_id,
        "observed_at": made.observed_at,
        "data": made.data,
    }


def receipt_body(
    key: str,
    *,
    system: str,
    external_id: str,
    observed_at: Observed,
    data: Any,
    attempt: int | None,
    ids: tracing.Ids,
) -> Json:
    """A receipt as the API takes it; what the server would refuse is refused here, unsent."""
    if not system or not external_id:
        raise ValueError("a receipt needs a system and an external_id")
    return scope.without_none(
        {
            "key": key,
            "system": system,
            "external_id": str(external_id),
            "observed_at": iso8601(observed_at),
            "data": data,
            "attempt": attempt,
            "trace_id": ids[0],
            "span_id": ids[1],
        }
    )


class Base:
    """Configuration, the run context and the conversation with the server."""

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
        intent_budget: float = 2.0,
        fail_open: bool = False,
        worker: str | None = None,
        tracer_provider: Any = None,
    ) -> None:
        retry = Retry(retries, backoff, max_backoff)
        self._given = Given(url, api_key, spool, timeout, retry, intent_budget, fail_open)
        self.tracer_provider = tracer_provider
        self._worker_given = worker
        self._worker, self._worker_pid = worker or _new_worker(), os.getpid()
        self._config_lock = threading.Lock()
        self._config: Config | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._sent = threading.Condition()
        self._sender_lock = threading.Lock()
        self._sender_thread: threading.Thread | None = None
        self._failing = False  # the sender's last pass found the server away
        self._no_batches = False  # the server answered 404 to a batch: send one by one

    def _configured(self) -> Config:
        """The configuration, read (from the arguments, else the environment) at first use."""
        with self._config_lock:
            if self._config is None:
                self._config = self._configure()
                if self._config.spool.pending():
                    self._sender_start()  # what an earlier process left
            return self._config

    def _configure(self) -> Config:
        given = self._given
        url = given.url or os.environ.get("TALLYBOOK_URL") or DEFAULT_URL
        api_key = given.api_key or os.environ.get("TALLYBOOK_API_KEY")
        if not api_key:
            raise TallybookError("No API key: pass api_key=... or set TALLYBOOK_API_KEY")
        transport = Transport(
            url,
            api_key,
            timeout=given.timeout,
            retry=given.retry,
            user_agent=f"tallybook-python/{VERSION} python/{sys.version.split()[0]}",
        )
        root = Path(given.spool) if given.spool is not None else default_root()
        spool = Spool(spool_dir(root, transport.url, api_key))
        return Config(transport, spool, given.fail_open, given.intent_budget)

    @property
    def url(self) -> str:
        return self._configured().transport.url

    @property
    def spool(self) -> Spool:
        return self._configured().spool

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
        with scope.entered(run_id=run_id, workflow=workflow, workflow_version=version, **context):
            yield run_id

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
        with scope.entered(
            tool_call_id=tool_call_id,
            model=model,
            code_version=code_version,
            tools=tools,
            memory_digest=memory_digest,
            policy_version=policy_version,
            **extras,
        ):
            yield

    def current_run(self) -> str | None:
        """The id of the run given to the innermost `tb.run(...)` around this code, if any."""
        return scope.current_run()

    # -- talking to the server (blocking; the async client runs these in threads) ----------

    def _intent(self, key: str, body: Json, fail_open: bool | None) -> Json | None:
        """Record an intent; the answer, or None when the server is away and we fail open.

        Gives up after the intent budget, pauses and the effect's spooled events included.
        """
        config = self._configured()
        deadline = time.monotonic() + config.intent_budget
        try:
            # This effect's spooled events go first: its receipt must not arrive after a
            # later intent for it, which would be answered as if it had none.
            self._deliver_now(key, deadline)
            response = config.transport.request(
                "POST", "/api/v1/intents", body, budget=deadline - time.monotonic()
            )
        except ServerUnavailable as exc:
            if not (config.fail_open if fail_open is None else fail_open):
                raise IntentNotRecorded(key, exc) from exc
            log.warning("Tallybook is away; %r runs unrecorded (fail_open): %s", key, exc)
            self._record("intents", body)
            return None
        if response.status not in (200, 201, 409):
            raise IntentNotRecorded(key, _rejected(response.status, response.body))
        answer: Json = response.body
        return answer

    def _record(self, endpoint: str, body: Json) -> None:
        """Spool an event (fsynced) for the background sender; returns at once."""
        spool = self._configured().spool
        spool.release(spool.put(endpoint, body))
        self._sender_start()
        self._wake.set()

    def _report(self, failure: Json) -> None:
        self._record("failures", failure)

    def _deliver_now(self, key: str, deadline: float) -> None:
        """Send one effect's spooled events, oldest first, before the deadline."""
        spool = self._configured().spool
        for path in spool.pending_for(key):
            # The sender may be sending it right now: it is done with it in a moment.
            while (entry := spool.claim(path, wait=False)) is None and path in spool.pending():
                if time.monotonic() >= deadline:
                    raise ServerUnavailable(f"{path.name} is still on its way to the server")
                time.sleep(0.005)
            if entry is not None:
                try:
                    self._deliver(entry, budget=deadline - time.monotonic())
                except RequestRejected:
                    continue  # set aside in the spool's rejected folder, and logged

    def _deliver(
        self, entry: Entry, *, retry: Retry | None = None, budget: float | None = None
    ) -> None:
        config = self._configured()
        try:
            response = config.transport.request(
                "POST", f"/api/v1/{entry.endpoint}", entry.body, retry=retry, budget=budget
            )
        except BaseException:
            config.spool.release(entry)
            raise
        if not self._settled(entry, response.status, response.body):
            raise _rejected(response.status, response.body)

    def _settled(self, entry: Entry, status: int, body: Any) -> bool:
        """Act on the server's answer to one entry: done with it (the server has it, or
        settled the effect some other way), set aside as refused (False), or, refused for now
        (429 or 5xx: a batch's item, an event of a 207), left in the spool for the sender's
        next pass, raising ServerUnavailable so that it backs off."""
        spool = self._configured().spool
        if entry.endpoint == "events" and status == 207:
            status = _events_status(body)
        if status == 429 or status >= 500:
            spool.release(entry)
            raise ServerUnavailable(f"Tallybook answered {status} for {entry.path.name}: {body}")
        if status < 300 or (entry.endpoint == "intents" and status == 409):
            spool.done(entry)
            return True
        if entry.endpoint == "failures" and status in (404, 409):
            # The server settled the effect some other way first; it knows better.
            log.warning("Tallybook did not apply the failure of %r: %s", entry.body["key"], body)
            spool.done(entry)
            return True
        spool.reject(entry, json.dumps(body))
        return False

    def _send_pending(self) -> None:
        """One pass of the sender: the spool's events oldest first, each tried once; runs of
        receipts (or of failures) go in batches, in the spool's order."""
        spool = self._configured().spool
        batch: list[Entry] = []
        try:
            for path in spool.pending():
                entry = spool.claim(path, wait=False)
                if entry is None:
                    continue  # another thread or process is sending it
                if batch and (entry.endpoint != batch[0].endpoint or len(batch) == BATCH_ITEMS):
                    sending, batch = batch, []
                    self._deliver_batch(sending)
                if entry.endpoint in BATCHED and not self._no_batches:
                    batch.append(entry)
                    continue
                try:
                    self._deliver(entry, retry=NO_RETRY)
                except RequestRejected:
                    continue  # set aside in the spool's rejected folder, and logged
            if batch:
                sending, batch = batch, []
                self._deliver_batch(sending)
        finally:
            for entry in batch:
                spool.release(entry)

    def _deliver_batch(self, entries: list[Entry]) -> None:
        """Send one endpoint's entries in one request; each leaves the spool once its own
        result says the server has it. A server without the batch route (404), or one that
        refuses the batch whole, gets them one by one."""
        if len(entries) == 1:
            with contextlib.suppress(RequestRejected):
                self._deliver(entries[0], retry=NO_RETRY)
            return
        config = self._configured()
        endpoint = entries[0].endpoint
        try:
            response = config.transport.request(
                "POST",
                f"/api/v1/{endpoint}/batch",
                {endpoint: [entry.body for entry in entries]},
                retry=NO_RETRY,
            )
        except BaseException:
            for entry in entries:
                config.spool.release(entry)
            raise
        results = response.body.get("results") if isinstance(response.body, dict) else None
        if response.status != 207 or not isinstance(results, list) or len(results) != len(entries):
            if response.status == 404:
                self._no_batches = True
            for n, entry in enumerate(entries):
                try:
                    self._deliver(entry, retry=NO_RETRY)
                except RequestRejected:
                    continue
                except BaseException:
                    for rest in entries[n + 1 :]:
                        config.spool.release(rest)
                    raise
            return
        busy: ServerUnavailable | None = None
        for entry, result in zip(entries, results, strict=True):
            try:
                self._settled(entry, result["status"], result["body"])
            except ServerUnavailable as exc:
                busy = exc  # that item stays; the others are settled all the same
        if busy is not None:
            raise busy

    def _sender_start(self) -> None:
        with self._sender_lock:
            if self._closed.is_set():
                return
            if self._sender_thread is None or not self._sender_thread.is_alive():
                self._sender_thread = threading.Thread(
                    target=self._sender, name="tallybook-sender", daemon=True
                )
                self._sender_thread.start()
                _open_clients.add(self)

    def _sender(self) -> None:
        """Deliver what the spool holds, backing off while the server is away."""
        retry = self._configured().transport.retry
        failures = 0
        while not self._closed.is_set():
            self._wake.clear()
            try:
                self._send_pending()
            except ServerUnavailable:
                failures += 1
            except Exception:
                log.exception("Tallybook spool delivery failed")
                failures += 1
            else:
                failures = 0
            self._failing = failures > 0
            with self._sent:
                self._sent.notify_all()
            if failures:
                self._closed.wait(retry.delay(min(failures, 16)))
            else:
                # Entries left now are another sender's; look again in a while.
                self._wake.wait(1.0 if self._configured().spool.pending() else None)

    def _flush(self, timeout: float, *, unless_away: bool = False) -> bool:
        """Wait until the spool is empty, up to `timeout` seconds (or, `unless_away`, until
        the server is found away); whether it is."""
        spool = self._configured().spool
        if not spool.pending():
            return True
        self._sender_start()
        deadline = time.monotonic() + timeout
        with self._sent:
            while spool.pending() and (left := deadline - time.monotonic()) > 0:
                if unless_away and self._failing:
                    break
                self._wake.set()
                self._sent.wait(min(left, 0.05))
        return not spool.pending()

    def _status(self, key: str) -> EffectStatus:
        transport = self._configured().transport
        response = transport.request("GET", f"/api/v1/effects?key={quote(key, safe='')}")
        if response.status != 200:
            raise _rejected(response.status, response.body)
        return EffectStatus.from_json(response.body)

    def _receipt_later(
        self,
        key: str,
        *,
        system: str,
        external_id: str,
        observed_at: Observed,
        data: Any,
        attempt: int | None,
    ) -> Receipt:
        body = receipt_body(
            key,
            system=system,
            external_id=external_id,
            observed_at=observed_at,
            data=data,
            attempt=attempt,
            ids=tracing.current_ids(),
        )
        self._record("receipts", body)
        return Receipt(
            system=system,
            external_id=body["external_id"],
            observed_at=body.get("observed_at"),
            data=data,
            key=key,
            attempt=attempt,
        )

    def _close(self, timeout: float) -> None:
        _open_clients.discard(self)
        if self._config is None:
            return  # never used: nothing to send, nothing to stop
        self._flush(timeout, unless_away=True)
        with self._sender_lock:
            self._closed.set()
            self._wake.set()
            sender = self._sender_thread
        if sender is not None:
            sender.join(timeout=self._config.transport.timeout)
        self._config.transport.close()
        if left := len(self._config.spool.pending()):
            log.warning(
                "%d Tallybook event(s) wait in %s for the next client",
                left,
                self._config.spool.directory,
            )


# Clients whose sender runs: at exit each gets a moment to deliver what it holds.
_open_clients: weakref.WeakSet[Base] = weakref.WeakSet()
EXIT_FLUSH_SECONDS = 2.0


@atexit.register
def _close_open_clients() -> None:
    for client in list(_open_clients):
        client._close(EXIT_FLUSH_SECONDS)


def _new_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _events_status(body: Any) -> int:
    """What a 207 to `POST /api/v1/events` means for the spooled entry: each event has its own
    result; one refused for now (429, 5xx) keeps the entry for another try (the server counts
    an event it has already stored as a duplicate), one refused for good sets it aside."""
    results = body.get("results") if isinstance(body, dict) else None
    statuses: list[int] = [
        r["status"]
        for r in results or ()
        if isinstance(r, dict) and isinstance(r.get("status"), int)
    ]
    if not statuses:
        return 502  # not an answer the sender can read: try again later
    for status in statuses:
        if status == 429 or status >= 500:
            return status
    return next((status for status in statuses if status >= 300), 201)


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
    case = next((c for c in status.cases if c.reason == UNCERTAIN), None) or next(
        iter(status.cases), None
    )
    answer = {
        "decision": status.decision,
        "reason": f"Still waiting after {timeout:g} s: {status.reason}",
        "effect": status.effect,
        "case": asdict(case) if case else None,
    }
    report = EffectInDoubt.answered(key, answer)
    assert isinstance(report, EffectInDoubt)
    return report


def in_doubt(key: str, answer: Json) -> EffectInDoubt:
    report = EffectInDoubt.answered(key, answer)
    assert isinstance(report, EffectInDoubt)
    return report


class ToolDecorator(Protocol):
    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]: ...


class Effect(Block):
    """`with tb.effect(...) as fx`: the intent is recorded on entry, the outcome on exit."""

    _tb: Tallybook

    def __enter__(self) -> Self:
        body = self._begin()
        fail_open = self._options.get("fail_open")
        try:
            answer = self._tb._intent(self.key, body, fail_open)
            while (step := self._before_giving_up(answer)) is not None:
                assert answer is not None
                if step == "probe":
                    found = self._options["on_in_doubt"](in_doubt(self.key, answer))
                    if (receipt := self._probe_body(answer, found)) is None:
                        continue
                    self._tb._record("receipts", receipt)
                else:
                    # Settled (or decided) in time: ask again, and the answer says how.
                    self._tb.wait_for(self.key, timeout=step)
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
                self._tb._report(failure)
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
        self._tb._record("failures", self._failure_once(error, definitive))

    def _record_receipt(self, **fields: Any) -> Receipt:
        body, receipt = self._receipt_once(**fields)
        if body is not None:
            self._tb._record("receipts", body)
        return receipt


class Tallybook(Base):
    """The Tallybook client. Thread-safe; one per process is plenty.

    `url` and `api_key` default to $TALLYBOOK_URL and $TALLYBOOK_API_KEY; `spool` to
    $TALLYBOOK_SPOOL_DIR, else the user's cache folder; all are read at first use. An
    intent is given `intent_budget` seconds, retries included, before IntentNotRecorded;
    with `fail_open=True` the effect runs anyway (and its intent is spooled).
    """

    def effect(self, key: str, **options: Unpack[EffectOptions]) -> Effect:
        """Make one external effect durable: `with tb.effect("refund:42", ...) as fx:`."""
        return Effect(self, key, options)

    def tool(
        self,
        key: str | Callable[..., str],
        *,
        request: Callable[..., Any] | None = None,
        receipt: ReceiptFrom = None,
        **options: Unpack[ToolOptions],
    ) -> ToolDecorator:
        """Decorate a tool function that performs an effect; the call returns its result.

        The key is a template of the arguments ("refund:{order_id}", which may also name
        {run_id} and {tool_call_id}) or a function of them; the request is the arguments,
        or what `request` makes of them. The receipt is the result itself (a `Receipt`),
        the result's field `receipt` names, or what the function `receipt` makes of it.
        An effect already done is not repeated: the call returns the result it had then.
        """
        check_options(options, ToolOptions, required=("kind", "target"))

        def decorate(fn: Callable[P, T]) -> Callable[P, T]:
            call = ToolCall(fn, key, system=options["target"], request=request, receipt=receipt)

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                effect_key, body = call.bind(args, kwargs)
                with self.effect(effect_key, request=body, **options) as fx:
                    if fx.completed:
                        replayed: T = call.replay(fx._done_before())
                        return replayed
                    result = fn(*args, **kwargs)
                    fields, problem = call.evidence(result)
                    recorded = fx.receipt(**fields)
                    if problem is not None:
                        raise problem
                    answer: T = call.answer(result, recorded)
                    return answer

            return wrapper

        return decorate

    def receipt(
        self,
        key: str,
        *,
        system: str,
        external_id: str,
        observed_at: Observed = None,
        data: Any = None,
        attempt: int | None = None,
    ) -> Receipt:
        """Record a receipt outside an effect block: one that arrives later (a webhook).

        Spooled and sent in the background, like every receipt; a second receipt with
        another external id for a succeeded effect is recorded as a duplicate effect.
        """
        return self._receipt_later(
            key,
            system=system,
            external_id=external_id,
            observed_at=observed_at,
            data=data,
            attempt=attempt,
        )

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

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every spooled receipt and failure is delivered; whether they are."""
        return self._flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what the spool holds (unless the server is away), then stop sending.

        What is left waits in the spool for the next client.
        """
        self._close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
