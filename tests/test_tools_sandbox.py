"""The sandbox tools (execute_command, get_process_output, kill_process) on a real LocalSandbox:
the reference's golden outputs (acceptance checks 36-44), background processes, callbacks,
dynamic sandboxes and the registration rules."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from _procs import assert_group_gone
from agentvfs import (
    WORKSPACE_TOOLS,
    LocalFilesystem,
    RequestContext,
    SandboxNotAvailableError,
    Workspace,
    WorkspaceTool,
)
from agentvfs.errors import SandboxFeatureNotSupportedError
from agentvfs.sandbox import LocalSandbox
from agentvfs.testing._attacks_tools import TIME_SLACK
from agentvfs.tools._sandbox import RESOLVER_HINT, extract_tail_pipe

pytestmark = pytest.mark.anyio
SB = WORKSPACE_TOOLS.SANDBOX
FS = WORKSPACE_TOOLS.FILESYSTEM
STARTED = re.compile(r"^Started background process \(PID: (\d+)\)$")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workdir(tmp_path: Path) -> str:
    path = tmp_path / "w"
    path.mkdir()
    return str(path)


@asynccontextmanager
async def sandbox_tools(
    workdir: str, config: dict[str, Any] | None = None
) -> AsyncIterator[dict[str, WorkspaceTool]]:
    """Tools of a workspace with a LocalSandbox in ``workdir``; destroyed on exit."""
    ws = Workspace(sandbox=LocalSandbox(working_directory=workdir), tools=config)
    try:
        yield await ws.create_tools()
    finally:
        await ws.destroy()


async def call(tool: WorkspaceTool, args: dict[str, Any], **options: Any) -> str:
    """``tool.execute(args, **options)``, which answers text."""
    answer = await tool.execute(args, **options)
    assert isinstance(answer, str)
    return answer


async def run(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> str:
    return await call(tools[name], args)


async def start(tools: dict[str, WorkspaceTool], command: str, **kwargs: Any) -> str:
    """Start ``command`` in the background; return its pid."""
    answer = await call(
        tools[SB.EXECUTE_COMMAND], {"command": command, "background": True}, **kwargs
    )
    match = STARTED.match(answer)
    assert match, answer
    return match.group(1)


async def poll(
    tools: dict[str, WorkspaceTool], pid: str, done: Callable[[str], bool], **args: Any
) -> str:
    """Ask get_process_output (with ``args``) until ``done(answer)``, for at most 5 s."""
    request_context = args.pop("request_context", None)
    answer = ""
    for _ in range(250):
        answer = await call(
            tools[SB.GET_PROCESS_OUTPUT], {"pid": pid, **args}, request_context=request_context
        )
        if done(answer):
            break
        await anyio.sleep(0.02)
    return answer


async def output_until(
    tools: dict[str, WorkspaceTool], pid: str, expected: str, **args: Any
) -> str:
    """Poll get_process_output until it answers ``expected`` (at most 5 s)."""
    return await poll(tools, pid, lambda answer: answer == expected, **args)


def exact(message: str) -> str:
    """A pattern matching ``message`` and nothing else."""
    return f"^{re.escape(message)}$"


# -- acceptance checks ----------------------------------------------------------------------------------


async def test_check_36_tools_and_sandbox_status(workdir: str) -> None:
    sandbox = LocalSandbox(working_directory=workdir)
    ws = Workspace(sandbox=sandbox)
    try:
        tools = await ws.create_tools()
        assert list(tools) == [SB.EXECUTE_COMMAND, SB.GET_PROCESS_OUTPUT, SB.KILL_PROCESS]
        assert "background" in tools[SB.EXECUTE_COMMAND].input_schema["properties"]
        assert sandbox.status == "pending"
        assert await run(tools, SB.EXECUTE_COMMAND, command="echo hello") == "hello\n"
        assert sandbox.status == "running"
    finally:
        await ws.destroy()


async def test_check_37_output_formats(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        assert await run(t, SB.EXECUTE_COMMAND, command="echo hello") == "hello\n"
        assert await run(t, SB.EXECUTE_COMMAND, command="true") == "(no output)"
        assert await run(t, SB.EXECUTE_COMMAND, command="echo oops 1>&2") == "stderr:\noops\n"
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="echo partial; exit 3")
            == "partial\n\nExit code: 3"
        )
        assert await run(t, SB.EXECUTE_COMMAND, command="exit 2") == "Exit code: 2"
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="echo out; echo err 1>&2")
            == "stdout:\nout\n\n\nstderr:\nerr\n"
        )
        # Output without a final newline still gets exactly one blank line before the code.
        assert await run(t, SB.EXECUTE_COMMAND, command="printf x; exit 1") == "x\n\nExit code: 1"


async def test_check_38_environment_and_cwd(workdir: str) -> None:
    os.mkdir(os.path.join(workdir, "sub"))
    async with sandbox_tools(workdir) as t:
        assert await run(t, SB.EXECUTE_COMMAND, command='echo "HOME=$HOME"') == "HOME=\n"
        assert await run(t, SB.EXECUTE_COMMAND, command="pwd") == f"{workdir}\n"
        assert await run(t, SB.EXECUTE_COMMAND, command="pwd", cwd="sub") == f"{workdir}/sub\n"
        assert await run(t, SB.EXECUTE_COMMAND, command="pwd", cwd=None) == f"{workdir}\n"


async def test_check_39_timeout(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        started = time.monotonic()
        with anyio.fail_after(4):
            answer = await run(t, SB.EXECUTE_COMMAND, command="echo start; sleep 5", timeout=1)
        assert time.monotonic() - started <= 1 + TIME_SLACK
        assert (
            answer
            == "stdout:\nstart\n\n\nstderr:\n\nProcess timed out after 1000ms\n\nExit code: 124"
        )
        assert await run(t, SB.EXECUTE_COMMAND, command="echo quick", timeout="10") == "quick\n"
        assert await run(t, SB.EXECUTE_COMMAND, command="echo quick", timeout=" 2.5 ") == "quick\n"
        with pytest.raises(
            ValueError,
            match=re.escape("field 'timeout' must be a number or a numeric string, got 'soon'"),
        ):
            await run(t, SB.EXECUTE_COMMAND, command="true", timeout="soon")


async def test_a_timeout_ends_the_call_and_what_the_command_left_writing(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        command = "(setsid sh -c 'echo $$ > writer.pid; while :; do echo x; sleep 0.05; done' &); sleep 30"
        started = time.monotonic()
        with anyio.fail_after(10):
            answer = await run(t, SB.EXECUTE_COMMAND, command=command, timeout=1)
        assert time.monotonic() - started <= 1 + TIME_SLACK
        assert answer.startswith("stdout:\nx\n")
        assert answer.endswith("stderr:\n\nProcess timed out after 1000ms\n\nExit code: 124")
        # The writer (the leader of a group of its own) ends with the command: by its cgroup,
        # supervisor or PID namespace.
        await assert_group_gone(int(Path(workdir, "writer.pid").read_text()))


async def test_check_40_tail(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="seq 1 10", tail=3)
            == "[showing last 3 of 10 lines]\n8\n9\n10\n"
        )
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="seq 1 10", tail="3")
            == "[showing last 3 of 10 lines]\n8\n9\n10\n"
        )
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="seq 1 10 | tail -n 2")
            == "[showing last 2 of 10 lines]\n9\n10\n"
        )
        assert (
            await run(t, SB.EXECUTE_COMMAND, command="seq 1 10 | tail -4", tail=1)
            == "[showing last 4 of 10 lines]\n7\n8\n9\n10\n"
        )
        assert (await run(t, SB.EXECUTE_COMMAND, command="seq 1 250")).startswith(
            "[showing last 200 of 250 lines]\n51\n"
        )
        assert await run(t, SB.EXECUTE_COMMAND, command="seq 1 250", tail=0) == "".join(
            f"{i}\n" for i in range(1, 251)
        )
        assert await run(t, SB.EXECUTE_COMMAND, command="seq 1 5", tail=None) == "1\n2\n3\n4\n5\n"


async def test_check_41_token_sandwich(workdir: str) -> None:
    async with sandbox_tools(workdir, {SB.EXECUTE_COMMAND: {"max_output_tokens": 50}}) as t:
        answer = await run(t, SB.EXECUTE_COMMAND, command="seq 1 300", tail=0)
    # tiktoken counts each number and each newline: 600 tokens, head 5 of them.
    assert answer.startswith(
        "1\n2\n3\n[...output truncated — showing first ~5 + last ~45 of ~600 tokens...]\n"
    )
    assert answer.endswith("\n299\n300\n")


async def test_check_42_background_get_and_kill(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        pid = await start(t, "echo bgstart; sleep 30")
        assert await output_until(t, pid, "bgstart\n") == "bgstart\n"
        assert (
            await run(t, SB.KILL_PROCESS, pid=pid)
            == f"Process {pid} has been killed.\n\n--- stdout (last output) ---\nbgstart\n"
        )
        assert (
            await run(t, SB.GET_PROCESS_OUTPUT, pid=pid)
            == f"No background process found with PID {pid}."
        )
        assert (
            await run(t, SB.KILL_PROCESS, pid=pid)
            == f"Process {pid} was not found or had already exited."
        )


async def test_check_43_wait_unknown_and_silent(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        pid = await start(t, "sleep 0.3; echo a; echo b 1>&2; exit 4")
        with anyio.fail_after(5):
            waited = await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, wait=True)
        assert waited == "stdout:\na\n\n\nstderr:\nb\n\n\nExit code: 4"
        # The call that waited saw it running; the next one observes the exit, then it is gone.
        assert await run(t, SB.GET_PROCESS_OUTPUT, pid=pid) == waited
        assert (
            await run(t, SB.GET_PROCESS_OUTPUT, pid=pid)
            == f"No background process found with PID {pid}."
        )
        assert (
            await run(t, SB.GET_PROCESS_OUTPUT, pid="999999")
            == "No background process found with PID 999999."
        )
        assert (
            await run(t, SB.KILL_PROCESS, pid="999999")
            == "Process 999999 was not found or had already exited."
        )
        silent = await start(t, "sleep 30")
        assert await run(t, SB.GET_PROCESS_OUTPUT, pid=silent) == "(no output yet)"
        assert await run(t, SB.KILL_PROCESS, pid=silent) == f"Process {silent} has been killed."


async def test_check_44_ansi_stripped_for_the_model(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        tool = t[SB.EXECUTE_COMMAND]
        raw = await run(t, SB.EXECUTE_COMMAND, command=r"printf '\033[31mred\033[0m\n'")
        assert raw == "\x1b[31mred\x1b[0m\n"
        assert tool.to_model_output(raw) == [{"type": "text", "text": "red\n"}]
        link = "\x1b]8;;https://example.com\x07site\x1b]8;;\x07 \x1b[1;32mok\x1b[K"
        assert tool.to_model_output(link) == [{"type": "text", "text": "site ok"}]
        assert tool.to_model_output(None) == [{"type": "text", "text": ""}]
        assert tool.to_model_output({"blocked": True}) == [
            {"type": "text", "text": '{"blocked": true}'}
        ]


# -- more of execute_command -----------------------------------------------------------------------------


def test_extract_tail_pipe() -> None:
    assert extract_tail_pipe("seq 1 10 | tail -5") == ("seq 1 10", 5)
    assert extract_tail_pipe("seq 1 10|tail -n 7  ") == ("seq 1 10", 7)
    assert extract_tail_pipe("seq 1 10 | tail -n -3") == ("seq 1 10", 3)
    assert extract_tail_pipe("seq 1 10 | tail -0") == ("seq 1 10 | tail -0", None)
    assert extract_tail_pipe("seq 1 10 | tail -n +3") == ("seq 1 10 | tail -n +3", None)
    assert extract_tail_pipe("tail -5 log.txt") == ("tail -5 log.txt", None)
    assert extract_tail_pipe('echo "x | tail -5"') == ('echo "x | tail -5"', None)


class FailingSandbox:
    """A LocalSandbox whose commands stream their output and then fail."""

    provider = "failing"

    def __init__(self, workdir: str) -> None:
        self.inner = LocalSandbox(working_directory=workdir)

    async def execute_command(self, command: str, args: Any = None, **options: Any) -> Any:
        await self.inner.execute_command(command, args, **options)
        raise RuntimeError("connection lost")

    async def destroy(self) -> None:
        await self.inner.destroy()


async def test_thrown_error_keeps_partial_output(workdir: str) -> None:
    sandbox = FailingSandbox(workdir)
    ws = Workspace(sandbox=sandbox)
    try:
        tools = await ws.create_tools()
        assert list(tools) == [SB.EXECUTE_COMMAND]
        assert "background" not in tools[SB.EXECUTE_COMMAND].input_schema["properties"]
        assert (
            await run(tools, SB.EXECUTE_COMMAND, command="echo so far")
            == "so far\n\nError: connection lost"
        )
        assert (
            await run(tools, SB.EXECUTE_COMMAND, command="echo o; echo e >&2")
            == "stdout:\no\n\n\nstderr:\ne\n\nError: connection lost"
        )
        assert await run(tools, SB.EXECUTE_COMMAND, command="true") == "Error: connection lost"
    finally:
        await ws.destroy()  # destroys the LocalSandbox inside too


async def test_foreground_abort_signal_kills_the_command(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        abort = threading.Event()

        async def trip() -> None:
            await anyio.sleep(0.3)
            abort.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(trip)
            with anyio.fail_after(5):
                answer = await call(
                    t[SB.EXECUTE_COMMAND], {"command": "echo begun; sleep 30"}, abort_signal=abort
                )
        assert answer.startswith("begun\n\n")
        assert re.search(r"\n(Exit code: \d+|Error: .+)$", answer), answer


async def test_cancelled_call_kills_the_command(workdir: str) -> None:
    sandbox = LocalSandbox(working_directory=workdir)
    ws = Workspace(sandbox=sandbox)
    try:
        tools = await ws.create_tools()
        with anyio.fail_after(5), anyio.move_on_after(0.3):
            await run(tools, SB.EXECUTE_COMMAND, command="sleep 30")
        assert [p for p in await sandbox.processes.list() if p["running"]] == []
    finally:
        await ws.destroy()


async def test_numeric_strings_and_bad_input(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        pid = await start(t, "seq 1 5; sleep 30")
        assert (
            await output_until(t, pid, "[showing last 2 of 5 lines]\n4\n5\n", tail="2")
            == "[showing last 2 of 5 lines]\n4\n5\n"
        )
        assert (
            await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, tail=-1)
            == "[showing last 1 of 5 lines]\n5\n"
        )
        with pytest.raises(
            ValueError,
            match=re.escape("field 'tail' must be an integer or a string of digits, got '2.5'"),
        ):
            await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, tail="2.5")
        with pytest.raises(ValueError, match=re.escape("field 'pid' must be string")):
            await run(t, SB.KILL_PROCESS, pid=int(pid))
        with pytest.raises(ValueError, match=re.escape("missing required field 'command'")):
            await call(t[SB.EXECUTE_COMMAND], {})
        assert (await run(t, SB.KILL_PROCESS, pid=pid)).startswith(
            f"Process {pid} has been killed.\n\n--- stdout (last output) ---\n1\n"
        )


async def test_kill_shows_last_50_lines_of_each_stream(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        pid = await start(t, "seq 1 60; seq 1 3 >&2; sleep 30")
        expected_err = "1\n2\n3\n"
        await poll(t, pid, lambda answer: answer.endswith("stderr:\n" + expected_err), tail=0)
        answer = await run(t, SB.KILL_PROCESS, pid=pid)
    stdout = "".join(f"{i}\n" for i in range(11, 61))
    assert answer == (
        f"Process {pid} has been killed.\n\n--- stdout (last output) ---\n[showing last 50 of 60 lines]\n{stdout}"
        f"\n\n--- stderr (last output) ---\n{expected_err}"
    )


async def test_exited_without_output_reports_its_code(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        pid = await start(t, "sleep 0.2; exit 5")
        assert await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, wait=True) == "Exit code: 5"


# -- background callbacks and abort -----------------------------------------------------------------------


async def test_background_callbacks(workdir: str) -> None:
    chunks: list[tuple[str, str, dict[str, Any]]] = []
    exits: list[dict[str, Any]] = []
    exited = anyio.Event()

    def on_stdout(data: str, info: dict[str, Any]) -> None:
        chunks.append(("out", data, info))

    async def on_stderr(data: str, info: dict[str, Any]) -> None:
        chunks.append(("err", data, info))

    def on_exit(info: dict[str, Any]) -> None:
        exits.append(info)
        exited.set()

    config = {
        SB.EXECUTE_COMMAND: {
            "background_processes": {
                "on_stdout": on_stdout,
                "on_stderr": on_stderr,
                "on_exit": on_exit,
            }
        }
    }
    async with sandbox_tools(workdir, config) as t:
        pid = await start(t, "echo one; echo two >&2; exit 3", tool_call_id="call-1")
        with anyio.fail_after(5):
            await exited.wait()
        assert exits == [
            {
                "pid": pid,
                "exit_code": 3,
                "stdout": "one\n",
                "stderr": "two\n",
                "tool_call_id": "call-1",
            }
        ]
        assert "".join(d for kind, d, _ in chunks if kind == "out") == "one\n"
        assert "".join(d for kind, d, _ in chunks if kind == "err") == "two\n"
        assert all(info == {"pid": pid, "tool_call_id": "call-1"} for _, _, info in chunks)


async def test_background_abort_signal(workdir: str) -> None:
    # By default a background process ends with the caller's abort signal ...
    async with sandbox_tools(workdir) as t:
        abort = threading.Event()
        pid = await start(t, "sleep 30", abort_signal=abort)
        abort.set()
        with anyio.fail_after(5):
            answer = await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, wait=True)
        assert answer.startswith("Exit code: "), answer
    # ... configured with None it outlives it, and with an event of its own it ends with that.
    own = threading.Event()
    config: dict[str, Any] = {SB.EXECUTE_COMMAND: {"background_processes": {"abort_signal": None}}}
    async with sandbox_tools(workdir, config) as t:
        abort = threading.Event()
        pid = await start(t, "sleep 30", abort_signal=abort)
        abort.set()
        await anyio.sleep(0.3)
        assert await run(t, SB.GET_PROCESS_OUTPUT, pid=pid) == "(no output yet)"
    config = {SB.EXECUTE_COMMAND: {"background_processes": {"abort_signal": own}}}
    async with sandbox_tools(workdir, config) as t:
        pid = await start(t, "sleep 30")
        own.set()
        with anyio.fail_after(5):
            assert (await run(t, SB.GET_PROCESS_OUTPUT, pid=pid, wait=True)).startswith(
                "Exit code: "
            )


async def test_background_processes_config_is_checked(workdir: str) -> None:
    for options, message in (
        ({"onStdout": print}, "unknown option 'onStdout' (did you mean 'on_stdout'?)"),
        ({"on_exit": "log"}, "background_processes.on_exit must be a function"),
        ({"abort_signal": True}, "background_processes.abort_signal must have is_set()"),
        ("yes", "background_processes must be a mapping"),
    ):
        ws = Workspace(
            sandbox=LocalSandbox(working_directory=workdir),
            tools={SB.EXECUTE_COMMAND: {"background_processes": options}},
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            await ws.create_tools()


# -- dynamic sandboxes ----------------------------------------------------------------------------------


async def test_dynamic_sandbox_with_cache_key(tmp_path: Path) -> None:
    made: list[LocalSandbox] = []

    def resolve(ctx: RequestContext) -> LocalSandbox:
        path = tmp_path / str(ctx.get("user"))
        path.mkdir(exist_ok=True)
        made.append(LocalSandbox(working_directory=str(path)))
        return made[-1]

    ws = Workspace(sandbox=resolve, sandbox_cache_key=lambda ctx: ctx.get("user"))
    try:
        tools = await ws.create_tools()
        assert list(tools) == [SB.EXECUTE_COMMAND, SB.GET_PROCESS_OUTPUT, SB.KILL_PROCESS]
        assert "background" in tools[SB.EXECUTE_COMMAND].input_schema["properties"]
        assert made == []  # listing the tools resolves nothing

        def alice() -> RequestContext:
            return RequestContext([("user", "alice")])

        pid = await start(tools, "echo hi; sleep 30", request_context=alice())
        assert await output_until(tools, pid, "hi\n", request_context=alice()) == "hi\n"
        assert len(made) == 1
        bob = await call(
            tools[SB.GET_PROCESS_OUTPUT],
            {"pid": pid},
            request_context=RequestContext([("user", "bob")]),
        )
        assert bob == f"No background process found with PID {pid}."  # a key: no hint
        assert (
            await call(tools[SB.EXECUTE_COMMAND], {"command": "pwd"}, request_context=alice())
        ) == f"{tmp_path}/alice\n"
        killed = await call(tools[SB.KILL_PROCESS], {"pid": pid}, request_context=alice())
        assert killed == f"Process {pid} has been killed.\n\n--- stdout (last output) ---\nhi\n"

        pid = await start(tools, "sleep 30", request_context=alice())
        ws.clear_sandbox_cache("alice")  # forgets the sandbox, does not destroy it
        fresh = await call(tools[SB.GET_PROCESS_OUTPUT], {"pid": pid}, request_context=alice())
        assert fresh == f"No background process found with PID {pid}."
        assert len(made) == 3
        assert await made[0].processes.kill(pid) is True
    finally:
        await ws.destroy()
        for sandbox in made:
            await sandbox.destroy()


async def test_dynamic_sandbox_without_cache_key_hints(tmp_path: Path) -> None:
    made: list[LocalSandbox] = []

    async def resolve(ctx: RequestContext) -> LocalSandbox:
        made.append(LocalSandbox(working_directory=str(tmp_path)))
        return made[-1]

    ws = Workspace(sandbox=resolve)
    try:
        tools = await ws.create_tools()
        ctx = RequestContext()
        pid = await start(tools, "echo same; sleep 30", request_context=ctx)
        # The same request context resolves the same sandbox ...
        assert await output_until(tools, pid, "same\n", request_context=ctx) == "same\n"
        # ... a new one gets a new sandbox, and the answer says why the process is not there.
        other = await call(
            tools[SB.GET_PROCESS_OUTPUT], {"pid": pid}, request_context=RequestContext()
        )
        assert other == f"No background process found with PID {pid}.{RESOLVER_HINT}"
        assert RESOLVER_HINT == (
            " If this process was started from a dynamic sandbox resolver, configure sandbox_cache_key "
            "or have the resolver return the same sandbox for follow-up calls."
        )
        gone = await call(tools[SB.KILL_PROCESS], {"pid": pid}, request_context=RequestContext())
        assert gone == f"Process {pid} was not found or had already exited.{RESOLVER_HINT}"
        assert (await call(tools[SB.KILL_PROCESS], {"pid": pid}, request_context=ctx)).startswith(
            f"Process {pid} has been killed."
        )
    finally:
        await ws.destroy()
        for sandbox in made:
            await sandbox.destroy()


async def test_resolver_without_sandbox() -> None:
    ws = Workspace(sandbox=lambda ctx: None)
    tools = await ws.create_tools()
    with pytest.raises(
        SandboxNotAvailableError, match=exact("Workspace does not have a sandbox configured")
    ):
        await run(tools, SB.EXECUTE_COMMAND, command="true")


# -- registration ---------------------------------------------------------------------------------------


class CommandsOnly:
    """A sandbox that runs commands but has no process manager."""

    provider = "commands"

    async def execute_command(self, command: str, args: Any = None, **options: Any) -> Any:
        raise NotImplementedError


class ProcessesOnly:
    """A sandbox with a process manager but no execute_command."""

    provider = "processes"

    def __init__(self) -> None:
        self.processes = object()


async def test_registration_rules(workdir: str, tmp_path: Path) -> None:
    tools = await Workspace(sandbox=CommandsOnly()).create_tools()
    assert list(tools) == [SB.EXECUTE_COMMAND]
    assert set(tools[SB.EXECUTE_COMMAND].input_schema["properties"]) == {
        "command",
        "timeout",
        "cwd",
        "tail",
    }
    assert "background" not in tools[SB.EXECUTE_COMMAND].description

    tools = await Workspace(sandbox=ProcessesOnly()).create_tools()
    assert list(tools) == [SB.GET_PROCESS_OUTPUT, SB.KILL_PROCESS]

    base = tmp_path / "files"
    base.mkdir()
    ws = Workspace(
        filesystem=LocalFilesystem(str(base)), sandbox=LocalSandbox(working_directory=workdir)
    )
    try:
        tools = await ws.create_tools()
        names = list(tools)
        assert names[: names.index(SB.EXECUTE_COMMAND)] == [
            FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP,
        ]  # fmt: skip
        assert names[-3:] == [SB.EXECUTE_COMMAND, SB.GET_PROCESS_OUTPUT, SB.KILL_PROCESS]
        assert "background: true" in tools[SB.EXECUTE_COMMAND].description
        assert str(base) not in tools[SB.EXECUTE_COMMAND].description  # no path context injected
    finally:
        await ws.destroy()

    assert list(await Workspace(filesystem=LocalFilesystem(str(base))).create_tools()) == [
        FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP,
    ]  # fmt: skip


async def test_config_renames_disables_and_hooks(workdir: str) -> None:
    calls: list[tuple[str, str, Any]] = []

    def before(ctx: dict[str, Any]) -> Any:
        calls.append((ctx["tool_name"], ctx["workspace_tool_name"], ctx["input"]))
        if ctx["input"].get("command") == "rm -rf /":
            return {"proceed": False, "output": "BLOCKED"}
        return None

    config = {
        "hooks": {"before_tool_call": before},
        SB.EXECUTE_COMMAND: {"name": "bash"},
        SB.KILL_PROCESS: {"enabled": False},
        SB.GET_PROCESS_OUTPUT: {"require_approval": True},
    }
    async with sandbox_tools(workdir, config) as t:
        assert list(t) == ["bash", SB.GET_PROCESS_OUTPUT]
        assert t[SB.GET_PROCESS_OUTPUT].require_approval is True
        assert await call(t["bash"], {"command": "rm -rf /"}) == "BLOCKED"
        assert await call(t["bash"], {"command": "echo fine"}) == "fine\n"
    assert calls == [
        ("bash", SB.EXECUTE_COMMAND, {"command": "rm -rf /"}),
        ("bash", SB.EXECUTE_COMMAND, {"command": "echo fine"}),
    ]


async def test_background_on_a_sandbox_without_processes() -> None:
    tools = await Workspace(sandbox=lambda ctx: CommandsOnly()).create_tools()
    with pytest.raises(
        SandboxFeatureNotSupportedError, match=exact("Sandbox does not support processes")
    ):
        await run(tools, SB.EXECUTE_COMMAND, command="sleep 1", background=True)
    with pytest.raises(
        SandboxFeatureNotSupportedError, match=exact("Sandbox does not support processes")
    ):
        await run(tools, SB.GET_PROCESS_OUTPUT, pid="1")
    tools = await Workspace(sandbox=lambda ctx: ProcessesOnly()).create_tools()
    with pytest.raises(
        SandboxFeatureNotSupportedError, match=exact("Sandbox does not support execute_command")
    ):
        await run(tools, SB.EXECUTE_COMMAND, command="true")


# -- adapters -------------------------------------------------------------------------------------------


async def test_mcp_and_openai_adapters(workdir: str) -> None:
    from agentvfs.tools import openai_tools
    from agentvfs.tools._mcp import _annotations, _content

    async with sandbox_tools(workdir) as t:
        hints = {name: _annotations(tool).readOnlyHint for name, tool in t.items()}
        assert hints == {
            SB.EXECUTE_COMMAND: False,
            SB.GET_PROCESS_OUTPUT: True,
            SB.KILL_PROCESS: False,
        }
        raw = await run(t, SB.EXECUTE_COMMAND, command=r"printf '\033[1mbold\033[0m\n'")
        [block] = _content(raw, {}, t[SB.EXECUTE_COMMAND])
        assert block.model_dump()["text"] == "bold\n"
        functions = {f["function"]["name"]: f["function"] for f in openai_tools(t)}
        assert list(functions) == list(t)
        timeout = functions[SB.EXECUTE_COMMAND]["parameters"]["properties"]["timeout"]
        assert [branch["type"] for branch in timeout["anyOf"]] == ["number", "string", "null"]
        assert functions[SB.EXECUTE_COMMAND]["parameters"]["required"] == [
            "command",
            "timeout",
            "cwd",
            "tail",
            "background",
        ]
        # What a strict model sends for the fields it leaves out is accepted as it is.
        answer = await run(
            t,
            SB.EXECUTE_COMMAND,
            command="echo ok",
            timeout=None,
            cwd=None,
            tail=None,
            background=None,
        )
        assert answer == "ok\n"


# -- bounded output -------------------------------------------------------------------------------


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def _reset_peak_rss() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss_kib()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_gigabyte_of_output_costs_tens_of_mib(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        await run(t, SB.EXECUTE_COMMAND, command="true")
        before = _reset_peak_rss()
        answer = await run(t, SB.EXECUTE_COMMAND, command="head -c 1073741824 /dev/zero | tr '\\000' 'a' | fold -w 100")
        grown = _peak_rss_kib() - before
    assert grown < 64 << 10, f"peak RSS grew by {grown >> 10} MiB"
    assert answer.startswith("[earlier output dropped: ")
    assert "[showing last 200 of " in answer
    assert set(answer.splitlines()[-1]) == {"a"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_huge_line_costs_little_event_loop_time(workdir: str) -> None:
    async with sandbox_tools(workdir) as t:
        await run(t, SB.EXECUTE_COMMAND, command="true")
        started = time.thread_time()
        answer = await run(t, SB.EXECUTE_COMMAND, command="head -c 268435456 /dev/zero | tr '\\000' '.'")
        spent = time.thread_time() - started
    # Before the bound: the whole line was tokenized in the event loop (267 s measured).
    assert spent < 10, f"{spent:.1f} s of event-loop CPU"
    assert answer.startswith("[earlier output dropped: ")
    assert "output truncated" in answer


async def test_sandbox_keeps_a_bounded_tail_by_default(workdir: str) -> None:
    sandbox = LocalSandbox(working_directory=workdir)
    try:
        result = await sandbox.execute_command("head -c 20000000 /dev/zero | tr '\\000' x; echo; echo end")
        everything = await sandbox.execute_command("head -c 9000000 /dev/zero | tr '\\000' y", max_retained_bytes=math.inf)
    finally:
        await sandbox.destroy()
    assert result.stdout_truncated and len(result.stdout) == 8 << 20
    assert result.stdout_dropped_bytes == 20_000_005 - (8 << 20)
    assert result.stdout.endswith("x\nend\n")
    assert len(everything.stdout) == 9_000_000 and not everything.stdout_truncated
