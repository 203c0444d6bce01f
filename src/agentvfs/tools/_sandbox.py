"""The sandbox tools: execute_command, get_process_output, kill_process (reference §13.9-§13.11).

Output of every stream is cut to its last ``tail`` lines, then to the tool's
``max_output_tokens`` keeping the head and the tail of it (the middle is what gets dropped).

A foreground command keeps only the newest :data:`RETAINED_OUTPUT_BYTES` of each stream
(however much it prints: memory and the time spent cutting stay bounded); when more was
printed, the stream's text starts with ``[earlier output dropped: N bytes]``. The reference
keeps everything, then shows at most 200 lines and 2,000 tokens of it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._aio import maybe_await as _maybe_await
from ..errors import SandboxFeatureNotSupportedError
from ..sandbox import RetainedOutputBuffer
from ._core import ToolCall, ToolSpec
from ._names import WORKSPACE_TOOLS
from ._output import DEFAULT_MAX_OUTPUT_TOKENS, apply_tail, apply_token_limit_sandwich
from ._schema import field as schema_field
from ._schema import numeric_field, object_schema

if TYPE_CHECKING:
    from ._host import ToolHost

__all__ = [
    "BACKGROUND_PROCESS_KEYS",
    "DEFAULT_TAIL_LINES",
    "EXECUTE_COMMAND",
    "EXECUTE_COMMAND_BACKGROUND",
    "GET_PROCESS_OUTPUT",
    "KILL_PROCESS",
    "KILL_TAIL_LINES",
    "RESOLVER_HINT",
    "RETAINED_OUTPUT_BYTES",
    "extract_tail_pipe",
]

logger = logging.getLogger("agentvfs")

SB = WORKSPACE_TOOLS.SANDBOX
DEFAULT_TAIL_LINES = 200
KILL_TAIL_LINES = 50
#: Output of a foreground command kept per stream (UTF-8 bytes, the newest): far more than the
#: 200 lines and 2,000 tokens shown, a small fixed cost however much the command prints.
RETAINED_OUTPUT_BYTES = 1 << 20
#: The keys of execute_command's ``background_processes`` option.
BACKGROUND_PROCESS_KEYS = frozenset({"on_stdout", "on_stderr", "on_exit", "abort_signal"})
#: Appended to "process not found" answers when the sandbox comes from a resolver that is not
#: memoised by key: a follow-up call may have been given a different sandbox.
RESOLVER_HINT = (
    " If this process was started from a dynamic sandbox resolver, configure sandbox_cache_key "
    "or have the resolver return the same sandbox for follow-up calls."
)

_TAIL_PIPE = re.compile(r"\|\s*tail\s+(?:-n\s+)?(-?\d+)\s*$")

# Background tasks that report a process's exit (held so they are not garbage collected).
_DETACHED: set[asyncio.Task[None]] = set()


def extract_tail_pipe(command: str) -> tuple[str, int | None]:
    """Split a trailing ``| tail -N`` or ``| tail -n N`` off ``command``.

    Models pipe long output through ``tail``, which holds everything back until the command
    ends; run without the pipe, the output streams live and the tail is applied afterwards.
    Returns the command (unchanged when there is no such pipe, or N is 0) and N.
    """
    match = _TAIL_PIPE.search(command)
    if match is None:
        return command, None
    lines = abs(int(match.group(1)))
    if lines == 0:
        return command, None
    return command[: match.start()].strip(), lines


def _timeout_ms(seconds: float | None) -> int | None:
    if seconds is None or seconds <= 0:
        return None
    return max(1, round(seconds * 1000))


def _token_limit(call: ToolCall) -> int:
    limit = call.options.get("max_output_tokens")
    return DEFAULT_MAX_OUTPUT_TOKENS if limit is None else int(limit)


def _limit(text: str, tail: float | None, tokens: int) -> str:
    """Last ``tail`` lines (None: the default 200, 0: all), then the token sandwich."""
    if not text:
        return ""
    return apply_token_limit_sandwich(
        apply_tail(text, DEFAULT_TAIL_LINES if tail is None else tail), tokens
    )


def _kept(text: str, dropped: int, tail: float | None, tokens: int) -> str:
    """:func:`_limit` of a retained stream, announcing what the retention bound dropped."""
    limited = _limit(text, tail, tokens)
    if not dropped:
        return limited
    return f"[earlier output dropped: {dropped:,} bytes]\n{limited}"


@functools.cache
def _accepts_bound(run: Any) -> bool:
    try:
        parameters = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False
    return "max_retained_bytes" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def _takes_bound(run: Any) -> bool:
    """Whether a sandbox's ``execute_command`` takes ``max_retained_bytes`` (ours does; a
    sandbox of someone else's may not)."""
    return _accepts_bound(getattr(run, "__func__", run))


