"""`tallybook-mcp`: a proxy in front of any MCP server that makes its declared tools durable.

    tallybook-mcp --effects tallybook.json -- npx -y @stripe/mcp --tools=all     # a command
    tallybook-mcp --effects tallybook.json --url https://mcp.example.com/mcp      # a URL

The agent connects to the proxy over stdio (or streamable HTTP with `--http PORT`) as it would
to the server. `tools/list` and everything else the server offers (resources, prompts,
completions) pass through. A `tools/call` of a tool the declarations file names as an effect
records the intent first and the receipt from the result after; a decision other than
`proceed` is answered as the tool's error result (`isError`, so the model reads the reason
and the case's URL), never as a protocol error; `completed` answers the result stored with
the receipt, without calling the tool. The call's trace context (`traceparent` in the
request's `_meta`, which MCP clients instrumented with OpenTelemetry send) goes with the
intent, so the effect links to the client's tool span.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shlex
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from opentelemetry import context as otel_context
from opentelemetry.propagate import extract

from tallybook.aio import AsyncTallybook
from tallybook.errors import EffectInterrupted
from tallybook.integrations._declarations import (
    Call,
    DeclarationError,
    Declarations,
    client_options,
    load,
)
from tallybook.integrations._tool_calls import run_event
from tallybook.records import Receipt

__all__ = ["Proxy", "main"]

log = logging.getLogger("tallybook.mcp")
WORKFLOW = "mcp"
# `_meta` keys the proxy does not forward: the session to the server sets its own.
RESERVED_META = ("io.modelcontextprotocol/", "progressToken")


class Proxy:
    """The MCP server the agent talks to, in front of `upstream`, a connected `mcp.Client`."""

    def __init__(
        self,
        upstream: Client,
        declarations: Declarations,
        tb: AsyncTallybook,
        *,
        run_id: str | None = None,
        workflow: str = WORKFLOW,
    ) -> None:
        self.upstream, self.declarations, self.tb = upstream, declarations, tb
        self.run_id, self.workflow = run_id, workflow

    def server(self) -> Server[Any]:
        """A server offering what the upstream server offers, tools made durable."""
        offers = self.upstream.server_capabilities
        handlers: dict[str, Any] = {
            "on_list_tools": self.list_tools,
            "on_call_tool": self.call_tool,
        }
        if offers.resources is not None:
            handlers.update(
                on_list_resources=self.list_resources,
                on_list_resource_templates=self.list_resource_templates,
                on_read_resource=self.read_resource,
            )
        if offers.prompts is not None:
            handlers.update(on_list_prompts=self.list_prompts, on_get_prompt=self.get_prompt)
        if offers.completions is not None:
            handlers.update(on_completion=self.complete)
        info = self.upstream.server_info
        return Server(
            info.name if info else "tallybook-mcp",
            version=info.version if info else "",
            instructions=self.upstream.instructions,
            **handlers,
        )

    # -- passed through ---------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return await self.upstream.session.list_tools(params=_paging(params))

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return await self.upstream.session.list_resources(params=_paging(params))

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return await self.upstream.session.list_resource_templates(params=_paging(params))

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await self.upstream.session.read_resource(params.uri, meta=_forwarded(params.meta))

    async def list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return await self.upstream.session.list_prompts(params=_paging(params))

    async def get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        return await self.upstream.session.get_prompt(
            params.name, params.arguments, meta=_forwarded(params.meta)
        )

    async def complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        context = params.context.arguments if params.context else None
        argument = {"name": params.argument.name, "value": params.argument.value}
        return await self.upstream.session.complete(params.ref, argument, context)

    # -- the durable part ---------------------------------------------------------------------

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        meta = _forwarded(params.meta)
        session = _session_id(ctx)
        call = self.declarations.call(params.name, arguments, self.run_id)
        if call is None:
            return await self.upstream.call_tool(params.name, arguments, meta=meta)
        # The pair that names this call in the client's MCP spans (mcp.session.id and
        # jsonrpc.request.id), when there is a session: the server's ingest derives the
        # same id for them. A retry comes with another request id: it is not the key.
        call_id = f"mcp:{session}:{ctx.request_id}" if session else None
        try:
            key = call.key
        except DeclarationError as exc:
            return _tool_error(f"Not performed: {exc}")
        with _trace_of(params.meta), self.tb.run(self.workflow, run_id=call.run_id):
            try:
                async with self.tb.effect(key, **call.options(call_id)) as fx:
                    if fx.completed:
                        return _done_before(fx.receipt.stored)
                    result = await self.upstream.call_tool(params.name, arguments, meta=meta)
                    await _record(fx, call, result, key)
                    return result
            except EffectInterrupted as report:
                return _tool_error(str(report))


async def _record(fx: Any, call: Call, result: types.CallToolResult, key: str) -> None:
    """The receipt of the tool's result (kept with it), or its failure."""
    text = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
    if result.is_error:
        definitive = call.declaration.definitive_failure
        await fx.fail(text or "the tool answered an error", definitive=definitive)
        return
    stored = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    receipt = call.receipt(text, result.structured_content, call=key)
    await fx.receipt(**receipt, data={"result": stored})


