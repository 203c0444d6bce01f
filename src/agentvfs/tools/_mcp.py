"""An MCP server offering a workspace's tools (``agentvfs mcp``), on the official ``mcp`` SDK.

The SDK is imported here only, so ``import agentvfs`` works without it.

Over stdio a message is one line, read in linear time and at most
:data:`DEFAULT_MAX_MESSAGE_BYTES` long (64 MiB; ``AGENTVFS_MCP_MAX_MESSAGE_BYTES`` or
``serve_stdio(max_message_bytes=...)`` sets another). A longer one is passed over unread,
never held whole: the request it carries is answered with a JSON-RPC "invalid request" error
naming the limit (when its id can be found in its first or last bytes), stderr says so, and
the server goes on serving.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol, cast
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
#: The longest message the stdio server reads (one line of JSON). Well past the largest a
#: client sends in use: a ``write_file`` of 8 MiB (what ``edit_file`` edits at most) is at
#: most 48 MiB as JSON, where each byte may be written as a six-character ``\u00XX``.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: The environment variable that sets another limit (bytes), for a server started by a client.
MAX_MESSAGE_VARIABLE = "AGENTVFS_MCP_MAX_MESSAGE_BYTES"
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


async def serve_stdio(workspace: ServedWorkspace, *, max_message_bytes: int | None = None) -> None:
    """Initialise ``workspace``, serve its tools over stdin/stdout until the client closes
    stdin, then destroy the workspace. A workspace that does not start is served as by
    :func:`serve_stdio_failure`.

    ``max_message_bytes`` is the longest message read (one line); a longer one is answered
    with an error and passed over (see the module notes). Default: ``AGENTVFS_MCP_MAX_MESSAGE_BYTES``
    when set, else :data:`DEFAULT_MAX_MESSAGE_BYTES` (64 MiB).
    """
    import anyio

    _require_mcp()
    limit = _message_limit(max_message_bytes)
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
            await _serve(server, protocol_out, limit)
    finally:
        sys.stdout = saved


async def serve_stdio_failure(reason: str, *, max_message_bytes: int | None = None) -> None:
    """Serve, over stdin/stdout, an MCP server for a workspace that could not be made: it says
    ``reason`` in its instructions and as the error of every tool call, and lists no tools, so
    the client shows the cause rather than a closed connection. ``max_message_bytes`` as for
    :func:`serve_stdio`."""
    import anyio

    _require_mcp()
    limit = _message_limit(max_message_bytes)
    protocol_out = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        await _serve(_failed_server(reason), protocol_out, limit)
    finally:
        sys.stdout = saved


def _message_limit(value: int | None) -> int:
    """The message limit in force: ``value``, else the environment's, else the default. A
    variable that is not a positive number of bytes is said on stderr, and the default used
    (the server still starts: its client would otherwise see only a closed connection).

    Raises
    ------
    ValueError
        ``value`` is given and is not a positive number of bytes.
    """
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"max_message_bytes must be a positive number of bytes, got {value!r}")
        return value
    text = os.environ.get(MAX_MESSAGE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_MESSAGE_BYTES
    if text.isdigit() and int(text) > 0:
        return int(text)
    print(
        f"agentvfs mcp: {MAX_MESSAGE_VARIABLE}={text!r} is not a positive number of bytes; "
        f"using the default, {DEFAULT_MAX_MESSAGE_BYTES}",
        file=sys.stderr,
        flush=True,
    )
    return DEFAULT_MAX_MESSAGE_BYTES


class _Oversized:
    """A line past the limit, passed over: its size and the request id it carried (found in
    its first or last bytes), or None when none was found (a notification, or no JSON)."""

    #: Bytes kept of each end of a line passed over: where a client puts the id (first
    #: with the Python SDK, last with the TypeScript one).
    ENDS = 4096

    def __init__(self) -> None:
        self.size = 0
        self.head = b""
        self.tail = b""

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if len(self.head) < self.ENDS:
            self.head += piece[: self.ENDS - len(self.head)]
        self.tail = (self.tail + piece[-self.ENDS :])[-self.ENDS :]

    def request_id(self) -> int | str | None:
        found = _id_in_head(self.head.decode("utf-8", "replace"))
        return found if found is not None else _id_in_tail(self.tail)


class _StdinLines:
    """The lines of a file descriptor (stdin), read by a daemon thread and handed to the
    event loop.

    The SDK's default reads stdin in a worker thread that a cancellation must wait for: a
    server told to stop (SIGINT, SIGTERM) while its client keeps stdin open would wait for
    a line that never comes. A daemon thread blocked in ``read`` holds nothing up: the
    server stops at once, and the thread ends with the process. It reads the descriptor
    itself, not ``sys.stdin``: a daemon thread holding a buffered file's lock when the
    interpreter shuts down aborts the process.

    A line is gathered as a list of the pieces each read gave and joined once at its end
    (linear in its length), and holds at most ``limit`` bytes: past that, the rest of the
    line is counted and dropped as it comes, and the loop gets an :class:`_Oversized` for
    it, which ``refuse`` answers.
    """

    def __init__(self, fd: int, limit: int) -> None:
        import threading

        import anyio
        import anyio.lowlevel

        self._fd = fd
        self._limit = limit
        self._send, self._receive = anyio.create_memory_object_stream[str | _Oversized | None](1)
        self._token = anyio.lowlevel.current_token()
        #: Answers a line past the limit (set by the server once its output stream is there).
        self.refuse: Callable[[_Oversized], Awaitable[None]] | None = None
        threading.Thread(target=self._read, name="agentvfs-mcp-stdin", daemon=True).start()

    def _read(self) -> None:
        import anyio.from_thread

        def hand(line: str | _Oversized | None) -> None:
            anyio.from_thread.run(self._send.send, line, token=self._token)

        limit = self._limit
        pieces: list[bytes] = []
        size = 0
        dropped: _Oversized | None = None
        try:
            while chunk := os.read(self._fd, 1 << 16):
                start = 0
                while True:
                    newline = chunk.find(b"\n", start)
                    piece = chunk[start:] if newline < 0 else chunk[start:newline]
                    if dropped is not None:
                        dropped.add(piece)
                    elif size + len(piece) > limit:
                        dropped = _Oversized()
                        for kept in (*pieces, piece):
                            dropped.add(kept)
                        pieces, size = [], 0
                    elif piece:
                        pieces.append(piece)
                        size += len(piece)
                    if newline < 0:
                        break
                    if dropped is not None:
                        hand(dropped)
                        dropped = None
                    else:
                        hand(b"".join(pieces).decode("utf-8", "replace") + "\n")
                        pieces, size = [], 0
                    start = newline + 1
            if dropped is not None:
                hand(dropped)
            elif pieces:
                hand(b"".join(pieces).decode("utf-8", "replace"))
            hand(None)
        except Exception:  # the loop ended, the server closed its end, or stdin failed
            return

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._receive.receive()
            if line is None:
                raise StopAsyncIteration
            if isinstance(line, str):
                return line
            if self.refuse is not None:
                await self.refuse(line)


async def _serve(server: Any, protocol_out: Any, limit: int) -> None:
    """Run ``server`` on stdin and ``protocol_out`` until the client closes stdin."""
    import anyio
    from mcp.server.stdio import stdio_server

    lines = _StdinLines(sys.stdin.fileno(), limit)
    async with (
        stdio_server(stdin=cast(Any, lines), stdout=protocol_out) as (read_stream, write_stream),
        anyio.create_task_group() as tg,
    ):

        async def refuse(line: _Oversized) -> None:
            await _refuse_oversized(write_stream, line, limit)

        lines.refuse = refuse
        known = await _answer_unknown_methods(tg, read_stream, write_stream)
        await server.run(known, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()


async def _refuse_oversized(write_stream: Any, line: _Oversized, limit: int) -> None:
    """Answer a line past the limit: an "invalid request" error to the request it carried,
    when its id was found, and a line on stderr either way."""
    from mcp import types
    from mcp.shared.message import SessionMessage

    request_id = line.request_id()
    said = (
        f"agentvfs mcp: a message of {line.size} bytes was not read: the limit is {limit} bytes "
        f"(set {MAX_MESSAGE_VARIABLE} to raise it)"
    )
    answered = f"; request {request_id!r} was answered with an error" if request_id is not None else "; it named no request id to answer"
    print(said + answered, file=sys.stderr, flush=True)
    if request_id is None:
        return
    error = types.ErrorData(
        code=types.INVALID_REQUEST,
        message=(
            f"the message is {line.size} bytes, past this server's limit of {limit} bytes; send less in "
            f"one message (a large file in parts), or start the server with {MAX_MESSAGE_VARIABLE} set higher"
        ),
        data={"size": line.size, "limit": limit},
    )
    answer = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
    await write_stream.send(SessionMessage(types.JSONRPCMessage(answer)))


def _id_in_head(head: str) -> int | str | None:
    """The ``id`` member of the JSON object ``head`` begins, when it comes before the first
    member cut off (``{"jsonrpc": "2.0", "id": 7, "method": ...``); None otherwise."""
    decoder = json.JSONDecoder()
    position = _skip_space(head, 0)
    if not head.startswith("{", position):
        return None
    position += 1
    try:
        while True:
            key, position = decoder.raw_decode(head, _skip_space(head, position))
            position = _skip_space(head, position)
            if not head.startswith(":", position):
                return None
            value, position = decoder.raw_decode(head, _skip_space(head, position + 1))
            if key == "id":
                return _request_id(value)
            position = _skip_space(head, position)
            if not head.startswith(",", position):
                return None
            position += 1
    except ValueError:  # a member runs past what was kept
        return None


#: The ``id`` member that closes a JSON object (``..., "jsonrpc": "2.0", "id": 7}``).
_ID_AT_END = re.compile(rb'[,{]\s*"id"\s*:\s*(-?\d{1,19}|"(?:[^"\\]|\\.){0,1024}")\s*}\s*$')


def _id_in_tail(tail: bytes) -> int | str | None:
    """The ``id`` member that closes the object ``tail`` ends, when it does."""
    match = _ID_AT_END.search(tail)
    if match is None:
        return None
    try:
        return _request_id(json.loads(match.group(1)))
    except ValueError:
        return None


def _request_id(value: Any) -> int | str | None:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


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