def _streams(stdout: str, stderr: str) -> str:
    """Both streams labelled, one stream alone (stderr labelled), or nothing."""
    if stdout and stderr:
        return "\n".join(("stdout:", stdout, "", "stderr:", stderr))
    if stdout:
        return stdout
    if stderr:
        return f"stderr:\n{stderr}"
    return ""


def _then(output: str, line: str) -> str:
    """``line`` after ``output`` and one blank line, never adding to blank lines printed.

    Output ending in a blank line already (``\\n\\n``) gets ``line`` right after it, as
    the reference does: the streamed text is never changed, so it is not trimmed either.
    """
    if not output:
        return line
    if output.endswith("\n\n"):
        return output + line
    separator = "\n" if output.endswith("\n") else "\n\n"
    return output + separator + line


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _hint(workspace: ToolHost) -> str:
    return (
        RESOLVER_HINT
        if workspace.has_sandbox_resolver() and not workspace.has_sandbox_cache_key()
        else ""
    )


def _processes(call: ToolCall) -> Any:
    processes = getattr(call.sandbox, "processes", None)
    if processes is None:
        raise SandboxFeatureNotSupportedError("processes")
    return processes


def _start_detached(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``run()`` as a task of the current event loop that outlives the caller (asyncio
    task or trio system task); it is cancelled when the loop ends."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio

        trio.lowlevel.spawn_system_task(run)
        return
    task = loop.create_task(run())
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)


@dataclass
class _Listeners:
    """The ``background_processes`` callbacks of one spawn, told the pid once it is known."""

    config: Mapping[str, Any]
    tool_call_id: str | None
    pid: str | None = None
    # Chunks that arrived before spawn() returned the pid, in arrival order.
    early: list[tuple[str, str]] = field(default_factory=list)

    def stream(self, name: str) -> Callable[[str], Coroutine[Any, Any, None]] | None:
        if self.config.get(name) is None:
            return None

        async def on_chunk(data: str) -> None:
            if self.pid is None:
                self.early.append((name, data))
            else:
                await self._deliver(name, data, self.pid)

        return on_chunk

    async def _deliver(self, name: str, data: str, pid: str) -> None:
        try:
            await _maybe_await(
                self.config[name](data, {"pid": pid, "tool_call_id": self.tool_call_id})
            )
        except Exception:
            logger.warning(
                "[Workspace Tools] background_processes.%s callback failed", name, exc_info=True
            )

    async def started(self, pid: str) -> None:
        # Deliver what came early; chunks arriving meanwhile queue behind it, so order holds.
        while self.early:
            name, data = self.early.pop(0)
            await self._deliver(name, data, pid)
        self.pid = pid