def _done_before(receipt: Receipt | None) -> types.CallToolResult:
    """The result of a call done before, as stored with its receipt; else what is on record."""
    data = receipt.data if receipt is not None else None
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        return types.CallToolResult.model_validate(data["result"])
    said = f"{receipt.system}:{receipt.external_id}" if receipt is not None else "a receipt"
    text = f"Already done before ({said} is on record); not repeated."
    return types.CallToolResult(content=[types.TextContent(text=text)])


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _paging(params: types.PaginatedRequestParams | None) -> types.PaginatedRequestParams | None:
    if params is None or params.cursor is None:
        return None
    return types.PaginatedRequestParams(cursor=params.cursor)


def _forwarded(meta: Mapping[str, Any] | None) -> Any:
    """The request's `_meta` for the server: the trace context and the client's own keys."""
    kept = {k: v for k, v in (meta or {}).items() if not k.startswith(RESERVED_META)}
    return kept or None


@contextmanager
def _trace_of(meta: Mapping[str, Any] | None) -> Iterator[None]:
    """The client's span (W3C `traceparent` in `_meta`) made current: the intent carries it."""
    if not meta or "traceparent" not in meta:
        yield
        return
    token = otel_context.attach(extract(dict(meta)))
    try:
        yield
    finally:
        otel_context.detach(token)


def _session_id(ctx: ServerRequestContext[Any]) -> str | None:
    """The client's MCP session id (streamable HTTP); None on stdio."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    return headers.get("mcp-session-id") if headers is not None else None


def default_run(upstream: str) -> str:
    """A run that outlives the proxy: this folder and this server, so that an agent restarted
    in its folder asks for the same keys."""
    digest = hashlib.sha256(f"{Path.cwd()}\0{upstream}".encode()).hexdigest()[:16]
    return f"mcp-{digest}"


async def serve(
    args: argparse.Namespace, declarations: Declarations, options: dict[str, Any]
) -> None:
    target: str | StdioServerParameters
    if args.url:
        target, named = args.url, args.url
    else:
        target = StdioServerParameters(command=args.command[0], args=args.command[1:])
        named = shlex.join(args.command)
    tb = AsyncTallybook(**options)
    # The run outlives a session: a client restarted after a crash opens a new MCP session
    # (over streamable HTTP) and must ask for the same keys.
    run_id = args.run or declarations.run or default_run(named)
    async with Client(target, cache=None, mode="legacy") as upstream:
        proxy = Proxy(upstream, declarations, tb, run_id=run_id, workflow=args.workflow)
        server = proxy.server()
        # The run goes on while an agent is connected, and ends when the last one hangs up.
        run_event(tb, run_id, status="running", workflow=args.workflow)
        if args.http:
            import uvicorn

            app = Sessions(server.streamable_http_app(host=args.host), tb, run_id, args.workflow)
            config = uvicorn.Config(app, host=args.host, port=args.http, log_level="warning")
            await uvicorn.Server(config).serve()
            ended = app.ended
        else:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            ended = False
        if not ended:
            run_event(tb, run_id, status="ok", workflow=args.workflow)
        # An agent gives its server a moment to exit once it hangs up (the mcp package:
        # two seconds); what is not sent by then waits in the spool for the next proxy.
        await tb.flush(timeout=1.0)
    await tb.aclose(timeout=1.0)


class Sessions:
    """The streamable HTTP app, watching its MCP sessions: the run is `running` while one is
    open and `ok` once the last closes (its client's DELETE). A session that only idles out
    ends with the proxy."""

    def __init__(self, app: Any, tb: AsyncTallybook, run_id: str, workflow: str) -> None:
        self.app, self.tb, self.run_id, self.workflow = app, tb, run_id, workflow
        self.open: set[str] = set()
        self.ended = False  # the run reads "ok": no session since the last closed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = _header(scope.get("headers", ()), b"mcp-session-id")
        closing = scope.get("method") == "DELETE" and asked is not None

        async def watched(message: Any) -> None:
            if message["type"] == "http.response.start":
                status = message.get("status", 500)
                given = _header(message.get("headers", ()), b"mcp-session-id")
                if asked is None and given and status < 400:
                    self.opened(given)
                elif closing and asked and status < 400:
                    self.closed(asked)
            await send(message)

        await self.app(scope, receive, watched)

    def opened(self, session: str) -> None:
        if not self.open and self.ended:
            run_event(self.tb, self.run_id, status="running", workflow=self.workflow)
            self.ended = False
        self.open.add(session)

    def closed(self, session: str) -> None:
        self.open.discard(session)
        if not self.open and not self.ended:
            run_event(self.tb, self.run_id, status="ok", workflow=self.workflow)
            self.ended = True


def _header(headers: Any, name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tallybook-mcp",
        description="An MCP proxy that records the declared tools' calls in Tallybook.",
    )
    p.add_argument("--effects", required=True, help="the declarations file (JSON)")
    p.add_argument("--url", help="the MCP server's streamable HTTP URL (else the command)")
    p.add_argument("--run", default=os.environ.get("TALLYBOOK_RUN_ID"), help="the run id")
    p.add_argument("--workflow", default=WORKFLOW, help="the workflow the run is filed under")
    p.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT")
    p.add_argument("--host", default="127.0.0.1", help="with --http, the address to bind")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if bool(args.url) == bool(args.command):
        parser().error("give the server's command after --, or --url, not both")
    try:
        declarations = load(args.effects)
        options = client_options()
    except DeclarationError as exc:
        print(f"tallybook-mcp: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    anyio.run(serve, args, declarations, options)
    return 0


if __name__ == "__main__":
    from tallybook.integrations._mcp_command import exit_served

    exit_served(main())
