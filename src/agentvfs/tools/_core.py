"""``WorkspaceTool`` and ``create_tools``: registration, configuration and the execution
wrappers of the reference (§12), in its order: write lock, hooks, read tracking, the tool."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.to_thread

from .._aio import maybe_await as _maybe_await
from .._context import RequestContext
from ..errors import FilesystemNotAvailableError, SandboxNotAvailableError, WorkspaceReadOnlyError
from ..vfs import FileStat, WorkspaceFilesystem
from ._names import WORKSPACE_TOOLS
from ._output import load_encoding
from ._schema import validate_input
from ._tracking import ReadTracker, WriteLocks

if TYPE_CHECKING:
    from ._host import ToolHost

__all__ = ["ToolCall", "ToolMedia", "ToolSpec", "WorkspaceTool", "build_tools", "run_stoppable", "strip_ansi"]

T = TypeVar("T")

logger = logging.getLogger("agentvfs")

DEFAULT_WRITE_LOCK_TIMEOUT_MS = 30_000
_EXECUTE_COMMAND = WORKSPACE_TOOLS.SANDBOX.EXECUTE_COMMAND
#: Wall-clock limit of one tool call (option ``timeout_ms``, top level or per tool; None for
#: none). Generous: a grep ends 5 s after it began of its own, a read is bounded in size; it
#: is for a call stuck on slow storage. ``execute_command`` has its own ``timeout`` input.
DEFAULT_TOOL_TIMEOUT_MS = 120_000


async def run_stoppable(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args, stop)`` in a worker thread, where ``stop()`` becomes true once the
    awaiting task is cancelled (the call's ``timeout_ms``, a grep's deadline).

    Cancellation abandons the thread, as for any blocking call, but CPU-bound work (a large
    ``.gitignore`` costs milliseconds per path) must not run on in it: ``fn`` checks
    ``stop()`` between steps and returns early. What it returns then is never seen. The
    thread is not counted against the shared limit of worker threads, which other calls'
    blocking I/O may hold: waiting there is time the caller's deadline does not cover.
    """
    stopped = threading.Event()
    try:
        work = functools.partial(fn, *args, stopped.is_set)
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))
    finally:
        stopped.set()


@dataclass(frozen=True, slots=True)
class ToolMedia:
    """A tool result carrying media (an image or PDF): a caption plus base64 data."""

    text: str
    media_type: str
    data: str

    def to_model_output(self) -> list[dict[str, str]]:
        """The parts a model receives: the caption, then the media."""
        return [
            {"type": "text", "text": self.text},
            {"type": "media", "data": self.data, "media_type": self.media_type},
        ]


@dataclass
class ToolCall:
    """What a tool implementation receives for one call."""

    args: dict[str, Any]
    options: dict[str, Any]
    workspace: ToolHost
    request_context: RequestContext
    #: The resolved filesystem (filesystem tools); read it through :attr:`fs`.
    filesystem: WorkspaceFilesystem | None = None
    #: The resolved sandbox (sandbox tools).
    sandbox: Any = None
    tool_call_id: str | None = None
    #: The caller's abort signal (``is_set() -> bool``), if any.
    abort_signal: Any = None
    #: For write tools: the stat of the file when this agent last read it (optimistic
    #: concurrency: the write fails with StaleFileError if the file changed since).
    expected: FileStat | None = None
    #: Set by read tools to the stat they read, so the tracker need not stat again.
    seen: FileStat | None = None

    @property
    def fs(self) -> WorkspaceFilesystem:
        """The resolved filesystem."""
        if self.filesystem is None:
            raise FilesystemNotAvailableError()
        return self.filesystem


class ToolFailure(str):
    """A tool's answer that reports a failure in words rather than raising: the reference's
    text (it is that ``str``, byte for byte), flagged so that a protocol with a notion of
    failure can say so (MCP's ``isError``). ``edit_file`` answers this way when the text to
    replace is missing or not unique, ``file_stat`` when nothing is at the path."""

    __slots__ = ()


