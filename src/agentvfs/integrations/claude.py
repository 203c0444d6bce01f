"""A workspace inside the Claude Agent SDK (``pip install 'agentvfs[claude]'``).

Three pieces, each usable alone:

* :func:`claude_mcp_server` serves the workspace's tools to Claude in-process, as an SDK MCP
  server (``ClaudeAgentOptions(mcp_servers={"agentvfs": config})``);
  :func:`claude_allowed_tools` names the tools Claude may run without asking, and
  :func:`claude_can_use_tool` answers Claude's permission prompts so that tools configured
  with ``require_approval`` run only when the user approved that very call.
* :func:`mounted_cwd` FUSE-mounts the workspace's filesystem and yields the mount point, for
  ``ClaudeAgentOptions(cwd=...)``: Claude's own Read, Write, Edit and Bash then work on the
  bucket.
* :class:`FsspecSessionStore` is a ``SessionStore`` over any fsspec storage (memory, local
  disk, S3, GCS, ...), so session transcripts outlive the machine that ran them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

import anyio
import anyio.to_thread

from agentvfs.integrations import require
from agentvfs.tools import NOT_APPROVED, WorkspaceTool, create_server
from agentvfs.vfs import LocalFilesystem, WorkspaceFilesystem

_sdk = require("claude_agent_sdk", "claude", "agentvfs.integrations.claude")

from claude_agent_sdk import (  # noqa: E402  # imported only once `require` said what is missing
    PermissionResultAllow,
    PermissionResultDeny,
    SessionStore,
    ToolPermissionContext,
    fold_session_summary,
)

if TYPE_CHECKING:
    import fsspec
    from claude_agent_sdk import (
        CanUseTool,
        McpSdkServerConfig,
        PermissionResult,
        SessionKey,
        SessionListSubkeysKey,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )

    from agentvfs import Workspace

__all__ = [
    "FsspecSessionStore",
    "claude_allowed_tools",
    "claude_can_use_tool",
    "claude_mcp_server",
    "mounted_cwd",
]

_T = TypeVar("_T")

#: What a tool needing approval answers when Claude did not approve this call through
#: :func:`claude_can_use_tool` (``allowed_tools`` and ``bypassPermissions`` skip it).
NOT_APPROVED_HERE = (
    "Tool {name} requires approval, and this call was not approved through can_use_tool "
    "(agentvfs.integrations.claude.claude_can_use_tool); it was not run. Tools in "
    "allowed_tools and the bypassPermissions mode skip the approval, so leave this tool out "
    "of allowed_tools."
)


# -- the tools, as an in-process MCP server ------------------------------------------------------


#: How long an approval given through :func:`claude_can_use_tool` waits for its call, in
#: seconds. Claude makes the call right after the answer; a grant still unused later belongs
#: to a call that never happened (an interrupted run), and must not cover another one.
GRANT_LIFETIME = 60.0

#: The ``_meta`` key under which the Claude CLI sends an MCP ``tools/call`` its tool use id,
#: the same id ``can_use_tool`` was given in ``ToolPermissionContext.tool_use_id``.
_TOOL_USE_ID = "claudecode/toolUseId"


@dataclass
class _Grant:
    """One approved call: the tool, its canonical arguments, the tool use id it was approved
    for (None if the context had none) and the ``time.monotonic()`` deadline."""

    tool: str
    args: str
    tool_use_id: str | None
    expires: float


@dataclass
class _Served:
    """What this module knows of a server it built: its name, tools and granted approvals."""

    name: str
    tools: Mapping[str, WorkspaceTool]
    # One grant per approved call; a call consumes one, so an approval never covers a second
    # call, nor one made after the grant's lifetime or after the last session ended.
    grants: list[_Grant] = field(default_factory=list)
    sessions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(
        self, tool: str, args: Mapping[str, Any], tool_use_id: str | None, lifetime: float
    ) -> None:
        now = time.monotonic()
        with self.lock:
            self._expire(now)
            self.grants.append(_Grant(tool, _canonical(args), tool_use_id, now + lifetime))

    def consume(self, tool: str, args: Mapping[str, Any], tool_use_id: str | None) -> bool:
        """Whether a live grant covers this call (and use it up).

        A call that carries a tool use id is covered only by the grant given for that id (or
        by one given without an id, matched on its arguments): an approval for another call
        of the same tool with the same arguments does not carry over. A call without an id
        (a client other than the Claude CLI) is matched on its arguments alone.
        """
        key = (tool, _canonical(args))
        with self.lock:
            self._expire(time.monotonic())
            if tool_use_id is not None:
                for grant in self.grants:
                    if grant.tool_use_id == tool_use_id:
                        # That call's one grant: used up even if the call differs from what
                        # was approved, since its id cannot come again legitimately.
                        self.grants.remove(grant)
                        return (grant.tool, grant.args) == key
            for grant in self.grants:
                if (grant.tool, grant.args) == key and (
                    tool_use_id is None or grant.tool_use_id is None
                ):
                    self.grants.remove(grant)
                    return True
            return False

    def _expire(self, now: float) -> None:
        self.grants[:] = [grant for grant in self.grants if grant.expires > now]

    def opened(self) -> None:
        with self.lock:
            self.sessions += 1

    def closed(self) -> None:
        with self.lock:
            self.sessions -= 1
            if self.sessions <= 0:
                # No session left to make the approved calls: whatever was not used is stale.
                self.sessions = 0
                self.grants.clear()


# Servers built by claude_mcp_server, so the other functions can take its config.
_SERVED: weakref.WeakKeyDictionary[Any, _Served] = weakref.WeakKeyDictionary()


def _canonical(args: Mapping[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _served(server: McpSdkServerConfig | Mapping[str, Any]) -> _Served:
    instance = server.get("instance") if isinstance(server, Mapping) else None
    try:
        served = _SERVED.get(instance) if instance is not None else None
    except TypeError:  # not weakly referable, so not one of ours
        served = None
    if served is None:
        raise TypeError(
            "expected the config returned by agentvfs.integrations.claude.claude_mcp_server(), "
            f"got {type(server).__name__}; build the server with claude_mcp_server(workspace)"
        )
    return served


async def claude_mcp_server(
    workspace: Workspace | Mapping[str, WorkspaceTool], *, name: str = "agentvfs"
) -> McpSdkServerConfig:
    """The workspace's tools as an in-process MCP server for the Claude Agent SDK.

    Parameters
    ----------
    workspace : Workspace or mapping of str to WorkspaceTool
        The workspace (its tools are built with ``create_tools()``), or tools already built.
    name : str, optional
        The server's name: the key to use in ``ClaudeAgentOptions(mcp_servers=...)``, and the
        middle of the names Claude gives the tools (``mcp__<name>__<tool>``).

    Returns
    -------
    McpSdkServerConfig
        ``{"type": "sdk", "name": name, "instance": <mcp Server>}``.

    Notes
    -----
    An in-process server cannot ask the user (the SDK does not forward elicitation), so a
    tool configured with ``require_approval`` runs only after :func:`claude_can_use_tool`
    approved that call; otherwise it answers a tool error and does nothing.
    """
    if not name or "__" in name or any(ch.isspace() for ch in name):
        raise ValueError(
            f"invalid server name {name!r}: Claude names tools mcp__<name>__<tool>, so the "
            "name must be non-empty, without whitespace or a double underscore"
        )
    if isinstance(workspace, Mapping):
        tools = dict(workspace)
    elif hasattr(workspace, "create_tools"):
        tools = await workspace.create_tools()
    else:
        raise TypeError(
            f"expected a Workspace or a mapping of WorkspaceTool, got {type(workspace).__name__}"
        )
    served = _Served(name=name, tools=tools)

    async def approve(tool: WorkspaceTool, args: Mapping[str, Any]) -> str | None:
        if served.consume(tool.name, args, _calling_tool_use_id(instance)):
            return None
        return NOT_APPROVED_HERE.format(name=tool.name)

    instance = create_server(tools, name=name, approve=approve)
    _track_sessions(instance, served)
    _SERVED[instance] = served
    return {"type": "sdk", "name": name, "instance": instance}


def _calling_tool_use_id(instance: Any) -> str | None:
    """The tool use id the Claude CLI sent with the MCP call being served, if any.

    The CLI puts it in the request's ``_meta``; the low-level server of ``mcp`` 1.x exposes
    that as ``request_context.meta`` (extra keys kept). Where it cannot be read (another
    ``mcp`` major, a client that sends none) this is None and grants match on arguments.
    """
    try:
        meta = instance.request_context.meta
    except (AttributeError, LookupError):
        return None
    extra = meta if isinstance(meta, Mapping) else getattr(meta, "model_extra", None)
    value = extra.get(_TOOL_USE_ID) if isinstance(extra, Mapping) else None
    return value if isinstance(value, str) and value else None


def _track_sessions(instance: Any, served: _Served) -> None:
    """Count the server's sessions through its lifespan, so grants left unused are dropped
    when the last one ends (the SDK runs one session per connected client)."""
    inner = getattr(instance, "lifespan", None)
    if inner is None:
        return

    @contextlib.asynccontextmanager
    async def lifespan(server: Any) -> AsyncIterator[Any]:
        served.opened()
        try:
            async with inner(server) as state:
                yield state
        finally:
            served.closed()

    instance.lifespan = lifespan


def _tool_id(server: str, tool: str) -> str:
    return f"mcp__{server}__{tool}"


def claude_allowed_tools(
    server: McpSdkServerConfig, *, include_approval: bool = False
) -> list[str]:
    """The names (``mcp__<server>__<tool>``) for ``ClaudeAgentOptions(allowed_tools=...)``.

    Parameters
    ----------
    server : McpSdkServerConfig
        What :func:`claude_mcp_server` returned.
    include_approval : bool, optional
        Also list the tools that may need approval. Off by default: a tool in
        ``allowed_tools`` is never shown to ``can_use_tool``, so it could not be approved and
        would refuse to run.

    Returns
    -------
    list of str
        In the order the workspace registers its tools.
    """
    served = _served(server)
    return [
        _tool_id(served.name, tool.name)
        for tool in served.tools.values()
        if include_approval or not tool.require_approval
    ]


Approve = Callable[
    [str, dict[str, Any], ToolPermissionContext],
    "bool | PermissionResult | Awaitable[bool | PermissionResult]",
]


async def _answer(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def claude_can_use_tool(
    server: McpSdkServerConfig,
    approve: Approve,
    *,
    otherwise: CanUseTool | None = None,
    grant_lifetime: float = GRANT_LIFETIME,
) -> CanUseTool:
    """A ``can_use_tool`` callback that honours the workspace's ``require_approval``.

    For a tool of ``server`` that needs approval for these arguments, ``approve`` is asked
    (with Claude's tool name, the arguments and the permission context); ``True`` or a
    ``PermissionResultAllow`` lets that one call run, anything else denies it. A tool of
    ``server`` that needs no approval is allowed at once.

    Parameters
    ----------
    server : McpSdkServerConfig
        What :func:`claude_mcp_server` returned.
    approve : callable
        ``approve(tool_name, input, context) -> bool | PermissionResult`` (may be async):
        how the user is asked.
    otherwise : CanUseTool, optional
        Asked for every other tool (Claude's Bash, Write, other servers...). Without it they
        are denied, so that installing this callback never widens what Claude may do.
    grant_lifetime : float, optional
        Seconds an approval waits for its call (default :data:`GRANT_LIFETIME`, 60).

    Returns
    -------
    CanUseTool
        For ``ClaudeAgentOptions(can_use_tool=...)``.

    Notes
    -----
    An approval covers one call, with the approved arguments, made within
    ``grant_lifetime`` while a session of the server is open. The Claude CLI sends each MCP
    call its tool use id, so the approval of ``context.tool_use_id`` covers that call only;
    a call without an id (another client) is matched on its arguments.
    """
    if not grant_lifetime > 0:
        raise ValueError(
            f"grant_lifetime must be a positive number of seconds, got {grant_lifetime!r}"
        )
    served = _served(server)
    prefix = _tool_id(served.name, "")

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResult:
        tool = served.tools.get(tool_name[len(prefix) :]) if tool_name.startswith(prefix) else None
        if tool is None:
            if otherwise is not None:
                return await otherwise(tool_name, tool_input, context)
            return PermissionResultDeny(
                message=f"{tool_name} is not an agentvfs tool and no other permission callback "
                "was given (claude_can_use_tool(..., otherwise=...))"
            )
        if not await tool.needs_approval(tool_input):
            return PermissionResultAllow()
        answer = await _answer(approve(tool_name, tool_input, context))
        if answer is True:
            answer = PermissionResultAllow()
        if isinstance(answer, PermissionResultAllow):
            # The call Claude makes next carries the input as the user may have changed it.
            served.grant(
                tool.name, answer.updated_input or tool_input, context.tool_use_id, grant_lifetime
            )
            return answer
        if isinstance(answer, PermissionResultDeny):
            return answer
        return PermissionResultDeny(message=NOT_APPROVED)

    return can_use_tool


# -- Claude's own tools on the workspace: a FUSE mount as cwd ------------------------------------


@contextlib.asynccontextmanager
async def mounted_cwd(
    workspace: Workspace | WorkspaceFilesystem,
    mountpoint: str | os.PathLike[str] | None = None,
    *,
    read_only: bool | None = None,
    separate_process: bool = False,
) -> AsyncIterator[str]:
    """Mount the workspace's filesystem and yield the directory, for
    ``ClaudeAgentOptions(cwd=...)``.

    Claude's built-in tools (Read, Write, Edit, Glob, Grep, Bash) work on ordinary paths; with
    the mount as their working directory they read and write the bucket. On exit pending
    writes are uploaded and the mount is removed (and the directory, if this made it).

    Parameters
    ----------
    workspace : Workspace or WorkspaceFilesystem
        A workspace with a static filesystem, or the filesystem itself. A writable
        :class:`~agentvfs.LocalFilesystem` is already a directory: its ``base_path`` is
        yielded without mounting. A read-only one (or ``read_only=True``) is mounted
        read-only, so that writes through the directory fail with ``EROFS``.
    mountpoint : path, optional
        An existing empty directory; default a new temporary one.
    read_only : bool, optional
        Mount read-only; defaults to the filesystem's own ``read_only``. ``False`` on a
        read-only filesystem is refused (``MountError``) rather than widening it.
    separate_process : bool, optional
        Serve the mount from a child process (:class:`~agentvfs.mounts.ProcessMount`) rather
        than a thread of this one: a process serves only one in-thread mount at a time.

    Yields
    ------
    str
        The absolute path of the mounted directory.

    Raises
    ------
    ValueError
        The workspace has no static filesystem (a resolver, or none).
    MountError
        FUSE is not available, the mount point is busy, or ``read_only=False`` was asked of
        a read-only filesystem.
    """
    filesystem = workspace if isinstance(workspace, WorkspaceFilesystem) else workspace.filesystem
    if filesystem is None:
        raise ValueError(
            "mounted_cwd needs a workspace with a static filesystem (Workspace(filesystem=...)); "
            "this one has none or a resolver, which has no single directory to mount"
        )
    # The filesystem's own read_only is the default and the floor: a read-only directory is
    # never handed out as itself, since Claude's tools would write straight through it.
    read_only = filesystem.read_only if read_only is None else read_only
    if isinstance(filesystem, LocalFilesystem) and not read_only and not filesystem.read_only:
        # base_path is already absolute (LocalFilesystem resolves it).
        yield os.fspath(filesystem.base_path)
        return
    from agentvfs.mounts import Mount, ProcessMount

    made = mountpoint is None
    directory = (
        tempfile.mkdtemp(prefix="agentvfs-claude-") if mountpoint is None else os.fspath(mountpoint)
    )
    try:
        kind = ProcessMount if separate_process else Mount
        handle = kind(filesystem, directory, read_only=read_only)
        await anyio.to_thread.run_sync(handle.start)
        try:
            yield handle.mountpoint
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(handle.close)
    finally:
        if made:
            shutil.rmtree(directory, ignore_errors=True)


# -- transcripts in a bucket: a SessionStore over fsspec ----------------------------------------

_STAMP_LOCK = threading.Lock()
_LAST_STAMP = 0


def _next_stamp() -> int:
    """Nanoseconds since the epoch, strictly increasing across this process.

    Batch objects are named by it, so the order of names is the order of ``append`` calls
    in this process even when the clock steps back or two calls share a tick.
    """
    global _LAST_STAMP
    with _STAMP_LOCK:
        _LAST_STAMP = max(time.time_ns(), _LAST_STAMP + 1)
        return _LAST_STAMP


@functools.lru_cache(maxsize=1024)
def _component(value: str, what: str) -> str:
    """One path component for a key part: percent-encoded, so any string is a single safe
    name (no ``/``, no ``.`` or ``..``) and decodes back exactly."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    encoded = quote(value, safe="")
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


#: One JSON Lines entry; built once, as ``json.dumps`` would build one a call.
_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

_MAIN = "transcript"
_SUBKEYS = "subkeys"
_SUMMARY = "summary.json"
_BATCH_SUFFIX = ".jsonl"


class FsspecSessionStore(SessionStore):
    """Claude Agent SDK session transcripts in any fsspec storage.

    Layout under ``root`` (each key part percent-encoded into one path component)::

        <project_key>/<session_id>/transcript/<batch>.jsonl        the main transcript
        <project_key>/<session_id>/subkeys/<subpath>/<batch>.jsonl a subagent transcript
        <project_key>/<session_id>/summary.json                    the listing summary

    Object stores cannot append, so every :meth:`append` writes one new object (a batch, JSON
    Lines) whose name starts with a process-wide strictly increasing nanosecond stamp and
    ends with a random writer id. No write ever replaces a batch, so concurrent appends, from
    this process or from others, cannot lose entries; :meth:`load` reads the batches in name
    order: call order within a process, the writers' clocks across processes. Entries with a
    ``uuid`` are kept once (the first), so a batch the SDK retried after a write that did land
    is not doubled. On local disk a batch is written under a hidden name and renamed, so a
    reader never sees half of one.

    The summary (``fold_session_summary``) is kept in memory per session by each store
    instance, read from storage only the first time the instance appends to that session. It
    is written only when a batch changes it; a batch that leaves it as it was is written
    alone, and its name carries a short hash of the summary data it left unchanged. The
    summary object records the newest batch it folded and how many batches it folded, so
    :meth:`list_session_summaries` can tell, from the listing alone, that it covers every
    batch: all batches up to that newest one were folded, and every later one left exactly
    this data unchanged. Then its ``mtime`` is the newest batch's stamp, the clock
    :meth:`list_sessions` reports. A summary that cannot be vouched for that way (concurrent
    writers in other instances or processes, a crash between the two writes) is rebuilt from
    the transcript when listed and written back.

    Parameters
    ----------
    storage : fsspec.AbstractFileSystem or str
        A filesystem instance, or a URL (``"s3://bucket/sessions"``, ``"memory://sessions"``,
        ``"/var/lib/transcripts"``) opened with ``fsspec.core.url_to_fs``.
    root : str, optional
        The directory (bucket prefix) inside ``storage``; with a URL, appended to its path.
    storage_options : mapping, optional
        Passed to fsspec when ``storage`` is a URL.
    """

    def __init__(
        self,
        storage: fsspec.AbstractFileSystem | str,
        root: str = "",
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        import fsspec.core
        from fsspec.implementations.local import LocalFileSystem
        from fsspec.implementations.memory import MemoryFileSystem

        if isinstance(storage, str):
            fs, base = fsspec.core.url_to_fs(storage, **dict(storage_options or {}))
            root = f"{base.rstrip('/')}/{root.strip('/')}" if root.strip("/") else base
        elif isinstance(storage, fsspec.AbstractFileSystem):
            if storage_options:
                raise ValueError(
                    "storage_options apply to a URL; configure the filesystem instance instead"
                )
            fs = storage
        else:
            raise TypeError(
                f"storage must be an fsspec filesystem or a URL string, got {type(storage).__name__}"
            )
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root.strip("/") else ""
        if not self.root:
            raise ValueError(
                "give a root directory (a bucket, or bucket/prefix) for the transcripts, e.g. "
                "FsspecSessionStore(fs, 'my-bucket/claude-sessions')"
            )
        # A dictionary in memory needs no thread; real I/O is kept off the event loop.
        self._inline = isinstance(fs, MemoryFileSystem)
        self._local = isinstance(fs, LocalFileSystem)
        self._writer = uuid.uuid4().hex[:12]
        self._made: set[str] = set()
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}
        # The summary of each session this instance appended to, so an append neither reads
        # nor (unless the summary changes) writes it; bounded, an evicted one is read again.
        self._summaries: OrderedDict[str, _Summary] = OrderedDict()

    def __repr__(self) -> str:
        return f"FsspecSessionStore({type(self.fs).__name__}, root={self.root!r})"

    # -- paths ------------------------------------------------------------------------------

    def _join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _session_dir(self, project_key: str, session_id: str) -> str:
        return self._join(
            _component(project_key, "project_key"), _component(session_id, "session_id")
        )

    def _stream_dir(self, key: SessionKey) -> str:
        session = self._session_dir(key["project_key"], key["session_id"])
        if "subpath" not in key:
            return f"{session}/{_MAIN}"
        return f"{session}/{_SUBKEYS}/{_component(key['subpath'], 'subpath (omit it for the main transcript)')}"

    # -- storage, off the event loop --------------------------------------------------------

    async def _run(self, func: Callable[..., _T], *args: Any) -> _T:
        if self._inline:
            return func(*args)
        return await anyio.to_thread.run_sync(func, *args)

    def _listing(self, directory: str) -> list[str]:
        """Every object under ``directory`` (recursively), as paths relative to it, newest
        listing from the store."""
        self.fs.invalidate_cache(directory)
        try:
            found = self.fs.find(directory)
        except FileNotFoundError:
            return []
        return [self._relative(directory, name) for name in found]

    def _relative(self, directory: str, path: str) -> str:
        path = self.fs._strip_protocol(path)
        prefix = directory.rstrip("/") + "/"
        return path[len(prefix) :] if path.startswith(prefix) else ""

    def _batches(self, directory: str) -> list[str]:
        names = self._listing(directory)
        return sorted(
            f"{directory}/{name}" for name in names if _is_batch(name) and "/" not in name
        )

    def _write(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent not in self._made:
            self.fs.makedirs(parent, exist_ok=True)
            self._made.add(parent)
        if not self._local:
            # One PUT: an object store never shows a partial object.
            self.fs.pipe_file(path, data)
            return
        staging = f"{parent}/.{uuid.uuid4().hex}.tmp"
        self.fs.pipe_file(staging, data)
        try:
            self.fs.mv(staging, path)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.rm_file(staging)
            raise

    def _read_many(self, paths: list[str]) -> dict[str, bytes]:
        if not paths:
            return {}
        found = self.fs.cat(paths, on_error="omit")
        return {self.fs._strip_protocol(p): data for p, data in found.items()}

    # -- the SessionStore protocol ---------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Write ``entries`` as one new batch object (nothing when there are none); for a main
        transcript, fold them into the session's summary and write it if they changed it."""
        if not entries:
            return
        directory = self._stream_dir(key)
        stamp = _next_stamp()  # before any await: call order is name order
        body = "".join(_LINE.encode(entry) + "\n" for entry in entries).encode()
        order = f"{stamp:020d}-{self._writer}"
        if "subpath" in key:
            await self._run(self._write, f"{directory}/{order}{_BATCH_SUFFIX}", body)
            return
        session = directory[: -len(_MAIN) - 1]
        if self._inline:
            # Memory storage runs inline: nothing below suspends, so appends cannot
            # interleave, and a lock would only cost a pass through the event loop.
            await self._append_main(session, directory, order, stamp, key, entries, body)
            return
        async with self._session_lock(session):
            await self._append_main(session, directory, order, stamp, key, entries, body)

    async def _append_main(
        self,
        session: str,
        directory: str,
        order: str,
        stamp: int,
        key: SessionKey,
        entries: list[SessionStoreEntry],
        body: bytes,
    ) -> None:
        """Write a main transcript's batch, and its summary if the batch changes it."""
        # Taken out while in use: if a write fails, what landed is unknown, and the next
        # append reads the summary again.
        state = self._summaries.pop(session, None)
        if state is None:
            state = await self._run(self._summary_state, session, key)
        folded = fold_session_summary(state.entry(key), key, entries)
        if folded["data"] == state.data:
            # Unchanged: the batch alone, its name saying which data it left as it was.
            name = f"{directory}/{order}-{state.digest}{_BATCH_SUFFIX}"
            await self._run(self._write, name, body)
            state = state.counted(1)
        else:
            # Batch first: a summary must never claim a batch that is not there.
            await self._run(self._write, f"{directory}/{order}{_BATCH_SUFFIX}", body)
            state = _Summary(folded["data"], state.folded + 1, order)
            await self._run(self._write_summary, session, key, state, stamp)
        self._summaries[session] = state
        while len(self._summaries) > _CACHED_SUMMARIES:
            self._summaries.popitem(last=False)

    def _write_summary(self, session: str, key: SessionKey, state: _Summary, stamp: int) -> None:
        record = {
            "session_id": key["session_id"],
            "mtime": stamp // 1_000_000,
            "data": state.data,
            "version": state.version,
            "folded": state.folded,
        }
        self._write(f"{session}/{_SUMMARY}", json.dumps(record, ensure_ascii=False).encode())

    def _summary_state(self, session: str, key: SessionKey) -> _Summary:
        """The session's summary as stored, checked against its batches; rebuilt from them
        (and written back) when it does not cover them all."""
        directory = f"{session}/{_MAIN}"
        leaves = [name.rsplit("/", 1)[-1] for name in self._batches(directory)]
        stored = self._read_many([f"{session}/{_SUMMARY}"]).get(f"{session}/{_SUMMARY}")
        state = _Summary.parse(stored)
        if state is not None and state.covers(leaves):
            return state.counted(len(leaves) - state.folded)
        return self._rebuild(session, key, leaves)

    def _rebuild(self, session: str, key: SessionKey, leaves: list[str]) -> _Summary:
        """Fold the batches ``leaves`` of the session's main transcript afresh and store the
        result (best effort: a reader without write access still gets it)."""
        if not leaves:
            return _Summary({}, 0, "")
        directory = f"{session}/{_MAIN}"
        paths = [f"{directory}/{leaf}" for leaf in leaves]
        entries = _entries(paths, self._read_many(paths))
        folded = fold_session_summary(None, key, entries)
        state = _Summary(folded["data"], len(leaves), _order(leaves[-1]))
        with contextlib.suppress(OSError):
            self._write_summary(session, key, state, int(_order(leaves[-1])[:20]))
        return state

    @contextlib.asynccontextmanager
    async def _session_lock(self, session: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(session, (None, 0))
        if lock is None:
            lock = anyio.Lock()
        self._locks[session] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[session]
            if users <= 1:
                del self._locks[session]
            else:
                self._locks[session] = (lock, users - 1)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """Every entry of ``key`` in append order, or None if it was never written."""
        directory = self._stream_dir(key)
        batches = await self._run(self._batches, directory)
        if not batches:
            return None
        contents = await self._run(self._read_many, batches)
        return _entries(batches, contents)

    def _project(self, project_key: str) -> tuple[str, list[tuple[str, str, int]]]:
        """The project's directory and, for every object under it, (session component, path
        below the session, stamp in ms or 0)."""
        directory = self._join(_component(project_key, "project_key"))
        rows = []
        for relative in self._listing(directory):
            session, _, rest = relative.partition("/")
            if not rest:
                continue
            leaf = rest.rsplit("/", 1)[-1]
            stamp = int(leaf[:20]) // 1_000_000 if _is_batch(leaf) else 0
            rows.append((session, rest, stamp))
        return directory, rows

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """The sessions of ``project_key`` with a main transcript; ``mtime`` is the stamp (ms)
        of its newest batch."""
        _, rows = await self._run(self._project, project_key)
        newest: dict[str, int] = {}
        for session, rest, stamp in rows:
            if rest.startswith(f"{_MAIN}/") and stamp:
                newest[session] = max(newest.get(session, 0), stamp)
        return [{"session_id": unquote(s), "mtime": m} for s, m in newest.items()]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The summaries of the sessions of ``project_key`` with a main transcript; one that
        does not cover every batch is rebuilt from the transcript (and stored again)."""
        directory, rows = await self._run(self._project, project_key)
        leaves: dict[str, list[str]] = {}
        for session, rest, _ in rows:
            stream, _, leaf = rest.partition("/")
            if stream == _MAIN and _is_batch(leaf):
                leaves.setdefault(session, []).append(leaf)
        paths = {s: f"{directory}/{s}/{_SUMMARY}" for s in leaves}
        contents = await self._run(self._read_many, list(paths.values()))
        found: list[SessionSummaryEntry] = []
        for session, names in leaves.items():
            names.sort()
            key: SessionKey = {"project_key": project_key, "session_id": unquote(session)}
            state = _Summary.parse(contents.get(paths[session]))
            if state is None or not state.covers(names):
                state = await self._run(self._rebuild, f"{directory}/{session}", key, names)
                self._summaries.pop(f"{directory}/{session}", None)
            mtime = int(names[-1][:20]) // 1_000_000
            found.append(
                {"session_id": key["session_id"], "mtime": mtime, "data": dict(state.data)}
            )
        return found

    async def delete(self, key: SessionKey) -> None:
        """Remove a session with its subagent transcripts and summary, or (with ``subpath``)
        that one subagent transcript. A key never written is not an error."""
        if "subpath" in key:
            target = self._stream_dir(key)
        else:
            target = self._session_dir(key["project_key"], key["session_id"])
            self._summaries.pop(target, None)
        await self._run(self._remove, target)

    def _remove(self, target: str) -> None:
        self.fs.invalidate_cache(target)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(target, recursive=True)
        self.fs.invalidate_cache(target)
        self._made = {d for d in self._made if d != target and not d.startswith(target + "/")}

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths (subagent transcripts) written under a session."""
        directory = f"{self._session_dir(key['project_key'], key['session_id'])}/{_SUBKEYS}"
        listing = await self._run(self._listing, directory)
        found: set[str] = set()
        for relative in listing:
            component, _, leaf = relative.partition("/")
            if _is_batch(leaf):
                found.add(unquote(component))
        return sorted(found)


def _is_batch(name: str) -> bool:
    return (
        name.endswith(_BATCH_SUFFIX)
        and not name.startswith(".")
        and len(name) > 20
        and name[:20].isdigit()
    )


def _order(leaf: str) -> str:
    """``<stamp>-<writer>`` of a batch name: what orders it, without the summary hash."""
    return "-".join(leaf[: -len(_BATCH_SUFFIX)].split("-")[:2])


def _digest(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


#: Sessions whose summary one store instance keeps in memory.
_CACHED_SUMMARIES = 256


class _Summary:
    """A session's folded summary data, how many batches it covers, and the newest of them
    (``<stamp>-<writer>``; empty before any)."""

    __slots__ = ("data", "digest", "folded", "version")

    def __init__(
        self, data: dict[str, Any], folded: int, version: str, digest: str | None = None
    ) -> None:
        self.data = data
        self.folded = folded
        self.version = version
        self.digest = _digest(data) if digest is None else digest

    @classmethod
    def parse(cls, stored: bytes | None) -> _Summary | None:
        """The summary object as written by this store; None if absent or of another form."""
        if not stored:
            return None
        try:
            record = json.loads(stored)
            return cls(dict(record["data"]), int(record["folded"]), str(record["version"]))
        except (ValueError, KeyError, TypeError):
            return None

    def counted(self, more: int) -> _Summary:
        """The same data, covering ``more`` further batches that left it unchanged."""
        return _Summary(self.data, self.folded + more, self.version, self.digest)

    def covers(self, leaves: list[str]) -> bool:
        """Whether this summary is the fold of exactly the batches ``leaves`` (sorted): it
        folded as many as there are up to its version, and every later one left its data
        unchanged. A batch it never saw (a concurrent writer's) breaks the count or the hash."""
        upto = sum(1 for leaf in leaves if _order(leaf) <= self.version)
        if upto != self.folded:
            return False
        later = leaves[upto:]
        return all(leaf[: -len(_BATCH_SUFFIX)].endswith(f"-{self.digest}") for leaf in later)

    def entry(self, key: SessionKey) -> SessionSummaryEntry | None:
        """What ``fold_session_summary`` takes as the previous summary of ``key``."""
        if not self.folded:
            return None
        return {"session_id": key["session_id"], "mtime": 0, "data": self.data}


def _entries(paths: list[str], contents: Mapping[str, bytes]) -> list[SessionStoreEntry]:
    """The entries of the batches ``paths`` in that order; an entry with a ``uuid`` once."""
    entries: list[SessionStoreEntry] = []
    seen: set[str] = set()
    for path in paths:
        data = contents.get(path)
        if data is None:
            # Listed a moment ago, gone now: the session is being deleted.
            continue
        for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if not line:
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise ValueError(
                    f"transcript batch {path} line {number} is not JSON ({exc}); it was not "
                    "written by FsspecSessionStore, or was damaged: repair or remove it"
                ) from None
            marker = entry.get("uuid") if isinstance(entry, dict) else None
            if isinstance(marker, str):
                if marker in seen:
                    continue
                seen.add(marker)
            entries.append(entry)
    return entries
