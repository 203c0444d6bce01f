"""Process manager: output retention, exit codes, timeouts, kills, dismissal, callbacks, stdin,
and hostile commands (floods, never-ending, stdin readers), under asyncio and trio."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from _procs import assert_group_gone, eventually, live_members
from agentvfs.errors import SandboxExecutionError
from agentvfs.sandbox import LocalProcessManager, ProcessHandle, RetainedOutputBuffer
from agentvfs.sandbox._output import check_max_retained_bytes
from agentvfs.sandbox._processes import _TERM_GRACE_SECONDS
from agentvfs.testing._attacks_tools import TIME_SLACK

pytestmark = pytest.mark.anyio

GIB = 1_000_000_000


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def manager(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> LocalProcessManager:
    # A standalone manager runs commands in the current directory.
    monkeypatch.chdir(tmp_path)
    return LocalProcessManager()





# -- RetainedOutputBuffer -----------------------------------------------------------------------


def test_buffer_keeps_newest_bytes() -> None:
    buf = RetainedOutputBuffer(10)
    buf.write(b"0123456789")
    assert (buf.text, buf.truncated, buf.dropped_bytes) == ("0123456789", False, 0)
    buf.write(b"abcdef")
    assert (buf.text, buf.truncated, buf.dropped_bytes) == ("6789abcdef", True, 6)
    buf.write(b"0123456789ABCDEFGHIJ")  # one write bigger than the whole budget
    assert (buf.text, buf.dropped_bytes, buf.retained_bytes) == ("ABCDEFGHIJ", 26, 10)


def test_buffer_drops_whole_code_points() -> None:
    buf = RetainedOutputBuffer(5)
    buf.write("aé€".encode())  # 1 + 2 + 3 bytes: "a" goes
    assert (buf.text, buf.dropped_bytes) == ("é€", 1)
    buf = RetainedOutputBuffer(4)
    buf.write("aé€".encode())
    # Keeping 4 bytes would split "é"; the whole character goes and "€" (3 bytes) stays.
    assert buf.text == "€"
    assert buf.dropped_bytes == 3
    buf.write("😀".encode())  # 4 bytes: "€" must go entirely
    assert buf.text == "😀"
    assert buf.dropped_bytes == 6
    assert "\ufffd" not in buf.text


def test_buffer_decodes_characters_split_across_writes() -> None:
    buf = RetainedOutputBuffer(math.inf)
    pieces = [buf.write(bytes([b])) for b in "é😀".encode()]
    assert "".join(pieces) == "é😀"
    assert pieces[0] == ""  # nothing until the character is complete
    assert buf.text == "é😀"


def test_buffer_invalid_and_incomplete_bytes_become_replacement_characters() -> None:
    buf = RetainedOutputBuffer()
    assert buf.write(b"ok\xff") == "ok\ufffd"
    assert buf.write(b"\xe2\x82") == ""
    assert buf.flush() == "\ufffd"
    assert buf.text == "ok\ufffd\ufffd"


def test_buffer_unbounded_and_zero() -> None:
    unbounded = RetainedOutputBuffer(math.inf)
    for _ in range(1000):
        unbounded.write(b"x" * 1000)
    assert (len(unbounded.text), unbounded.truncated) == (1_000_000, False)
    nothing = RetainedOutputBuffer(0)
    assert nothing.write(b"abc") == "abc"  # the chunk is still returned for callbacks
    assert (nothing.text, nothing.dropped_bytes) == ("", 3)


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None, math.nan, -math.inf])
def test_max_retained_bytes_validation(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_bytes must be a non-negative integer or math\.inf"):
        RetainedOutputBuffer(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_retained_bytes"):
        check_max_retained_bytes(bad)


def test_max_retained_bytes_accepts_integers_and_inf() -> None:
    assert check_max_retained_bytes(0) == 0
    assert check_max_retained_bytes(1024.0) == 1024
    assert check_max_retained_bytes(math.inf) == math.inf


# -- spawning and results -----------------------------------------------------------------------


async def test_spawn_wait_result(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("echo out; echo err 1>&2; exit 3")
    assert isinstance(handle, ProcessHandle) and handle.pid.isdigit()
    assert handle.command == "echo out; echo err 1>&2; exit 3"
    result = await handle.wait()
    assert (result.success, result.exit_code, result.stdout, result.stderr) == (
        False,
        3,
        "out\n",
        "err\n",
    )
    assert (result.timed_out, result.killed) == (False, False)
    assert handle.exit_code == 3 and handle.stdout == "out\n"
    assert result.execution_time_ms >= 0


async def test_only_path_is_inherited(
    manager: LocalProcessManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = await (await manager.spawn("env", env={"FOO": "bar"})).wait()
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    assert "SECRET_TOKEN" not in names and "HOME" not in names
    assert {"PATH", "FOO"} <= names <= {"PATH", "FOO", "PWD", "SHLVL", "_"}
    assert f"PATH={os.environ['PATH']}" in result.stdout.splitlines()
    assert (await (await manager.spawn('echo "HOME=$HOME"')).wait()).stdout == "HOME=\n"


async def test_env_none_removes_a_variable(manager: LocalProcessManager) -> None:
    result = await (await manager.spawn('echo "[$PATH]"', env={"PATH": None})).wait()
    assert result.stdout.startswith("[")  # sh falls back to its own default PATH
    assert os.environ["PATH"] not in result.stdout


async def test_killed_by_signal_is_exit_128(manager: LocalProcessManager) -> None:
    result = await (await manager.spawn("kill -9 $$")).wait()
    assert (result.exit_code, result.killed, result.success) == (128, True, False)


async def test_timeout_golden_and_group_killed(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("sleep 30 & sleep 30", timeout=300)
    result = await handle.wait()
    assert result.exit_code == 124
    assert (result.stdout, result.stderr) == ("", "\nProcess timed out after 300ms")
    assert (result.timed_out, result.killed, result.success) == (True, True, False)
    assert 250 <= result.execution_time_ms <= 300 + TIME_SLACK * 1000
    await assert_group_gone(int(handle.pid))


async def test_timeout_escalates_when_sigterm_is_ignored(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("trap '' TERM; sleep 30 & sleep 30", timeout=100)
    started = time.monotonic()
    with anyio.fail_after(5):
        result = await handle.wait()
    # The timeout, the grace SIGTERM has before SIGKILL, and no more.
    assert time.monotonic() - started <= 0.1 + _TERM_GRACE_SECONDS + TIME_SLACK
    assert result.exit_code == 124 and result.timed_out
    await assert_group_gone(int(handle.pid))


# A writer in a session of its own, still writing after the command's shell is gone.
WRITER = "(setsid sh -c 'echo $$ > writer.pid; while :; do echo x; sleep 0.05; done' &); sleep 30"


async def test_a_timed_out_command_ends_though_what_it_left_keeps_writing(
    manager: LocalProcessManager, tmp_path: Any
) -> None:
    # Its result waited for the pipes to fall silent, which a writer that left the group
    # never lets happen: the timeout bounded nothing.
    handle = await manager.spawn(WRITER, timeout=300)
    started = time.monotonic()
    try:
        with anyio.fail_after(10):
            result = await handle.wait()
        assert time.monotonic() - started <= 0.3 + TIME_SLACK
        assert result.exit_code == 124 and result.timed_out and result.stdout.startswith("x\n")
    finally:
        # A bare process manager has no cgroup to end the writer with: this test does.
        os.kill(int((tmp_path / "writer.pid").read_text()), 9)


async def test_timeout_message_reaches_stderr_callbacks(manager: LocalProcessManager) -> None:
    seen: list[str] = []
    handle = await manager.spawn("sleep 5", timeout=50, on_stderr=seen.append)
    await handle.wait()
    assert "".join(seen) == "\nProcess timed out after 50ms"


@pytest.mark.parametrize("bad", [-1, "10", math.nan])
async def test_invalid_timeout(manager: LocalProcessManager, bad: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        await manager.spawn("true", timeout=bad)


@pytest.mark.parametrize("bad", [-1, 2.5, "1"])
async def test_invalid_max_retained_bytes_rejected_by_spawn(
    manager: LocalProcessManager, bad: Any
) -> None:
    with pytest.raises(
        ValueError, match=r"max_retained_bytes must be a non-negative integer or math\.inf"
    ):
        await manager.spawn("true", max_retained_bytes=bad)
    assert await manager.list() == []


async def test_retention_limit_and_counts(manager: LocalProcessManager) -> None:
    seen: list[str] = []
    handle = await manager.spawn(
        "printf 0123456789abcdef", max_retained_bytes=10, on_stdout=seen.append
    )
    result = await handle.wait()
    assert (result.stdout, result.stdout_truncated, result.stdout_dropped_bytes) == (
        "6789abcdef",
        True,
        6,
    )
    assert (handle.stdout_truncated, handle.stdout_dropped_bytes) == (True, 6)
    assert "".join(seen) == "0123456789abcdef"  # callbacks see everything


async def test_character_split_across_reads(manager: LocalProcessManager) -> None:
    seen: list[str] = []
    handle = await manager.spawn(
        r"printf '\303'; sleep 0.1; printf '\251\360\237'; sleep 0.1; printf '\230\200\n'"
    )
    result = await handle.wait(on_stdout=seen.append)
    assert result.stdout == "é😀\n"
    assert "".join(seen) == "é😀\n" and "\ufffd" not in "".join(seen)


async def test_missing_cwd_fails_fast(manager: LocalProcessManager, tmp_path: Any) -> None:
    missing = os.path.join(str(tmp_path), "no", "such")
    with anyio.fail_after(5):
        handle = await manager.spawn("echo hi", cwd=missing)
        result = await handle.wait()
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"Cannot run command: working directory does not exist: {missing}"
    assert handle.pid.startswith("failed-")
    assert not await handle.kill()


async def test_relative_cwd_is_below_the_working_directory(
    manager: LocalProcessManager, tmp_path: Any
) -> None:
    os.mkdir(os.path.join(str(tmp_path), "sub"))
    result = await (await manager.spawn("pwd", cwd="sub")).wait()
    assert result.stdout == os.path.join(os.path.realpath(str(tmp_path)), "sub") + "\n"


# -- kill, list, get, dismissal -----------------------------------------------------------------


async def test_kill_kills_the_group(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("echo start; sleep 30 & sleep 30")
    await eventually(lambda: handle.stdout == "start\n")
    assert handle.running and handle.exit_code is None
    assert await handle.kill()
    result = await handle.wait()
    assert (result.exit_code, result.killed, result.stdout) == (128, True, "start\n")
    await assert_group_gone(int(handle.pid))
    assert not await handle.kill()


async def test_list_get_and_dismissal(manager: LocalProcessManager) -> None:
    done = await manager.spawn("echo done")
    running = await manager.spawn("sleep 30")
    await done.wait()
    listing = {p["pid"]: p for p in await manager.list()}
    assert listing[done.pid] == {"pid": done.pid, "running": False, "exit_code": 0}
    assert listing[running.pid] == {"pid": running.pid, "running": True, "exit_code": None}
    # An exited process is returned once more, then it is gone.
    assert await manager.get(done.pid) is done
    assert await manager.get(done.pid) is None
    assert done.pid not in {p["pid"] for p in await manager.list()}
    assert not await manager.kill(done.pid)
    # A running one stays until killed through the manager.
    assert await manager.get(running.pid) is running
    assert await manager.get(running.pid) is running
    assert await manager.kill(running.pid)
    assert running.exit_code == 128
    assert await manager.get(running.pid) is None
    assert not await manager.kill(running.pid)
    assert await manager.list() == []


async def test_unknown_pid(manager: LocalProcessManager) -> None:
    assert await manager.get("999999") is None
    assert await manager.get("not-a-pid") is None
    assert not await manager.kill("999999")


async def test_release(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("true")
    await handle.wait()
    manager.release(handle.pid)
    assert await manager.get(handle.pid) is None


async def test_kill_all_and_children_left_behind(manager: LocalProcessManager) -> None:
    background = await manager.spawn("sleep 30")
    # The shell exits at once; the sleep it started keeps the pipes open. The result is
    # final shortly after the shell's exit, and the sleep is killed by kill_all.
    leaver = await manager.spawn("sleep 30 & echo left")
    with anyio.fail_after(3):
        result = await leaver.wait()
    assert (result.exit_code, result.stdout) == (0, "left\n")
    assert live_members(int(leaver.pid))
    await manager.kill_all()
    assert background.exit_code == 128
    await assert_group_gone(int(background.pid))
    await assert_group_gone(int(leaver.pid))


async def test_kill_all_right_after_a_result_finds_what_it_left_running(
    manager: LocalProcessManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader thread lags after making the result final (a loaded machine): kill_all
    # called at once must still know the group the command left running.
    from agentvfs.sandbox import _processes

    close_stdin = _processes._LocalProcessHandle._close_stdin

    def slow_close_stdin(self: Any) -> None:
        time.sleep(0.5)
        close_stdin(self)

    monkeypatch.setattr(_processes._LocalProcessHandle, "_close_stdin", slow_close_stdin)
    leaver = await manager.spawn("sleep 30 & echo left")
    with anyio.fail_after(3):
        await leaver.wait()
    await manager.kill_all()
    await assert_group_gone(int(leaver.pid))


# -- callbacks ----------------------------------------------------------------------------------


async def test_spawn_callbacks_sync_and_async_without_waiting(manager: LocalProcessManager) -> None:
    out: list[str] = []
    err: list[str] = []

    async def on_stderr(chunk: str) -> None:
        await anyio.lowlevel.checkpoint()
        err.append(chunk)

    handle = await manager.spawn(
        "for i in 1 2 3; do echo o$i; echo e$i 1>&2; done",
        on_stdout=out.append,
        on_stderr=on_stderr,
    )
    # Nobody waits: the callbacks are delivered by a task of their own.
    await eventually(lambda: "".join(out) == "o1\no2\no3\n" and "".join(err) == "e1\ne2\ne3\n")
    result = await handle.wait()
    assert result.stdout == "o1\no2\no3\n"


async def test_wait_returns_after_every_chunk_was_delivered(manager: LocalProcessManager) -> None:
    seen: list[str] = []

    async def slow(chunk: str) -> None:
        await anyio.sleep(0.01)
        seen.append(chunk)

    handle = await manager.spawn(
        "for i in $(seq 1 20); do echo $i; sleep 0.005; done", on_stdout=slow
    )
    result = await handle.wait()
    assert "".join(seen) == result.stdout == "".join(f"{i}\n" for i in range(1, 21))


async def test_wait_callbacks_see_output_while_waiting(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("sleep 0.2; echo later; echo oops 1>&2")
    out: list[str] = []
    err: list[str] = []
    result = await handle.wait(on_stdout=out.append, on_stderr=err.append)
    assert ("".join(out), "".join(err)) == ("later\n", "oops\n")
    assert result.stdout == "later\n"


async def test_failing_callback_is_logged_and_output_continues(
    manager: LocalProcessManager, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(chunk: str) -> None:
        raise RuntimeError("callback broke")

    with caplog.at_level(logging.ERROR, logger="agentvfs.sandbox"):
        handle = await manager.spawn("echo a; sleep 0.05; echo b", on_stdout=broken)
        result = await handle.wait()
    assert result.stdout == "a\nb\n" and result.exit_code == 0
    assert "output callback" in caplog.text and "callback broke" in caplog.text


async def test_cancelled_wait_leaves_the_process_running(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("sleep 0.3; echo finished")
    with anyio.move_on_after(0.05):
        await handle.wait()
    assert handle.running
    assert (await handle.wait()).stdout == "finished\n"


# -- stdin --------------------------------------------------------------------------------------


async def test_stdin_pipe(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("cat; echo end")
    await handle.send_stdin("héllo ")
    await handle.send_stdin(b"bytes")
    await handle.close_stdin()
    await handle.close_stdin()  # idempotent
    result = await handle.wait()
    assert result.stdout == "héllo bytesend\n"
    with pytest.raises(
        SandboxExecutionError, match=f"Process {handle.pid} has already exited with code 0"
    ):
        await handle.send_stdin("late")


async def test_stdin_ignore_returns_immediately(manager: LocalProcessManager) -> None:
    with anyio.fail_after(5):
        # cat reads end-of-file at once; the sleep keeps the process alive while stdin is
        # tried (on an exited process the error is that it has exited).
        handle = await manager.spawn("sleep 1; cat", stdin_mode="ignore")
        with pytest.raises(SandboxExecutionError, match="does not have stdin available"):
            await handle.send_stdin("x")
        result = await handle.wait()
    assert (result.exit_code, result.stdout) == (0, "")


async def test_invalid_stdin_mode(manager: LocalProcessManager) -> None:
    with pytest.raises(ValueError, match="stdin_mode"):
        await manager.spawn("true", stdin_mode="inherit")  # type: ignore[arg-type]


# -- abort signals ------------------------------------------------------------------------------


async def test_spawn_abort_signal_kills(manager: LocalProcessManager) -> None:
    signal = threading.Event()
    handle = await manager.spawn("sleep 30 & sleep 30", abort_signal=signal)
    threading.Timer(0.1, signal.set).start()
    with anyio.fail_after(5):
        result = await handle.wait()
    assert (result.exit_code, result.killed) == (128, True)
    await assert_group_gone(int(handle.pid))


async def test_wait_abort_signal_kills(manager: LocalProcessManager) -> None:
    handle = await manager.spawn("sleep 30")
    signal = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def later() -> None:
            await anyio.sleep(0.1)
            signal.set()

        tg.start_soon(later)
        with anyio.fail_after(5):
            result = await handle.wait(abort_signal=signal)
    assert (result.exit_code, result.killed) == (128, True)


# -- floods -------------------------------------------------------------------------------------


def _peak_rss_reset() -> None:
    # Writing 5 resets the peak resident set size (VmHWM) to the current one.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


async def test_flood_foreground_callbacks_count_every_byte(manager: LocalProcessManager) -> None:
    counted = 0

    def count(chunk: str) -> None:
        nonlocal counted
        counted += len(chunk)

    # Callbacks given to spawn see every chunk; those given to wait() only what arrives
    # while waiting (the reader may be ahead by then).
    handle = await manager.spawn(f"head -c {GIB} /dev/zero", max_retained_bytes=1 << 20, on_stdout=count)
    with anyio.fail_after(30):
        result = await handle.wait()
    assert counted == GIB
    assert result.exit_code == 0 and result.stdout_truncated
    assert len(result.stdout) == 1 << 20 and result.stdout_dropped_bytes == GIB - (1 << 20)
    await assert_group_gone(int(handle.pid))


async def test_flood_in_background_keeps_memory_bounded(manager: LocalProcessManager) -> None:
    _peak_rss_reset()
    before = _rss_kib("VmRSS")
    handle = await manager.spawn(f"head -c {GIB} /dev/zero; echo done 1>&2", stdin_mode="ignore")
    # Nobody awaits it: the I/O thread drains the pipe on its own.
    await eventually(lambda: not handle.running, 30)
    growth_mib = (_rss_kib("VmHWM") - before) / 1024
    assert growth_mib < 100, f"peak memory grew by {growth_mib:.0f} MiB"
    assert handle.exit_code == 0 and handle.stderr == "done\n"
    assert handle.stdout_dropped_bytes == GIB - (1 << 20)
    await assert_group_gone(int(handle.pid))


async def test_slow_callbacks_pause_the_process_instead_of_queueing(
    manager: LocalProcessManager,
) -> None:
    received = 0

    async def slow(chunk: str) -> None:
        nonlocal received
        received += len(chunk)
        await anyio.sleep(0.001)

    _peak_rss_reset()
    before = _rss_kib("VmRSS")
    handle = await manager.spawn("head -c 150000000 /dev/zero", on_stdout=slow)
    with anyio.fail_after(30):
        result = await handle.wait()
    growth_mib = (_rss_kib("VmHWM") - before) / 1024
    assert received == 150_000_000 and result.exit_code == 0
    # Unthrottled, the 150 MB would pile up in the callback queue.
    assert growth_mib < 60, f"peak memory grew by {growth_mib:.0f} MiB"


async def test_output_still_in_the_pipe_at_exit_is_never_cut_off(manager: LocalProcessManager) -> None:
    """A slow consumer: the command has exited long before its last bytes are delivered;
    every byte must still arrive (the drain window counts from the last data, not the exit)."""
    total = 24 << 20
    counted = 0

    def slow(chunk: str) -> None:
        nonlocal counted
        counted += len(chunk)
        time.sleep(0.05)

    handle = await manager.spawn(f"head -c {total} /dev/zero", max_retained_bytes=1 << 16, on_stdout=slow)
    with anyio.fail_after(60):
        result = await handle.wait()
    assert result.exit_code == 0
    assert counted == total