ToolResult = str | ToolMedia
Implementation = Callable[[ToolCall], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSpec:
    """A tool's definition: default name, description, input schema and implementation."""

    name: str
    description: str
    schema: dict[str, Any]
    run: Implementation
    #: ``read`` records what was read; ``write`` checks and consumes read records.
    tracking: Literal["read", "write"] | None = None
    #: Serialise calls per ``path`` (write_file, edit_file, delete).
    locked: bool = False
    #: The operation name a read-only filesystem reports (``write_file``, ``delete``...).
    writes: str | None = None
    #: The provider the tool runs against, resolved per request before it runs.
    needs: Literal["filesystem", "sandbox", "workspace"] = "filesystem"
    defaults: dict[str, Any] = field(default_factory=dict)
    #: A wider schema the input is checked against, when the tool accepts more than it
    #: advertises (the search tool takes any mode and falls back to an available one).
    accepts: dict[str, Any] | None = None
    #: Offered unless configured off; False: only when its own ``enabled`` turns it on.
    enabled_by_default: bool = True



# ANSI escapes: OSC strings (hyperlinks, titles) and CSI / single-character sequences.
_ANSI = re.compile(
    r"\x1b\][\s\S]*?(?:\x07|\x1b\\|\x9c)"
    r"|[\x1b\x9b][\[\]()#;?]*(?:\d{1,4}(?:[;:]\d{0,4})*)?[\dA-PR-TZcf-nq-uy=><~]"
)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor moves, hyperlinks) from ``text``."""
    return _ANSI.sub("", text)


def _scope(fs: WorkspaceFilesystem) -> str:
    base = fs.location
    return f"{fs.provider}:{base}" if base else fs.provider


class WorkspaceTool:
    """An agent tool bound to a workspace.

    Attributes
    ----------
    name : str
        The exposed name (after renaming).
    workspace_tool_name : str
        The default name, e.g. ``mastra_workspace_read_file``.
    description : str
        What the model is told.
    input_schema : dict
        JSON Schema of the input (closed objects).
    require_approval : bool
        Whether a caller must ask before running it (see :meth:`needs_approval`).
    """

    def __init__(
        self,
        spec: ToolSpec,
        *,
        name: str,
        workspace: ToolHost,
        options: dict[str, Any],
        require_approval: bool | Callable[[dict[str, Any]], Any],
        hooks: Mapping[str, Callable[[dict[str, Any]], Any]],
        locks: WriteLocks,
        tracker: ReadTracker,
        write_lock_timeout_ms: float,
        timeout_ms: float | None = None,
        checkpoint_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.name = name
        self.workspace_tool_name = spec.name
        self.description = spec.description
        self.input_schema = spec.schema
        self._approval = require_approval
        self.require_approval = bool(require_approval) if not callable(require_approval) else True
        self._workspace = workspace
        self._options = options
        self._hooks = hooks
        self._locks = locks
        self._tracker = tracker
        self._lock_timeout_ms = write_lock_timeout_ms
        self._timeout_ms = timeout_ms
        self._checkpoint_config: Mapping[str, Any] = checkpoint_config or {}

    @property
    def id(self) -> str:
        """The tool id (the exposed name)."""
        return self.name

    async def needs_approval(self, input: dict[str, Any], request_context: RequestContext | None = None) -> bool:
        """Tell whether this call needs approval (a function that fails says yes)."""
        if not callable(self._approval):
            return bool(self._approval)
        try:
            return bool(
                await _maybe_await(
                    self._approval(
                        {"args": input, "request_context": request_context or RequestContext(), "workspace": self._workspace}
                    )
                )
            )
        except Exception:
            logger.warning("[Workspace Tools] require_approval function threw; asking for approval", exc_info=True)
            return True

    async def execute(
        self,
        input: dict[str, Any],
        *,
        request_context: RequestContext | None = None,
        tool_call_id: str | None = None,
        abort_signal: Any = None,
    ) -> ToolResult:
        """Validate ``input`` and run the tool through its wrappers.

        Parameters
        ----------
        input : dict
            The tool's arguments (JSON object).
        request_context : RequestContext, optional
            Passed to resolvers, hooks and approval functions.
        tool_call_id : str, optional
            The model's id for this call; the sandbox tools hand it to their callbacks.
        abort_signal : object, optional
            Anything with ``is_set() -> bool`` (``threading.Event``, ``anyio.Event``): when it
            becomes set, a command started by this call is killed.

        Raises
        ------
        ValueError
            The input does not match the schema (the message names the field).
        TimeoutError
            The call took longer than ``timeout_ms`` (it is cancelled; a staged write it began
            does not commit), or a write tool held its file's lock past
            ``write_lock_timeout_ms``.
        FilesystemNotAvailableError, SandboxNotAvailableError
            The provider the tool needs is not configured (or a resolver returned None).
        """
        args = validate_input(self.name, self.spec.accepts or self.input_schema, input)
        ctx = request_context if request_context is not None else RequestContext()
        call = ToolCall(
            args=args,
            options=self._options,
            workspace=self._workspace,
            request_context=ctx,
            tool_call_id=tool_call_id,
            abort_signal=abort_signal,
        )
        self._workspace.touch()
        if self._timeout_ms is None:
            return await self._locked(call, input)
        with anyio.move_on_after(self._timeout_ms / 1000) as scope:
            return await self._locked(call, input)
        if scope.cancelled_caught:
            raise TimeoutError(
                f"{self.name} timed out after {self._timeout_ms:g}ms (timeout_ms in the tools config) and "
                "was abandoned; narrow the request, or raise timeout_ms for this tool"
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _locked(self, call: ToolCall, input: dict[str, Any]) -> ToolResult:
        if not self.spec.locked:
            return await self._hooked(call, input)
        path = call.args["path"]
        async with self._locks.hold(path):
            with anyio.move_on_after(self._lock_timeout_ms / 1000) as scope:
                return await self._hooked(call, input)
        if scope.cancelled_caught:
            raise TimeoutError(f'write-lock timeout on "{path}" after {round(self._lock_timeout_ms)}ms')
        raise AssertionError("unreachable")  # pragma: no cover

    def to_model_output(self, result: Any) -> list[dict[str, str]]:
        """The content parts a model receives for ``result`` (what :meth:`execute` returned).

        Text becomes one text part; the sandbox tools strip ANSI escapes from it (the raw
        result keeps them for a terminal). Media gives its caption and data parts. Anything
        else a ``before_tool_call`` hook answered is sent as JSON text.
        """
        if isinstance(result, ToolMedia):
            return result.to_model_output()
        if result is None:
            text = ""
        elif isinstance(result, str):
            text = strip_ansi(result) if self.spec.needs == "sandbox" else result
        else:
            try:
                text = json.dumps(result)
            except (TypeError, ValueError):
                text = str(result)
        return [{"type": "text", "text": text}]

    async def _hooked(self, call: ToolCall, raw: dict[str, Any]) -> ToolResult:
        ctx = call.request_context
        info = {"tool_name": self.name, "workspace_tool_name": self.spec.name, "input": raw, "context": ctx}
        before = self._hooks.get("before_tool_call")
        if before is not None:
            decision = await _maybe_await(before(dict(info)))
            if isinstance(decision, Mapping) and decision.get("proceed") is False:
                return decision.get("output")  # type: ignore[return-value]
        after = self._hooks.get("after_tool_call")
        try:
            output = await self._tracked(call)
        except BaseException as exc:
            if after is not None and isinstance(exc, Exception):
                await _maybe_await(after({**info, "output": None, "error": exc}))
            raise
        if after is not None:
            await _maybe_await(after({**info, "output": output, "error": None}))
        return output

    async def _tracked(self, call: ToolCall) -> ToolResult:
        args, ctx = call.args, call.request_context
        checkpoint = None
        if checkpoints_enabled(self._checkpoint_config):
            from ._checkpoints import checkpoints_of

            checkpoints = checkpoints_of(self._workspace)
            fs_now = self._workspace.filesystem
            writable = fs_now is not None and not fs_now.read_only
            if self.spec.writes and self.spec.needs == "filesystem":
                if writable:
                    checkpoint = await checkpoints.before_write(
                        self._workspace, quiet_ms_of(self._checkpoint_config), keep_of(self._checkpoint_config)
                    )
            elif (
                self.spec.name == _EXECUTE_COMMAND
                and not args.get("background")
                and writable
                and commands_checkpointed(self._checkpoint_config)
            ):
                # A command may change any file: the checkpoint's record of what it touched
                # is what differs from the checkpoint once it has run.
                command_checkpoint = await checkpoints.before_command(self._workspace, keep_of(self._checkpoint_config))
                try:
                    return await self._run_tracked(call, args, ctx)
                finally:
                    await checkpoints.after_command(command_checkpoint, self._workspace)
            else:
                checkpoints.note_other_call()
        if checkpoint is not None:
            assert fs_now is not None  # a checkpoint is taken of a writable filesystem only
            made = await checkpoints.new_parent(fs_now, args["path"])
            try:
                return await self._run_tracked(call, args, ctx)
            finally:
                await checkpoints.after_write(checkpoint, fs_now, args["path"], made)
        return await self._run_tracked(call, args, ctx)

    async def _run_tracked(self, call: ToolCall, args: dict[str, Any], ctx: RequestContext) -> ToolResult:
        if self.spec.needs == "sandbox":
            call.sandbox = await self._workspace.resolve_sandbox(request_context=ctx)
            if call.sandbox is None:
                raise SandboxNotAvailableError()
            return await self.spec.run(call)
        if self.spec.needs == "workspace":
            return await self.spec.run(call)
        fs = await self._workspace.resolve_filesystem(request_context=ctx)
        if fs is None:
            raise FilesystemNotAvailableError()
        if self.spec.writes and fs.read_only:
            raise WorkspaceReadOnlyError(self.spec.writes)
        call.filesystem = fs
        if self.spec.tracking != "write":
            result = await self.spec.run(call)
            if self.spec.tracking == "read" and call.seen is not None:
                self._tracker.record_read(args["path"], call.seen, _scope(fs))
            if self.spec.writes == "delete":
                await self._workspace._after_tool_write("delete", args["path"], fs)
            return result
        path = args["path"]
        scope = _scope(fs)
        record = self._tracker.get(path, scope)
        call.expected = record.stat if record is not None else None
        policy = self._options.get("require_read_before_write")
        if policy:
            try:
                current: FileStat | None = await fs.stat(path)
            except FileNotFoundError:
                current = None  # a new file can always be written
            if current is not None and await self._policy_applies(policy, args, ctx):
                self._tracker.require_fresh_read(path, current, scope)
        result = await self.spec.run(call)
        # A write consumes the read: editing again needs a fresh read under the policy.
        self._tracker.clear(path)
        await self._workspace._after_tool_write(self.spec.writes or "write_file", path, fs)
        return result

    async def _policy_applies(self, policy: Any, args: dict[str, Any], ctx: RequestContext) -> bool:
        if not callable(policy):
            return bool(policy)
        try:
            return bool(await _maybe_await(policy({"args": args, "request_context": ctx, "workspace": self._workspace})))
        except Exception:
            logger.warning("[Workspace Tools] require_read_before_write function threw; requiring a read", exc_info=True)
            return True

    def __repr__(self) -> str:
        return f"WorkspaceTool(name={self.name!r}, workspace_tool_name={self.spec.name!r})"


async def _enabled(value: Any, ctx: dict[str, Any]) -> bool:
    if not callable(value):
        return bool(value)
    try:
        return bool(await _maybe_await(value(ctx)))
    except Exception:
        # Fail closed: a tool whose availability cannot be decided is not offered.
        logger.warning("[Workspace Tools] Dynamic config function threw, using safe default:", exc_info=True)
        return False


_TOP_KEYS = frozenset(
    {"enabled", "require_approval", "hooks", "write_lock_timeout_ms", "auto_reindex", "timeout_ms", "checkpoints"}
)
_TOOL_KEYS = frozenset(
    {
        "enabled", "require_approval", "name", "require_read_before_write", "max_output_tokens",
        "media_types", "max_media_bytes", "strict", "background", "background_processes",
        "timeout_ms", "match_timeout_ms", "max_file_bytes",
    }
)  # fmt: skip
# Options that configure the wrapper, not the tool: not passed on in ``ToolCall.options``.
_WRAPPER_KEYS = ("enabled", "require_approval", "name", "timeout_ms")
#: Per-tool options that must be positive numbers when given.
_POSITIVE_KEYS = ("match_timeout_ms", "max_file_bytes", "max_output_tokens", "max_media_bytes")
_SWITCHES = ("enabled", "require_approval", "require_read_before_write")


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _check_switches(where: str, options: Mapping[str, Any]) -> None:
    for key in _SWITCHES:
        if key in options and not (isinstance(options[key], bool) or callable(options[key])):
            raise ValueError(f"tools config: {where}{key} must be a bool or a function, got {options[key]!r}")


def _check_background_processes(tool: str, options: Any) -> None:
    from ._sandbox import BACKGROUND_PROCESS_KEYS

    where = f"tools config: {tool}.background_processes"
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(options).__name__}")
    for key, value in options.items():
        if key not in BACKGROUND_PROCESS_KEYS:
            hint = f" (did you mean {_snake(key)!r}?)" if _snake(key) in BACKGROUND_PROCESS_KEYS else ""
            raise ValueError(f"{where}: unknown option {key!r}{hint}")
        if key != "abort_signal" and value is not None and not callable(value):
            raise ValueError(f"{where}.{key} must be a function, got {value!r}")
        if key == "abort_signal" and value not in (None, False) and not callable(getattr(value, "is_set", None)):
            raise ValueError(f"{where}.abort_signal must have is_set() (an Event), None or False, got {value!r}")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def _check_timeout(where: str, value: Any) -> None:
    if value is not None and not _positive(value):
        raise ValueError(
            f"tools config: {where}timeout_ms must be a positive number of milliseconds or None (no limit), "
            f"got {value!r}"
        )


def validate_tools_config(config: Mapping[str, Any]) -> float:
    """Check a tools configuration; return the write-lock timeout in milliseconds.

    Unknown keys are errors rather than silently ignored (a misspelt ``require_approval``
    would otherwise let a tool run unapproved).

    Raises
    ------
    ValueError
        An unknown key or tool name, a switch that is neither bool nor function, or a
        timeout that is not a positive number.
    """
    from ._names import ALL_TOOL_NAMES

    for key, value in config.items():
        if key in _TOP_KEYS:
            continue
        if key not in ALL_TOOL_NAMES:
            hint = f" (did you mean {_snake(key)!r}?)" if _snake(key) in _TOP_KEYS else ""
            raise ValueError(f"tools config: unknown key {key!r}{hint}")
        if not isinstance(value, Mapping):
            raise ValueError(f"tools config: {key} must be a mapping of options, got {type(value).__name__}")
        for option in value:
            if option not in _TOOL_KEYS:
                hint = f" (did you mean {_snake(option)!r}?)" if _snake(option) in _TOOL_KEYS else ""
                raise ValueError(f"tools config: unknown option {option!r} for {key}{hint}")
        _check_switches(f"{key}.", value)
        for option in _POSITIVE_KEYS:
            if option in value and not _positive(value[option]):
                raise ValueError(f"tools config: {key}.{option} must be a positive number, got {value[option]!r}")
        if "timeout_ms" in value:
            if key == _EXECUTE_COMMAND:
                raise ValueError(
                    f"tools config: {key} takes no timeout_ms: a command is bounded by the tool's own "
                    "`timeout` input (and the sandbox's default timeout)"
                )
            _check_timeout(f"{key}.", value["timeout_ms"])
        if "background_processes" in value:
            _check_background_processes(key, value["background_processes"])
    _check_switches("", config)
    if "timeout_ms" in config:
        _check_timeout("", config["timeout_ms"])
    timeout = config.get("write_lock_timeout_ms", DEFAULT_WRITE_LOCK_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"tools config: write_lock_timeout_ms must be a positive number, got {timeout!r}")
    if not isinstance(config.get("auto_reindex", False), bool):
        raise ValueError(f"tools config: auto_reindex must be a bool, got {config['auto_reindex']!r}")
    check_checkpoints_config(config.get("checkpoints", False))
    undo = config.get(WORKSPACE_TOOLS.CHECKPOINTS.UNDO) or {}
    if undo.get("enabled", False) is not False and not checkpoints_enabled(config):
        raise ValueError(
            f"tools config: {WORKSPACE_TOOLS.CHECKPOINTS.UNDO} needs checkpoints to undo: "
            'add "checkpoints": True to the tools config'
        )
    return float(timeout)


#: Longest pause between two write-tool calls of one batch (``checkpoints.quiet_ms``).
DEFAULT_QUIET_MS = 30_000
#: Checkpoints kept for undo (``checkpoints.keep``); older ones' snapshots are deleted.
DEFAULT_KEEP = 20


def check_checkpoints_config(value: Any) -> None:
    """Check ``tools["checkpoints"]``: a bool, or ``{"quiet_ms": positive number, "keep":
    positive int, "commands": bool}`` (any key may be left out).

    Raises
    ------
    ValueError
        Any other value.
    """
    if isinstance(value, bool):
        return
    if isinstance(value, Mapping):
        unknown = set(value) - {"quiet_ms", "keep", "commands"}
        if unknown:
            raise ValueError(
                f"tools config: unknown option {sorted(unknown)[0]!r} for checkpoints "
                "(only 'quiet_ms', 'keep' and 'commands')"
            )
        commands = value.get("commands", True)
        if not isinstance(commands, bool):
            raise ValueError(f"tools config: checkpoints.commands must be True or False, got {commands!r}")
        quiet = value.get("quiet_ms", DEFAULT_QUIET_MS)
        if isinstance(quiet, bool) or not isinstance(quiet, (int, float)) or quiet <= 0:
            raise ValueError(f"tools config: checkpoints.quiet_ms must be a positive number of milliseconds, got {quiet!r}")
        keep = value.get("keep", DEFAULT_KEEP)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"tools config: checkpoints.keep must be a whole number of checkpoints, 1 or more, got {keep!r}")
        return
    raise ValueError(
        "tools config: checkpoints must be True, False or {'quiet_ms': milliseconds, 'keep': count, "
        f"'commands': bool}}, got {value!r}"
    )


def checkpoints_enabled(config: Mapping[str, Any]) -> bool:
    """Whether a (checked) tools configuration turns checkpoints on."""
    value = config.get("checkpoints", False)
    return value is not False


def keep_of(config: Mapping[str, Any]) -> int:
    """How many checkpoints a (checked) tools configuration keeps for undo."""
    value = config.get("checkpoints")
    return int(value.get("keep", DEFAULT_KEEP)) if isinstance(value, Mapping) else DEFAULT_KEEP


def commands_checkpointed(config: Mapping[str, Any]) -> bool:
    """Whether a (checked) tools configuration takes a checkpoint before each command."""
    value = config.get("checkpoints")
    return bool(value.get("commands", True)) if isinstance(value, Mapping) else checkpoints_enabled(config)


def quiet_ms_of(config: Mapping[str, Any]) -> float:
    value = config.get("checkpoints")
    if isinstance(value, Mapping):
        return float(value.get("quiet_ms", DEFAULT_QUIET_MS))
    return float(DEFAULT_QUIET_MS)


async def build_tools(
    workspace: ToolHost, specs: list[ToolSpec], request_context: RequestContext | None
) -> dict[str, WorkspaceTool]:
    """Apply the tools configuration to ``specs`` (already in registration order).

    Raises
    ------
    ValueError
        The configuration has an unknown key or a bad value, or two tools end up with the
        same exposed name.
    """
    config = workspace.get_tools_config() or {}
    timeout = validate_tools_config(config)
    if checkpoints_enabled(config) and workspace.filesystem is None and workspace.has_filesystem_config():
        raise ValueError(
            "tools config: checkpoints need a static filesystem (snapshots are taken of it), "
            "and this workspace resolves its filesystem per request"
        )
    await load_encoding()
    ctx = request_context if request_context is not None else RequestContext()
    enabled_ctx = {"request_context": dict(ctx), "workspace": workspace}
    hooks = config.get("hooks") or {}
    locks, tracker = WriteLocks(), ReadTracker()
    tools: dict[str, WorkspaceTool] = {}
    for spec in specs:
        own = config.get(spec.name) or {}
        enabled = own.get("enabled", config.get("enabled", True) if spec.enabled_by_default else False)
        if not await _enabled(enabled, enabled_ctx):
            continue
        approval = own.get("require_approval", config.get("require_approval", False))
        name = own.get("name") or spec.name
        if name in tools:
            raise ValueError(
                f'Duplicate workspace tool name "{name}": tool "{spec.name}" conflicts with an '
                'already-registered tool. Check your tools config for duplicate "name" values.'
            )
        options = {**spec.defaults, **{k: v for k, v in own.items() if k not in _WRAPPER_KEYS}}
        # A command has its own `timeout` input; every other call gets the wall-clock limit.
        limit = own.get("timeout_ms", config.get("timeout_ms", DEFAULT_TOOL_TIMEOUT_MS))
        if spec.name == _EXECUTE_COMMAND:
            limit = None
        tools[name] = WorkspaceTool(
            spec,
            name=name,
            workspace=workspace,
            options=options,
            require_approval=approval,
            hooks=hooks,
            locks=locks,
            tracker=tracker,
            write_lock_timeout_ms=timeout,
            timeout_ms=limit,
            checkpoint_config=config,
        )
    return tools