async def _spawn(call: ToolCall, command: str, timeout_ms: int | None, cwd: str | None) -> str:
    processes = _processes(call)
    config: Mapping[str, Any] = call.options.get("background_processes") or {}
    # Not configured: the caller's signal; configured as None or False: no signal.
    abort = config.get("abort_signal", call.abort_signal)
    listeners = _Listeners(config, call.tool_call_id)
    handle = await processes.spawn(
        command,
        cwd=cwd,
        timeout=timeout_ms,
        on_stdout=listeners.stream("on_stdout"),
        on_stderr=listeners.stream("on_stderr"),
        stdin_mode="ignore",
        abort_signal=None if abort is None or abort is False else abort,
    )
    pid = str(handle.pid)
    await listeners.started(pid)
    on_exit = config.get("on_exit")
    if on_exit is not None:

        async def report_exit() -> None:
            try:
                result = await handle.wait()
                info = {
                    "pid": pid,
                    "exit_code": result.exit_code,
                    "stdout": result.stdout,
                    "stderr": result.stderr,
                    "tool_call_id": call.tool_call_id,
                }
                await _maybe_await(on_exit(info))
            except Exception:
                logger.warning(
                    "[Workspace Tools] background_processes.on_exit callback failed", exc_info=True
                )

        _start_detached(report_exit)
    return f"Started background process (PID: {pid})"


async def execute_command(call: ToolCall) -> str:
    """``mastra_workspace_execute_command``."""
    args = call.args
    command: str = args["command"]
    cwd: str | None = args.get("cwd")
    timeout_ms = _timeout_ms(args.get("timeout"))
    if args.get("background"):
        return await _spawn(call, command, timeout_ms, cwd)
    tail: float | None = args.get("tail")
    command, piped = extract_tail_pipe(command)
    if piped is not None:
        tail = piped  # the pipe the model wrote wins over the tail argument
    run = getattr(call.sandbox, "execute_command", None)
    if not callable(run):
        raise SandboxFeatureNotSupportedError("execute_command")
    tokens = _token_limit(call)
    # What arrived so far, for an answer when the call fails midway: bounded like the result.
    stdout = RetainedOutputBuffer(RETAINED_OUTPUT_BYTES)
    stderr = RetainedOutputBuffer(RETAINED_OUTPUT_BYTES)
    bound: dict[str, Any] = {"max_retained_bytes": RETAINED_OUTPUT_BYTES} if _takes_bound(run) else {}
    try:
        result = await run(
            command,
            None,
            timeout=timeout_ms,
            cwd=cwd,
            on_stdout=stdout.append,
            on_stderr=stderr.append,
            abort_signal=call.abort_signal,
            **bound,
        )
    except Exception as exc:
        partial = _streams(
            _kept(stdout.text, stdout.dropped_bytes, tail, tokens),
            _kept(stderr.text, stderr.dropped_bytes, tail, tokens),
        )
        return _then(partial, f"Error: {_message(exc)}")
    output = _streams(
        _kept(result.stdout, getattr(result, "stdout_dropped_bytes", 0), tail, tokens),
        _kept(result.stderr, getattr(result, "stderr_dropped_bytes", 0), tail, tokens),
    )
    if result.success:
        return output or "(no output)"
    return _then(output, f"Exit code: {result.exit_code}")


async def get_process_output(call: ToolCall) -> str:
    """``mastra_workspace_get_process_output``."""
    processes = _processes(call)
    pid: str = call.args["pid"]
    tail: int | None = call.args.get("tail")
    handle = await processes.get(pid)
    if handle is None:
        return f"No background process found with PID {pid}.{_hint(call.workspace)}"
    if call.args.get("wait") and handle.exit_code is None:
        await handle.wait(abort_signal=call.abort_signal)
    running = handle.exit_code is None
    tokens = _token_limit(call)
    output = _streams(_limit(handle.stdout, tail, tokens), _limit(handle.stderr, tail, tokens))
    if running:
        return output or "(no output yet)"
    # A process that has exited shows its exit code, also when it printed nothing (the
    # reference says "(no output yet)" then, as if it still ran). One blank line separates
    # it, whatever the output ends with (unlike execute_command).
    status = f"Exit code: {handle.exit_code}"
    return f"{output}\n\n{status}" if output else status


