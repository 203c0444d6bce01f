"""An MCP server offering a workspace's tools (``agentvfs mcp``), on the official ``mcp`` SDK.

The SDK is imported here only, so ``import agentvfs`` works without it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from ..errors import MissingExtraError
from ._core import ToolFailure, ToolMedia, WorkspaceTool
from ._host import ToolHost
from ._names import WORKSPACE_TOOLS
from ._schema import validate_input

if TYPE_CHECKING:
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.session import ServerSession


__all__ = ["NOT_APPROVED", "Approver", "create_server", "serve_stdio"]

logger = logging.getLogger("agentvfs")

#: The tool error when the user declines (or dismisses) the approval request.
NOT_APPROVED = "Tool call was not approved by the user"
#: The tool error when approval is needed but the client cannot ask the user.
NO_ELICITATION = (
    "Tool {name} requires approval, but this MCP client does not support elicitation, so the "
    "user cannot be asked; the tool was not run"
)
_DESTRUCTIVE = frozenset({WORKSPACE_TOOLS.FILESYSTEM.WRITE_FILE, WORKSPACE_TOOLS.FILESYSTEM.EDIT_FILE, WORKSPACE_TOOLS.FILESYSTEM.DELETE})


def _package_version() -> str:
    try:
        return version("agentvfs")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def _content(result: Any, args: Mapping[str, Any], tool: WorkspaceTool) -> list[types.ContentBlock]:
    from mcp import types

    if isinstance(result, ToolMedia):
        blocks: list[types.ContentBlock] = [types.TextContent(type="text", text=result.text)]
        if result.media_type.startswith("image/"):
            blocks.append(types.ImageContent(type="image", data=result.data, mimeType=result.media_type))
        elif result.media_type.startswith("audio/"):
            blocks.append(types.AudioContent(type="audio", data=result.data, mimeType=result.media_type))
        else:
            path = str(args.get("path") or "media").lstrip("/")
            resource = types.BlobResourceContents(
                uri=f"agentvfs://workspace/{quote(path)}",  # type: ignore[arg-type]  # pydantic coerces
                mimeType=result.media_type,
                blob=result.data,
            )
            blocks.append(types.EmbeddedResource(type="resource", resource=resource))
        return blocks
    # What the model sees: a hook's non-text answer as JSON, command output without ANSI escapes.
    return [types.TextContent(type="text", text=part["text"]) for part in tool.to_model_output(result)]


def _annotations(tool: WorkspaceTool) -> types.ToolAnnotations:
    from mcp import types

    if tool.spec.needs == "sandbox":
        # Shell commands and kills may change anything: no hint, so clients assume the worst.
        if tool.workspace_tool_name == WORKSPACE_TOOLS.SANDBOX.GET_PROCESS_OUTPUT:
            return types.ToolAnnotations(readOnlyHint=True)
        return types.ToolAnnotations(readOnlyHint=False)
    return types.ToolAnnotations(
        readOnlyHint=not tool.spec.writes,
        destructiveHint=tool.workspace_tool_name in _DESTRUCTIVE if tool.spec.writes else None,
    )


def _error(message: str) -> types.CallToolResult:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], isError=True)


def _message(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


async def _approved(session: ServerSession, request_id: Any, tool: WorkspaceTool, args: Mapping[str, Any]) -> str | None:
    """Ask the user through the client; return None when approved, else the tool error."""
    client = session.client_params
    elicitation = client.capabilities.elicitation if client is not None else None
    # An empty elicitation capability means form mode (the spec before modes existed).
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return NO_ELICITATION.format(name=tool.name)
    message = f"Allow the tool {tool.name} to run with these arguments?\n{json.dumps(dict(args), indent=2, ensure_ascii=False)}"
    answer = await session.elicit_form(message, {"type": "object", "properties": {}}, related_request_id=request_id)
    return None if answer.action == "accept" else NOT_APPROVED


def _require_mcp() -> None:
    """Raise :class:`~agentvfs.errors.MissingExtraError` where the ``mcp`` extra is missing."""
    try:
        import mcp  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "mcp":
            raise
        raise MissingExtraError("The MCP server (agentvfs mcp)", "mcp", "mcp") from None


#: How a server gets a call approved: None when the user approved, else the tool error to
#: return. The default asks the client with a form elicitation.
Approver = Callable[[WorkspaceTool, Mapping[str, Any]], Awaitable[str | None]]


def _mcp_major() -> int:
    """The major version of the installed ``mcp`` SDK (1 or 2).

    mcp 2 replaced the ``JSONRPCMessage`` root model with a type adapter in the same release
    that moved request handlers into ``Server``'s constructor, so that name tells them apart.
    """
    import mcp.types

    return 2 if hasattr(mcp.types, "jsonrpc_message_adapter") else 1


def _build_server(
    name: str,
    instructions: str,
    listing: list[types.Tool],
    call: Callable[[str, dict[str, Any], Approver], Awaitable[types.CallToolResult]],
) -> Server[Any, Any]:
    """A low-level ``Server`` answering ``tools/list`` with ``listing`` and ``tools/call``
    through ``call``, on either major of the SDK.

    ``call`` gets the tool's name, its arguments and the way to ask the client for approval
    of this request (its session and request id differ between the majors).
    """
    from mcp import types
    from mcp.server.lowlevel import Server

    # Only one major is installed at a time, so the other one's calls are erased to Any for
    # the type checker.
    server_class: Any = Server
    if _mcp_major() >= 2:

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=listing)

        async def on_call_tool(ctx: Any, params: Any) -> types.CallToolResult:
            async def ask(tool: WorkspaceTool, args: Mapping[str, Any]) -> str | None:
                return await _approved(ctx.session, ctx.request_id, tool, args)

            return await call(params.name, dict(params.arguments or {}), ask)

        built: Server[Any, Any] = server_class(
            name,
            version=_package_version(),
            instructions=instructions,
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
        )
        return built

    server: Server[Any, Any] = server_class(
        name, version=_package_version(), instructions=instructions
    )

    async def ask_client(tool: WorkspaceTool, args: Mapping[str, Any]) -> str | None:
        context = server.request_context
        return await _approved(context.session, context.request_id, tool, args)

    async def list_tools(request: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(types.ListToolsResult(tools=listing))

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        args = request.params.arguments or {}
        return types.ServerResult(await call(request.params.name, args, ask_client))

    server.request_handlers[types.ListToolsRequest] = list_tools
    server.request_handlers[types.CallToolRequest] = call_tool
    return server


def create_server(
    tools: Mapping[str, WorkspaceTool], *, name: str = "agentvfs", approve: Approver | None = None
) -> Server[Any, Any]:
    """An MCP server (low-level SDK ``Server``, mcp 1.x or 2.x) offering ``tools``.

    ``tools/list`` gives each tool's name, description and input schema. ``tools/call`` runs the
    tool: text results come back as text content, media as text plus image (or audio, or an
    embedded resource such as a PDF). Any exception from the tool (missing file, invalid input,
    read-only workspace...) becomes a tool error (``isError``) with its message, and the server
    goes on serving. A tool that needs approval asks the user with a form elicitation first;
    declined, cancelled, or a client without elicitation: the tool does not run.

    ``approve``, when given, replaces the elicitation: it is awaited with the tool and its
    arguments and returns None to run the call, or the tool error to answer instead (for hosts
    that ask the user their own way, such as the Claude Agent SDK's ``can_use_tool``).
    """
    _require_mcp()
    from mcp import types

    listing = [
        types.Tool(
            name=tool.name,
            description=tool.description,
            inputSchema=tool.input_schema,
            annotations=_annotations(tool),
        )
        for tool in tools.values()
    ]

    async def call(
        tool_name: str, args: dict[str, Any], ask_client: Approver
    ) -> types.CallToolResult:
        tool = tools.get(tool_name)
        if tool is None:
            return _error(f"Unknown tool: {tool_name}")
        try:
            if tool.require_approval:
                # Bad input is reported before the user is asked to approve anything (execute
                # validates again; a tool that never asks relies on that one check).
                validate_input(tool.name, tool.input_schema, args)
            if await tool.needs_approval(args):
                refusal = await (approve or ask_client)(tool, args)
                if refusal is not None:
                    return _error(refusal)
            result = await tool.execute(args)
        except Exception as exc:
            logger.debug("MCP tool %s failed", tool_name, exc_info=True)
            return _error(_message(exc))
        return types.CallToolResult(content=_content(result, args, tool), isError=isinstance(result, ToolFailure))

    return _build_server(
        name,
        "Tools to read, write, edit, list, search and delete the files of an agentvfs workspace.",
        listing,
        call,
    )


class ServedWorkspace(ToolHost, Protocol):
    """A workspace the server initialises on start and destroys at the end."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> Any: ...


async def serve_stdio(workspace: ServedWorkspace) -> None:
    """Initialise ``workspace``, serve its tools over stdin/stdout until the client closes
    stdin, then destroy the workspace. A workspace that does not start is served as by
    :func:`serve_stdio_failure`."""
    import anyio

    _require_mcp()
    # The protocol owns stdout: anything else printed in this process goes to stderr.
    protocol_out = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(workspace)
                # One request now: storage that cannot be used (credentials the client's
                # environment did not pass on, an endpoint down) is said at once.
                if workspace.filesystem is not None:
                    await workspace.filesystem.probe()
                server = create_server(await workspace.create_tools())
            except Exception as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                print(f"agentvfs mcp: the workspace did not start: {reason}", file=sys.stderr, flush=True)
                logger.debug("the workspace did not start", exc_info=True)
                server = _failed_server(f"the workspace did not start: {reason}")
            await _serve(server, protocol_out)
    finally:
        sys.stdout = saved


async def serve_stdio_failure(reason: str) -> None:
    """Serve, over stdin/stdout, an MCP server for a workspace that could not be made: it says
    ``reason`` in its instructions and as the error of every tool call, and lists no tools, so
    the client shows the cause rather than a closed connection."""
    import anyio

    _require_mcp()
    protocol_out = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        await _serve(_failed_server(reason), protocol_out)
    finally:
        sys.stdout = saved


class _StdinLines:
    """The lines of a file descriptor (stdin), read by a daemon thread and handed to the
    event loop.

    The SDK's default reads stdin in a worker thread that a cancellation must wait for: a
    server told to stop (SIGINT, SIGTERM) while its client keeps stdin open would wait for
    a line that never comes. A daemon thread blocked in ``read`` holds nothing up: the
    server stops at once, and the thread ends with the process. It reads the descriptor
    itself, not ``sys.stdin``: a daemon thread holding a buffered file's lock when the
    interpreter shuts down aborts the process.
    """

    def __init__(self, fd: int) -> None:
        import threading

        import anyio
        import anyio.lowlevel

        self._fd = fd
        self._send, self._receive = anyio.create_memory_object_stream[str | None](1)
        self._token = anyio.lowlevel.current_token()
        threading.Thread(target=self._read, name="agentvfs-mcp-stdin", daemon=True).start()

    def _read(self) -> None:
        import anyio.from_thread

        def hand(line: str | None) -> None:
            anyio.from_thread.run(self._send.send, line, token=self._token)

        pending = b""
        try:
            while chunk := os.read(self._fd, 1 << 16):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    hand(line.decode("utf-8", "replace") + "\n")
            if pending:
                hand(pending.decode("utf-8", "replace"))
            hand(None)
        except Exception:  # the loop ended, the server closed its end, or stdin failed
            return

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._receive.receive()
        if line is None:
            raise StopAsyncIteration
        return line


async def _serve(server: Any, protocol_out: Any) -> None:
    """Run ``server`` on stdin and ``protocol_out`` until the client closes stdin."""
    import anyio
    from mcp.server.stdio import stdio_server

    lines: Any = _StdinLines(sys.stdin.fileno())
    async with (
        stdio_server(stdin=lines, stdout=protocol_out) as (read_stream, write_stream),
        anyio.create_task_group() as tg,
    ):
        known = await _answer_unknown_methods(tg, read_stream, write_stream)
        await server.run(known, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()


def _failed_server(reason: str) -> Any:
    """A server for a workspace that could not be used: it says why in its instructions, lists
    no tools, and answers every call with the reason as a tool error (the client sees the
    cause, not a closed connection)."""
    message = f"agentvfs: {reason}"

    async def call(tool_name: str, args: dict[str, Any], ask_client: Approver) -> Any:
        return _error(message)

    return _build_server("agentvfs", message, [], call)


async def _answer_unknown_methods(tg: Any, read_stream: Any, write_stream: Any) -> Any:
    """The requests this SDK knows, from ``read_stream``; a request of a method it does not
    know is answered "method not found" here.

    Clients on a newer protocol probe first with methods of their own (``server/discover`` of
    mcp 2.x) and fall back to ``initialize`` on that answer; the SDK would log a page of
    validation errors for each before answering the same.
    """
    import typing

    import anyio
    from mcp import types
    from mcp.shared.message import SessionMessage

    known = set()
    for model in typing.get_args(types.ClientRequest.model_fields["root"].annotation):
        known |= set(typing.get_args(model.model_fields["method"].annotation))
    send, receive = anyio.create_memory_object_stream[Any](0)

    async def pump() -> None:
        async with send:
            async for message in read_stream:
                request = getattr(getattr(message, "message", None), "root", None)
                if isinstance(request, types.JSONRPCRequest) and request.method not in known:
                    logger.debug("answered an unknown method: %s", request.method)
                    error = types.ErrorData(code=types.METHOD_NOT_FOUND, message=f"Method not found: {request.method}")
                    answer = types.JSONRPCError(jsonrpc="2.0", id=request.id, error=error)
                    await write_stream.send(SessionMessage(types.JSONRPCMessage(answer)))
                    continue
                await send.send(message)

    tg.start_soon(pump)
    return receive
