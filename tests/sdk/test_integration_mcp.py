"""`tallybook-mcp` between the `mcp` package's own client and a real MCP server (stdio and
streamable HTTP): a declared tool's call is an effect with its receipt, linked to the
client's tool span, and answered from the ledger the second time; a proxy killed between the
server's answer and the receipt leaves an uncertain case, and the restarted proxy does not
call the tool again; a denied call reaches the client as the tool's error."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import TextContent, TextResourceContents
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from durability.models import Case, Effect, Receipt, State
from tests.authority.support import grant
from tests.ports import free_port
from tests.sdk.support import ROOT, wait_until
from tests.trajectories.support import queue, work
from trajectories.models import Run, Span

__all__ = ["queue"]

KEY = "refund:7"


class Ledger:
    """The fake provider's ledger: one JSON line per refund it performed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def refunds(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "fakepay.jsonl")


def effects_file(tmp_path: Path, **declared: Any) -> Path:
    path = tmp_path / "tallybook.json"
    refund = {
        "tool": "refund",
        "kind": "payment",
        "target": "fakepay",
        "key": "refund:{order}",
        "receipt": {"field": "id"},
        **declared,
    }
    path.write_text(json.dumps({"effects": [refund]}))
    return path


@pytest.fixture
def upstream_http(ledger: Ledger) -> Iterator[str]:
    """The provider's MCP server on streamable HTTP, in a process of its own."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sdk.mcp_support", "--ledger", str(ledger.path), "--http"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    port = int(process.stdout.readline())
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(15)


def proxy(live_server: Any, api_key: str, spool: Path, effects: Path, *upstream: str) -> Any:
    """The proxy as an agent starts it: a stdio MCP server command."""
    env = {
        **os.environ,
        "TALLYBOOK_URL": live_server.url,
        "TALLYBOOK_API_KEY": api_key,
        # A loaded machine's slow answer is no reason to refuse a test's effect.
        "TALLYBOOK_INTENT_BUDGET": "30",
        "TALLYBOOK_SPOOL_DIR": str(spool),
    }
    command = ["-m", "tallybook.integrations.mcp", "--effects", str(effects), "--run", "ticket-7"]
    return StdioServerParameters(
        command=sys.executable, args=[*command, *upstream], env=env, cwd=ROOT
    )


def stdio_upstream(ledger: Ledger, *extra: str) -> list[str]:
    server = [sys.executable, "-m", "tests.sdk.mcp_support", "--ledger", str(ledger.path)]
    return ["--", *server, *extra]


def call(server: Any, tool: str, arguments: dict[str, Any], **options: Any) -> Any:
    async def go() -> Any:
        async with Client(server, mode="legacy") as client:
            tools = await client.list_tools()
            assert {t.name for t in tools.tools} == {"refund", "lookup"}
            return await client.call_tool(tool, arguments, **options)

    return anyio.run(go)


def test_a_declared_tool_call_is_an_effect_with_its_receipt_linked_to_the_clients_span(
    live_server, api_key, spool_root, tmp_path, ledger, upstream_http, api, queue, monkeypatch
):
    import mcp.shared._otel

    # The agent's tracing: its tool span, and the mcp client's own span inside it, which
    # sends the trace context in the request's _meta.
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"{live_server.url}/v1/traces",
                headers={"Authorization": f"Bearer {api_key}"},
            )
        )
    )
    monkeypatch.setattr(mcp.shared._otel, "_tracer", provider.get_tracer("mcp-python-sdk"))
    tracer = provider.get_tracer("agent")
    server = proxy(live_server, api_key, spool_root, effects_file(tmp_path), "--url", upstream_http)

    with tracer.start_as_current_span(
        "execute_tool refund",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "refund",
            "gen_ai.tool.call.id": "call_7",
        },
    ) as tool_span:
        result = call(server, "refund", {"order": 7})
    provider.shutdown()

    assert not result.is_error
    assert result.structured_content == {"id": "re_7_1", "status": "succeeded"}
    assert [r["order"] for r in ledger.refunds()] == [7]
    wait_until(lambda: Receipt.objects.filter(effect__key=KEY).exists(), what="the receipt")
    effect = Effect.objects.get(key=KEY)
    assert (effect.state, effect.kind, effect.target, effect.run_id) == (
        State.SUCCEEDED,
        "payment",
        "fakepay",
        "ticket-7",
    )
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.system, receipt.external_id) == ("fakepay", "re_7_1")

    def linked() -> Any:
        work(queue)
        body = api.get("effects", key=KEY).json()
        return body if body.get("tool_span_id") else None

    wait_until(linked, what="the effect's link to the client's tool span")
    tool = Span.objects.get(span_id=linked()["tool_span_id"])
    assert tool.span_id == format(tool_span.get_span_context().span_id, "016x")
    assert (tool.kind, tool.tool_call_id) == ("tool", "call_7")

    # Asked again (another session, another request id): answered from the ledger.
    again = call(server, "refund", {"order": 7})
    assert again.structured_content == {"id": "re_7_1", "status": "succeeded"}
    assert len(ledger.refunds()) == 1, "the refund was repeated"
    # An undeclared tool passes through, recording nothing.
    looked = call(server, "lookup", {"order": 7})
    assert looked.content[0].text == "order 7: 12.50 EUR, paid"
    assert Effect.objects.count() == 1
    # Each session the proxy serves ends its run (the next one resumes it).
    wait_until(
        lambda: Run.objects.filter(run_id="ticket-7", workflow="mcp").exclude(ended=None).exists(),
        what="the run to end",
    )


def test_a_proxy_killed_between_the_answer_and_the_receipt_leaves_a_case_and_no_repeat(
    live_server, api_key, spool_root, tmp_path, ledger
):
    hold = tmp_path / "hold"
    hold.touch()
    effects = effects_file(tmp_path, key=None)
    upstream = stdio_upstream(ledger, "--hold", str(hold))
    server = proxy(live_server, api_key, spool_root, effects, *upstream)

    async def killed() -> None:
        async with Client(server, mode="legacy") as client, anyio.create_task_group() as tg:

            async def refund() -> None:
                # The proxy dies under the call: the client sees its connection end.
                with pytest.raises(Exception):  # noqa: B017 (the transport's own error)
                    await client.call_tool("refund", {"order": 7})

            tg.start_soon(refund)
            with anyio.fail_after(30):
                while not ledger.refunds():
                    await anyio.sleep(0.02)
            (done,) = ledger.refunds()
            os.kill(done["proxy"], signal.SIGKILL)  # the server has done it, not answered
            hold.unlink()

    # The session to a killed server ends however its transport ends it.
    with contextlib.suppress(Exception):
        anyio.run(killed)
    (done,) = ledger.refunds()
    wait_until(lambda: not _alive(done["me"]), what="the orphaned server to exit")

    result = call(server, "refund", {"order": 7})

    assert result.is_error
    text = result.content[0].text
    assert "uncertain" in text and "/cases/" in text, text
    assert len(ledger.refunds()) == 1, "the refund was repeated"
    effect = Effect.objects.get()
    assert effect.state == State.TIMED_OUT
    assert effect.key.startswith("refund:ticket-7:")
    assert Case.objects.filter(effect=effect, reason="uncertain", closed=None).exists()


def test_a_denied_call_reaches_the_client_as_the_tools_error(
    live_server, api_key, spool_root, tmp_path, ledger, project
):
    refunds = grant(project, name="emails only", kinds=["email"])
    effects = effects_file(tmp_path, authority={"grant": refunds.pk})
    server = proxy(live_server, api_key, spool_root, effects, *stdio_upstream(ledger))

    result = call(server, "refund", {"order": 7})

    assert result.is_error
    text = result.content[0].text
    assert "denied" in text and KEY in text, text
    assert ledger.refunds() == []
    assert Effect.objects.get(key=KEY).state == State.DENIED


def test_the_proxy_serves_streamable_http_and_a_new_session_asks_for_the_same_key(
    live_server, api_key, spool_root, tmp_path, ledger
):
    server = proxy(live_server, api_key, spool_root, effects_file(tmp_path, key=None))
    port = free_port()
    arguments = [a for a in server.args if a not in ("--run", "ticket-7")]
    upstream = stdio_upstream(ledger)
    process = subprocess.Popen(
        [server.command, *arguments, "--http", str(port), *upstream], cwd=ROOT, env=server.env
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"

        def answers() -> bool:
            with contextlib.suppress(Exception):
                call(url, "lookup", {"order": 7})
                return True
            return False

        wait_until(answers, 60, "the proxy to serve streamable HTTP")
        result = call(url, "refund", {"order": 7})
        # The client restarted after a crash: a new MCP session, the same call.
        again = call(url, "refund", {"order": 7})
        offered = anyio.run(offers, url)
        effect = Effect.objects.get()
        # The last session closed: the run is ended while the proxy still serves.
        wait_until(
            lambda: (
                Run.objects.filter(run_id=effect.run_id, status="ok").exclude(ended=None).exists()
            ),
            what="the run to end with its sessions",
        )
    finally:
        process.terminate()
        process.wait(15)

    assert result.structured_content == {"id": "re_7_1", "status": "succeeded"}
    assert again.structured_content == result.structured_content
    assert len(ledger.refunds()) == 1, "the new session refunded again"
    # What else the server offers passes through.
    assert offered == ("1200.00 EUR", "Answer the dispute on order 7.")
    # No run named: the proxy's own (its folder and server), which outlives a session; the
    # client's MCP session and its request name the call.
    prefix, session, request_id = effect.tool_call_id.split(":")
    assert prefix == "mcp" and request_id.isdigit() and session
    assert effect.run_id.startswith("mcp-") and effect.key.startswith(f"refund:{effect.run_id}:")
    wait_until(lambda: Receipt.objects.filter(effect=effect).exists(), what="the receipt")


async def offers(url: str) -> tuple[str, str]:
    """The server's resource and prompt, through the proxy."""
    async with Client(url, mode="legacy") as client:
        (resource,) = (await client.list_resources()).resources
        read = await client.read_resource(str(resource.uri))
        (prompt,) = (await client.list_prompts()).prompts
        got = await client.get_prompt(prompt.name, {"order": "7"})
        (text,), (message,) = read.contents, got.messages
        assert isinstance(text, TextResourceContents) and isinstance(message.content, TextContent)
        return text.text, message.content.text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