async def kill_process(call: ToolCall) -> str:
    """``mastra_workspace_kill_process``."""
    processes = _processes(call)
    pid: str = call.args["pid"]
    handle = await processes.get(pid)  # its output, read after the kill
    if not await processes.kill(pid):
        return f"Process {pid} was not found or had already exited.{_hint(call.workspace)}"
    parts = [f"Process {pid} has been killed."]
    if handle is not None:
        tokens = _token_limit(call)
        for name, text in (("stdout", handle.stdout), ("stderr", handle.stderr)):
            if text:
                parts += [
                    "",
                    f"--- {name} (last output) ---",
                    _limit(text, KILL_TAIL_LINES, tokens),
                ]
    return "\n".join(parts)


_EXECUTE_DESCRIPTION = """Run a shell command in the workspace sandbox and return its output.

Examples:
  "npm install && npm run build"
  "ls -la src/"
  "cat config.json | jq '.database'"
  "cd app && python main.py"

Usage:
- The command runs in a shell: pipes, redirects and chaining (&&, ||, ;) work.
- Quote paths that contain spaces (cd "/path/with spaces").
- timeout is in seconds; without it, the sandbox decides how long a command may run.
- cwd overrides the working directory; commands run in the sandbox's directory otherwise.
- Output is cut to its last `tail` lines (200 unless given; 0 keeps everything)."""

_BACKGROUND_DESCRIPTION = f"""{_EXECUTE_DESCRIPTION}

Set background: true for long-running commands (dev servers, watchers): the call returns a PID at \
once. Read the process's output with get_process_output and stop it with kill_process."""

_EXECUTE_FIELDS = {
    "command": schema_field(
        "string",
        'The shell command to run (e.g. "npm test", "ls -la src/", "grep -r TODO src | head")',
    ),
    "timeout": numeric_field("number", "Maximum run time in seconds, e.g. 60 for one minute."),
    "cwd": schema_field(["string", "null"], "Working directory for the command"),
    "tail": numeric_field(
        "number",
        f"For foreground commands: keep only the last N lines of output, like tail -n. Defaults to {DEFAULT_TAIL_LINES}. Use 0 for no limit.",
    ),
}

EXECUTE_COMMAND = ToolSpec(
    name=SB.EXECUTE_COMMAND,
    description=_EXECUTE_DESCRIPTION,
    schema=object_schema(_EXECUTE_FIELDS, ["command"]),
    run=execute_command,
    needs="sandbox",
)

EXECUTE_COMMAND_BACKGROUND = ToolSpec(
    name=SB.EXECUTE_COMMAND,
    description=_BACKGROUND_DESCRIPTION,
    schema=object_schema(
        {
            **_EXECUTE_FIELDS,
            "background": schema_field(
                "boolean",
                "Run the command in the background: returns a PID at once instead of waiting for the "
                "command to finish. Check on it later with get_process_output.",
            ),
        },
        ["command"],
    ),
    run=execute_command,
    needs="sandbox",
)

GET_PROCESS_OUTPUT = ToolSpec(
    name=SB.GET_PROCESS_OUTPUT,
    description="""Get the output so far (stdout, stderr) and the status of a background process by its PID.

Use it after starting a command with execute_command (background: true) to see whether it is still \
running and what it printed. Once a call has reported a process's exit code, the process is gone.""",
    schema=object_schema(
        {
            "pid": schema_field(
                "string", "The PID returned when the background command was started"
            ),
            "tail": numeric_field(
                "integer",
                f"Number of lines to return from the end of each stream, like tail -n (the sign is ignored). Defaults to {DEFAULT_TAIL_LINES}. Use 0 for no limit.",
                nullable=False,
            ),
            "wait": schema_field(
                "boolean",
                "Block until the process exits and return its final output. Useful for short background commands whose result you need.",
            ),
        },
        ["pid"],
    ),
    run=get_process_output,
    needs="sandbox",
)

KILL_PROCESS = ToolSpec(
    name=SB.KILL_PROCESS,
    description=f"""Kill a background process by its PID.

Use it to stop a long-running process started with execute_command (background: true). Returns the \
last {KILL_TAIL_LINES} lines of its output.""",
    schema=object_schema(
        {"pid": schema_field("string", "The PID of the background process to kill")}, ["pid"]
    ),
    run=kill_process,
    needs="sandbox",
)
