"""LocalSandbox: lifecycle (lazy start, hooks, stop, destroy), execute_command goldens, env,
cwd, cancellation, instructions, info, mounts, and the Workspace around it (asyncio and trio)."""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

import anyio
import pytest

from _procs import assert_group_gone, eventually, read, write
from agentvfs import LocalFilesystem, RequestContext, Workspace
from agentvfs.errors import SandboxError, SandboxNotReadyError
from agentvfs.sandbox._local import LocalSandbox, shell_quote
from agentvfs.sandbox._records import CommandResult

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def wd(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "wd")





def gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return b") Z" in f.read()
    except FileNotFoundError:
        return True




# -- construction -------------------------------------------------------------------------------


def test_defaults(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sandbox = LocalSandbox()
    assert re.fullmatch(r"local-sandbox-[0-9a-z]+-[0-9a-z]{6}", sandbox.id)
    assert (sandbox.name, sandbox.provider, sandbox.status) == ("LocalSandbox", "local", "pending")
    assert sandbox.working_directory == os.path.join(str(tmp_path), ".sandbox")
    assert sandbox.isolation == "none" and sandbox.timeout is None
    assert sandbox.native_sandbox["allow_network"] is False
    assert not os.path.exists(sandbox.working_directory)  # created on start
    assert LocalSandbox(id="mine").id == "mine"


def test_working_directory_tilde_expanded_but_not_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LocalSandbox(working_directory="~/box").working_directory == os.path.join(
        str(tmp_path), "box"
    )
    assert LocalSandbox(working_directory="rel/box").working_directory == "rel/box"


def test_shell_quote() -> None:
    assert shell_quote("plain-arg_1.2/x=y:z@h") == "plain-arg_1.2/x=y:z@h"
    assert shell_quote("a b") == "'a b'"
    assert shell_quote("it's") == "'it'\\''s'"
    assert shell_quote("$HOME") == "'$HOME'"
    assert shell_quote("") == "''"
    # A trailing newline is not a safe character: unquoted, it would start a second command.
    assert shell_quote("notes.txt\n") == "'notes.txt\n'"
    assert shell_quote("a\nb") == "'a\nb'"


def _script(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


async def test_arguments_cannot_smuggle_a_command(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    _script(os.path.join(wd, "evil.sh"), "echo INJECTED\n")
    result = await sandbox.execute_command("printf", ["[%s]", "x\n", "./evil.sh"])
    assert "INJECTED" not in result.stdout
    assert result.stdout == "[x\n][./evil.sh]"
    await sandbox.destroy()


# -- lifecycle ----------------------------------------------------------------------------------


async def test_lazy_start_on_first_command(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    assert sandbox.status == "pending"
    result = await sandbox.execute_command("echo hello")
    assert result.stdout == "hello\n"
    assert sandbox.status == "running"
    assert os.path.isdir(wd)
    await sandbox.destroy()


async def test_start_outcome_and_hook(wd: str) -> None:
    seen: list[tuple[Any, str]] = []

    async def on_start(ctx: dict[str, Any]) -> None:
        seen.append((ctx["sandbox"], ctx["outcome"]))

    first = LocalSandbox(working_directory=wd, on_start=on_start)
    await first.start()
    await first.start()  # already running: nothing happens
    second = LocalSandbox(working_directory=wd, on_start=on_start)
    await second.start()
    assert seen == [(first, "created"), (second, "connected")]


async def test_concurrent_starts_coalesce(wd: str) -> None:
    calls = 0

    async def on_start(ctx: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)

    sandbox = LocalSandbox(working_directory=wd, on_start=on_start)
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(sandbox.start)
        tg.start_soon(sandbox.execute_command, "true")
    assert calls == 1 and sandbox.status == "running"


async def test_on_start_failure(wd: str) -> None:
    def on_start(ctx: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    sandbox = LocalSandbox(id="sb1", working_directory=wd, on_start=on_start)
    with pytest.raises(SandboxError, match=r"^Sandbox 'sb1' onStart hook failed: boom$"):
        await sandbox.start()
    assert sandbox.status == "error"
    with pytest.raises(SandboxError, match="onStart hook failed"):
        await sandbox.execute_command("true")


async def test_working_directory_that_cannot_be_created(tmp_path: Any) -> None:
    blocker = os.path.join(str(tmp_path), "file")
    write(blocker, "x")
    sandbox = LocalSandbox(working_directory=os.path.join(blocker, "wd"))
    with pytest.raises(OSError):
        await sandbox.start()
    assert sandbox.status == "error"


async def test_destroyed_sandbox_refuses_work(wd: str) -> None:
    sandbox = LocalSandbox(id="gone", working_directory=wd)
    await sandbox.execute_command("true")
    await sandbox.destroy()
    assert sandbox.status == "destroyed"
    await sandbox.destroy()  # idempotent
    with pytest.raises(SandboxError, match=r"^Cannot start a destroyed sandbox$"):
        await sandbox.start()
    with pytest.raises(SandboxNotReadyError, match=r"^Sandbox is not ready: gone$"):
        await sandbox.ensure_running()
    with pytest.raises(SandboxNotReadyError):
        await sandbox.execute_command("true")
    with pytest.raises(SandboxNotReadyError):
        await sandbox.processes.spawn("true")


async def test_destroy_from_pending_skips_hooks(wd: str) -> None:
    calls: list[str] = []
    sandbox = LocalSandbox(working_directory=wd, on_destroy=lambda ctx: calls.append("destroy"))
    await sandbox.destroy()
    assert sandbox.status == "destroyed" and calls == []
    assert not os.path.exists(wd)


class _RecordingMounts:
    """Stands in for the mount manager to see what the lifecycle asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.entries: dict[str, Any] = {}

    async def process_pending(self) -> None:
        self.calls.append("process_pending")

    async def unmount_all(self) -> None:
        self.calls.append("unmount_all")

    def clear(self) -> None:
        self.calls.append("clear")

    def isolation_binds(self) -> list[tuple[str, bool]]:
        return []

    def protected_paths(self) -> list[str]:
        return []


async def test_stop_kills_processes_unmounts_and_restarts_lazily(wd: str) -> None:
    hooks: list[str] = []
    sandbox = LocalSandbox(
        working_directory=wd, on_stop=lambda ctx: hooks.append(ctx["sandbox"].status)
    )
    mounts = _RecordingMounts()
    sandbox.mounts = mounts  # type: ignore[assignment]
    background = await sandbox.processes.spawn("sleep 30")
    left = await sandbox.execute_command("sleep 30 & echo $!")
    orphan = int(left.stdout)
    await sandbox.stop()
    assert sandbox.status == "stopped"
    assert hooks == ["stopping"]
    assert mounts.calls == ["process_pending", "unmount_all"]
    assert background.exit_code == 128
    await assert_group_gone(int(background.pid))
    await eventually(lambda: gone_or_zombie(orphan))
    await sandbox.stop()  # no-op when stopped
    assert hooks == ["stopping"]
    # The next command starts the sandbox again.
    assert (await sandbox.execute_command("echo again")).stdout == "again\n"
    assert sandbox.status == "running"
    assert mounts.calls == ["process_pending", "unmount_all", "process_pending"]
    await sandbox.destroy()
    assert mounts.calls[-2:] == ["unmount_all", "clear"]


async def test_stop_hook_failure_still_kills(wd: str) -> None:
    def on_stop(ctx: dict[str, Any]) -> None:
        raise RuntimeError("stop hook broke")

    sandbox = LocalSandbox(working_directory=wd, on_stop=on_stop)
    handle = await sandbox.processes.spawn("sleep 30")
    with pytest.raises(RuntimeError, match="stop hook broke"):
        await sandbox.stop()
    assert sandbox.status == "error"
    assert handle.exit_code == 128


async def test_destroy_runs_hook_and_keeps_files(wd: str) -> None:
    calls: list[str] = []

    async def on_destroy(ctx: dict[str, Any]) -> None:
        calls.append(ctx["sandbox"].status)

    sandbox = LocalSandbox(working_directory=wd, on_destroy=on_destroy)
    await sandbox.execute_command("echo data > kept.txt")
    handle = await sandbox.processes.spawn("sleep 30")
    await sandbox.destroy()
    assert calls == ["destroying"] and sandbox.status == "destroyed"
    assert handle.exit_code == 128
    assert read(os.path.join(wd, "kept.txt")) == "data\n"


async def test_concurrent_destroys_coalesce(wd: str) -> None:
    calls = 0

    async def on_destroy(ctx: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)

    sandbox = LocalSandbox(working_directory=wd, on_destroy=on_destroy)
    await sandbox.start()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(sandbox.destroy)
    assert calls == 1 and sandbox.status == "destroyed"


async def test_async_context_manager(wd: str) -> None:
    async with LocalSandbox(working_directory=wd) as sandbox:
        assert sandbox.status == "running"
    assert sandbox.status == "destroyed"


# -- execute_command ----------------------------------------------------------------------------


async def test_execute_command_goldens(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    result = await sandbox.execute_command("echo", ["a b", "it's", "$HOME"])
    assert result.command == "echo 'a b' 'it'\\''s' '$HOME'"
    assert result.args == ("a b", "it's", "$HOME")
    assert (result.stdout, result.success, result.exit_code) == ("a b it's $HOME\n", True, 0)

    timed = await sandbox.execute_command("sleep 2", timeout=300)
    assert (timed.success, timed.exit_code, timed.stdout) == (False, 124, "")
    assert timed.stderr == "\nProcess timed out after 300ms"
    assert timed.killed and timed.timed_out
    assert timed.command == "sleep 2" and timed.args == ()

    assert (await sandbox.execute_command('echo "HOME=$HOME"')).stdout == "HOME=\n"
    assert (await sandbox.execute_command("pwd")).stdout == os.path.realpath(wd) + "\n"
    os.mkdir(os.path.join(wd, "sub"))
    assert (await sandbox.execute_command("pwd", cwd="sub")).stdout == os.path.join(
        os.path.realpath(wd), "sub"
    ) + "\n"
    failed = await sandbox.execute_command("echo partial; exit 3")
    assert (failed.exit_code, failed.stdout, failed.success) == (3, "partial\n", False)
    await sandbox.destroy()


async def test_execute_command_releases_the_process(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    result = await sandbox.execute_command("echo $$")
    assert await sandbox.processes.list() == []
    assert await sandbox.processes.get(result.stdout.strip()) is None
    await sandbox.destroy()


async def test_execute_command_streams_to_callbacks(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    out: list[str] = []
    err: list[str] = []

    async def on_stderr(chunk: str) -> None:
        err.append(chunk)

    result = await sandbox.execute_command(
        "echo one; sleep 0.05; echo two; echo bad 1>&2", on_stdout=out.append, on_stderr=on_stderr
    )
    assert "".join(out) == result.stdout == "one\ntwo\n"
    assert "".join(err) == result.stderr == "bad\n"
    await sandbox.destroy()


async def test_execute_command_stdin_is_empty(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    with anyio.fail_after(5):
        result = await sandbox.execute_command("cat")
    assert (result.exit_code, result.stdout) == (0, "")
    await sandbox.destroy()


async def test_execute_command_missing_cwd(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    with anyio.fail_after(5):
        result = await sandbox.execute_command("echo hi", cwd="missing")
    assert result.exit_code == 1
    assert (
        result.stderr
        == f"Cannot run command: working directory does not exist: {os.path.join(os.path.abspath(wd), 'missing')}"
    )
    await sandbox.destroy()


async def test_execute_command_cancelled_kills_the_group(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    pids: list[str] = []
    with anyio.move_on_after(0.3):
        await sandbox.execute_command("echo $$; sleep 30 & sleep 30", on_stdout=pids.append)
    assert pids
    await assert_group_gone(int(pids[0]))
    assert await sandbox.processes.list() == []
    await sandbox.destroy()


async def test_execute_command_abort_signal(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    signal = threading.Event()
    threading.Timer(0.1, signal.set).start()
    with anyio.fail_after(5):
        result = await sandbox.execute_command("sleep 30", abort_signal=signal)
    assert (result.exit_code, result.killed) == (128, True)
    await sandbox.destroy()


async def test_constructor_timeout_is_not_applied(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd, timeout=50)
    assert sandbox.timeout == 50
    result = await sandbox.execute_command("sleep 0.2; echo ok")
    assert (result.exit_code, result.stdout) == (0, "ok\n")
    await sandbox.destroy()


async def test_execute_command_validates_options(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    with pytest.raises(ValueError, match="max_retained_bytes"):
        await sandbox.execute_command("true", max_retained_bytes=-5)
    with pytest.raises(ValueError, match="timeout"):
        await sandbox.execute_command("true", timeout=-1)
    with pytest.raises(TypeError, match="args must be a sequence of strings"):
        await sandbox.execute_command("ls", "-la")
    limited = await sandbox.execute_command("printf 0123456789", max_retained_bytes=4)
    assert (limited.stdout, limited.stdout_truncated, limited.stdout_dropped_bytes) == (
        "6789",
        True,
        6,
    )
    await sandbox.destroy()


async def test_env(wd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    sandbox = LocalSandbox(working_directory=wd, env={"A": "1", "B": "2"})
    sandbox.set_env({"C": "3", "B": None})
    assert sandbox.get_env() == {"A": "1", "C": "3"}
    copy = sandbox.get_env()
    copy["A"] = "changed"
    assert sandbox.get_env()["A"] == "1"
    result = await sandbox.execute_command(
        'echo "$A $B $C $D [$SECRET_TOKEN]"', env={"D": "4", "A": "call"}
    )
    assert result.stdout == "call  3 4 []\n"
    sandbox.set_env(lambda env: {**env, "E": "5"})
    assert (await sandbox.execute_command("echo $E")).stdout == "5\n"
    await sandbox.destroy()


# -- description --------------------------------------------------------------------------------


def test_instructions(wd: str) -> None:
    assert (
        LocalSandbox(working_directory="box").get_instructions()
        == 'Local command execution. Working directory: "box".'
    )
    assert LocalSandbox(instructions="Use bash.").get_instructions() == "Use bash."
    assert LocalSandbox(instructions="").get_instructions() == ""
    ctx = RequestContext({"role": "admin"})
    seen: list[dict[str, Any]] = []

    def custom(opts: dict[str, Any]) -> str:
        seen.append(opts)
        return str(opts["default_instructions"]) + " Be careful."

    sandbox = LocalSandbox(working_directory=wd, instructions=custom)
    assert sandbox.get_instructions(request_context=ctx).endswith(f'"{wd}". Be careful.')
    assert seen[0]["request_context"] is ctx


async def test_info(wd: str) -> None:
    sandbox = LocalSandbox(id="info", working_directory=wd)
    info = await sandbox.get_info()
    assert {k: info[k] for k in ("id", "name", "provider", "status", "last_used_at", "mounts")} == {
        "id": "info",
        "name": "LocalSandbox",
        "provider": "local",
        "status": "pending",
        "last_used_at": None,
        "mounts": {},
    }
    assert info["created_at"] == sandbox.created_at and info["created_at"].tzinfo is not None
    assert info["resources"]["cpu_cores"] == os.cpu_count() and info["resources"]["memory_mb"] > 0
    assert info["metadata"]["working_directory"] == wd
    assert info["metadata"]["isolation"] == "none" and "isolation_config" not in info["metadata"]
    assert set(info["metadata"]) == {"working_directory", "platform", "python_version", "isolation"}
    await sandbox.execute_command("true")
    info = await sandbox.get_info()
    assert info["status"] == "running" and info["last_used_at"] is not None
    await sandbox.destroy()


def test_command_result_to_dict() -> None:
    result = CommandResult(True, 0, "x", "", 5, command="echo x", args=("x",))
    assert result.to_dict()["args"] == ["x"]
    assert result.to_dict()["stdout_dropped_bytes"] == 0


# -- mounts and the workspace -------------------------------------------------------------------


async def test_pending_mounts_are_mounted_on_first_command(wd: str, tmp_path: Any) -> None:
    base = os.path.join(str(tmp_path), "data")
    os.makedirs(base)
    write(os.path.join(base, "hello.txt"), "hi from data\n")
    sandbox = LocalSandbox(working_directory=wd)
    sandbox.mounts.add({"/data": LocalFilesystem(base)})
    assert sandbox.mounts.entries["/data"].state == "pending"
    result = await sandbox.execute_command("cat data/hello.txt")
    assert result.stdout == "hi from data\n"
    info = await sandbox.get_info()
    assert info["mounts"]["/data"]["state"] == "mounted"
    assert re.fullmatch(r"[0-9a-f]{16}", info["mounts"]["/data"]["config_hash"])
    await sandbox.destroy()
    assert not os.path.lexists(os.path.join(wd, "data"))
    assert sandbox.mounts.entries == {}
    assert os.path.exists(os.path.join(base, "hello.txt"))


async def test_workspace_drives_the_lifecycle(wd: str) -> None:
    sandbox = LocalSandbox(working_directory=wd)
    workspace = Workspace(sandbox=sandbox)
    await workspace.init()
    assert sandbox.status == "running"
    assert workspace.get_instructions() == f'Local command execution. Working directory: "{wd}".'
    handle = await sandbox.processes.spawn("sleep 30")
    await workspace.stop()
    assert sandbox.status == "stopped" and handle.exit_code == 128
    await workspace.destroy()
    assert sandbox.status == "destroyed"


async def test_no_isolation_is_said_plainly(wd: str, caplog: pytest.LogCaptureFixture) -> None:
    assert LocalSandbox.__doc__ is not None and "**isolates nothing**" in LocalSandbox.__doc__
    caplog.set_level(logging.WARNING, "agentvfs.sandbox")
    sandbox = LocalSandbox(working_directory=wd)
    await sandbox.start()
    await sandbox.destroy()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("WITHOUT ISOLATION (isolation='none')" in w and "isolation='bwrap'" in w for w in warnings), warnings
