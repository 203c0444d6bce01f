"""Processes of a sandbox: spawning, output retention, waiting and killing.

Threads and event loops
-----------------------
Every spawned process gets one daemon *I/O thread* that reads its stdout and stderr, notices
its exit (a pidfd on Linux), applies the timeout and the abort signal, and closes the handle.
So a process keeps running and its pipes keep draining while nobody awaits it: a command
that writes a gigabyte never blocks on a full pipe, and memory stays bounded by the
retention buffers (:class:`RetainedOutputBuffer`).

Output callbacks always run in an event loop, never in the I/O thread: the thread decodes a
chunk once, appends it to the retention buffer and queues it for every *subscription*; the
subscription's task then calls the callbacks in order (awaiting the async ones).

* Callbacks given to :meth:`SandboxProcessManager.spawn` are delivered by a task started in
  the event loop that called ``spawn`` (an asyncio task or a trio system task), so a
  background process's callbacks run even when nobody waits for it. That task ends when
  the process has closed and every chunk was delivered, or when its event loop ends.
* Callbacks given to :meth:`ProcessHandle.wait` are delivered by the waiting task itself
  and see the output produced while it waits.

A subscription whose callbacks fall more than 8 MiB behind pauses the I/O thread (and so
the process, on its next write) until they catch up: callbacks see every chunk, and slow
callbacks cannot make memory grow without bound. An exception raised by a callback is
logged and does not stop the output.

The loop side learns about new output through a *waker*: the I/O thread schedules
``Event.set`` into the loop with ``call_soon_threadsafe`` (asyncio) or
``TrioToken.run_sync_soon`` (trio), which never blocks the thread.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import fcntl
import inspect
import itertools
import logging
import math
import os
import selectors
import signal
import subprocess
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.to_thread

from ..errors import SandboxExecutionError
from ._groups import format_ms, group_alive, group_is_ours, open_pidfd, signal_group, start_time
from ._loop import OutputCallback, Subscription, Waker, deliver, start_task
from ._output import DEFAULT_MAX_RETAINED_BYTES, RetainedOutputBuffer, check_max_retained_bytes
from ._records import CommandResult
from ._supervisor import KILL_SIGNAL

if TYPE_CHECKING:
    from ._limits import CommandCgroup
    from ._local import LocalSandbox

__all__ = [
    "AbortSignal",
    "LaunchPlan",
    "LocalProcessManager",
    "ProcessHandle",
    "SandboxProcessManager",
]

_log = logging.getLogger("agentvfs.sandbox")



StreamName = Literal["stdout", "stderr"]

_READ_SIZE = 1 << 20
# Linux lets a pipe hold up to /proc/sys/fs/pipe-max-size (1 MiB by default): fewer, larger
# reads for chatty commands.
_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031
# How far (in characters) a subscription's callbacks may fall behind before the I/O thread
# waits for them.
_CALLBACK_BACKLOG = 8 << 20
# After the command's process exits, how long its pipes may stay open (held by a child it
# left running in the background) before the result is final anyway.
_EXIT_DRAIN_SECONDS = 0.2
# After a timeout's SIGTERM, how long the process group has to exit before SIGKILL.
_TERM_GRACE_SECONDS = 1.0
# How often an abort signal is checked.
_ABORT_POLL_SECONDS = 0.05
# Dismissed pids remembered (so a late ``get`` of a released pid stays "not found").
_DISMISSED_MAX = 4096


class AbortSignal(Protocol):
    """Anything with ``is_set()``: :class:`threading.Event`, :class:`anyio.Event`, ..."""

    def is_set(self) -> bool:
        """True once the operation should be aborted."""
        ...


# -- handles ----------------------------------------------------------------------------------------


class ProcessHandle(ABC):
    """A spawned process: its retained output, its exit, and control over it.

    ``stdout``/``stderr`` are the retained output so far (see
    :class:`RetainedOutputBuffer`); ``exit_code`` is None until the process has exited and
    its output is complete. Implementations feed output with :meth:`_emit` (from any
    thread) and end with :meth:`_close`.

    Parameters
    ----------
    pid : str
        The process id as a string.
    max_retained_bytes : int or math.inf
        Output kept per stream.
    on_stdout, on_stderr : callable, optional
        Called with every chunk, from a task of the current event loop (see the module
        documentation).
    """

    def __init__(
        self,
        pid: str,
        *,
        max_retained_bytes: int | float = DEFAULT_MAX_RETAINED_BYTES,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> None:
        self.pid = pid
        #: The command line, set by the process manager.
        self.command: str | None = None
        self._lock = threading.Lock()
        # Signalled when a subscription's backlog shrinks or it goes away.
        self._space = threading.Condition(self._lock)
        self._out = RetainedOutputBuffer(max_retained_bytes)
        self._err = RetainedOutputBuffer(max_retained_bytes)
        self._subs: list[Subscription] = []
        self._wakers: set[Waker] = set()
        self._result: CommandResult | None = None
        self._started = time.monotonic()
        #: True once a timeout fired.
        self.timed_out = False
        #: True once the process was killed (by :meth:`kill`, an abort or a timeout).
        self.killed = False
        if on_stdout is not None or on_stderr is not None:
            sub = Subscription(on_stdout, on_stderr, Waker(), pump=True)
            self._subs.append(sub)
            start_task(lambda: self._pump(sub))

    # -- state ------------------------------------------------------------------------------------

    @property
    def exit_code(self) -> int | None:
        """The exit code; None while the process runs (or its output is still arriving)."""
        result = self._result
        return None if result is None else result.exit_code

    @property
    def running(self) -> bool:
        """Whether the process has not finished yet."""
        return self._result is None

    @property
    def stdout(self) -> str:
        """Retained standard output so far."""
        with self._lock:
            return self._out.text

    @property
    def stderr(self) -> str:
        """Retained standard error so far."""
        with self._lock:
            return self._err.text

    @property
    def stdout_truncated(self) -> bool:
        """Whether older standard output was dropped."""
        return self._out.truncated

    @property
    def stderr_truncated(self) -> bool:
        """Whether older standard error was dropped."""
        return self._err.truncated

    @property
    def stdout_dropped_bytes(self) -> int:
        """UTF-8 bytes of standard output dropped."""
        return self._out.dropped_bytes

    @property
    def stderr_dropped_bytes(self) -> int:
        """UTF-8 bytes of standard error dropped."""
        return self._err.dropped_bytes

    @property
    def result(self) -> CommandResult | None:
        """The final result once the process has finished, else None."""
        return self._result

    # -- control ----------------------------------------------------------------------------------

    @abstractmethod
    async def kill(self) -> bool:
        """Kill the process and everything it started (SIGKILL).

        Returns
        -------
        bool
            False if the process had already finished.
        """

    @abstractmethod
    async def send_stdin(self, data: str | bytes) -> None:
        """Write ``data`` (text is UTF-8 encoded) to the process's standard input.

        Raises
        ------
        SandboxExecutionError
            The process has exited, or has no standard input (spawned with
            ``stdin_mode="ignore"`` or after :meth:`close_stdin`).
        """

    @abstractmethod
    async def close_stdin(self) -> None:
        """Close standard input (the process reads end-of-file); a no-op if already closed."""

    async def wait(
        self,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        abort_signal: AbortSignal | None = None,
    ) -> CommandResult:
        """Wait until the process has finished and its output is complete.

        When this returns, callbacks given to ``spawn`` have seen every chunk (unless their
        event loop ended). Cancelling the wait leaves the process running.

        Parameters
        ----------
        on_stdout, on_stderr : callable, optional
            Called, from this task, with each chunk that arrives while waiting.
        abort_signal : AbortSignal, optional
            When it becomes set, the process is killed (the wait then returns its result).

        Returns
        -------
        CommandResult
        """
        waker = Waker()
        sub = (
            Subscription(on_stdout, on_stderr, waker, pump=False)
            if on_stdout or on_stderr
            else None
        )
        with self._lock:
            self._wakers.add(waker)
            if sub is not None and self._result is None:
                self._subs.append(sub)
        aborted = False
        try:
            while True:
                if sub is not None:
                    await deliver(self._drain(sub))
                with self._lock:
                    result = self._result
                    # Spawn-time subscriptions leave ``_subs`` once they delivered everything.
                    done = (
                        result is not None
                        and (sub is None or not sub.queue)
                        and not any(s.pump for s in self._subs)
                    )
                if done:
                    assert result is not None
                    return result
                if abort_signal is not None and not aborted and abort_signal.is_set():
                    aborted = True
                    await self.kill()
                await waker.wait(
                    _ABORT_POLL_SECONDS if abort_signal is not None and not aborted else None
                )
        finally:
            with self._lock:
                self._wakers.discard(waker)
                if sub is not None and sub in self._subs:
                    self._subs.remove(sub)
                    self._space.notify_all()

    # -- for implementations ----------------------------------------------------------------------

    def _emit(self, stream: StreamName, data: bytes | str) -> None:
        """Add output (bytes are decoded incrementally) and queue it for the callbacks.

        Thread-safe; called by the implementation's reader.
        """
        with self._lock:
            if self._result is not None:
                return
            buffer = self._out if stream == "stdout" else self._err
            if isinstance(data, bytes):
                text = buffer.write(data)
            else:
                buffer.append(data)
                text = data
            if text:
                self._queue_locked(stream, text)

    def _queue_locked(self, stream: StreamName, text: str) -> None:
        for sub in self._subs:
            callback = sub.on_stdout if stream == "stdout" else sub.on_stderr
            if callback is None or sub.dead:
                continue
            sub.queue.append((callback, text))
            sub.backlog += len(text)
            sub.waker.wake()

    def _backlogged(self) -> bool:
        """Whether some subscription's callbacks are too far behind (see module docs)."""
        with self._lock:
            return any(not s.dead and s.backlog > _CALLBACK_BACKLOG for s in self._subs)

    def _wait_for_space(self, timeout: float) -> None:
        """Block (the reader thread) until a backlog shrinks or ``timeout`` seconds pass."""
        with self._lock:
            self._space.wait(timeout)

    def _close(
        self, exit_code: int, *, timed_out: bool = False, killed: bool = False
    ) -> CommandResult:
        """Finish: flush the decoders, fix the result, wake every waiter. Thread-safe."""
        with self._lock:
            if self._result is not None:
                return self._result
            streams: tuple[tuple[StreamName, RetainedOutputBuffer], ...] = (
                ("stdout", self._out),
                ("stderr", self._err),
            )
            for stream, buffer in streams:
                tail = buffer.flush()
                if tail:
                    self._queue_locked(stream, tail)
            self._result = CommandResult(
                success=exit_code == 0,
                exit_code=exit_code,
                stdout=self._out.text,
                stderr=self._err.text,
                execution_time_ms=round((time.monotonic() - self._started) * 1000),
                timed_out=timed_out,
                killed=killed,
                stdout_truncated=self._out.truncated,
                stderr_truncated=self._err.truncated,
                stdout_dropped_bytes=self._out.dropped_bytes,
                stderr_dropped_bytes=self._err.dropped_bytes,
            )
            wakers = [*self._wakers, *(s.waker for s in self._subs)]
            result = self._result
        for waker in wakers:
            waker.wake()
        return result

    def _drain(self, sub: Subscription) -> list[tuple[OutputCallback, str]]:
        with self._lock:
            items = list(sub.queue)
            sub.queue.clear()
            if sub.backlog:
                sub.backlog = 0
                self._space.notify_all()
            return items

    async def _pump(self, sub: Subscription) -> None:
        try:
            while True:
                await deliver(self._drain(sub))
                with self._lock:
                    finished = self._result is not None and not sub.queue
                if finished:
                    return
                await sub.waker.wait()
        finally:
            with self._lock:
                sub.dead = True
                sub.queue.clear()
                if sub in self._subs:
                    self._subs.remove(sub)
                self._space.notify_all()
                wakers = list(self._wakers)
            for waker in wakers:
                waker.wake()

    def __repr__(self) -> str:
        state = "running" if self._result is None else f"exit_code={self._result.exit_code}"
        return f"<{type(self).__name__} pid={self.pid} {state} command={self.command!r}>"


# Managers whose processes are killed at interpreter exit.
_MANAGERS: weakref.WeakSet[LocalProcessManager] = weakref.WeakSet()


@atexit.register
def _kill_everything_at_exit() -> None:
    # A script that ends without stop()/destroy() must not leave commands running.
    for manager in list(_MANAGERS):
        with contextlib.suppress(Exception):
            manager.kill_all_now()


class _LocalProcessHandle(ProcessHandle):
    """A process on this machine, in a process group of its own, with one I/O thread."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes] | None,
        pid: str,
        *,
        timeout_ms: float | None,
        abort_signal: AbortSignal | None,
        max_retained_bytes: int | float,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        on_linger: Callable[[int, int | None], None] | None = None,
        plan: LaunchPlan | None = None,
    ) -> None:
        super().__init__(
            pid, max_retained_bytes=max_retained_bytes, on_stdout=on_stdout, on_stderr=on_stderr
        )
        self._proc = proc
        self._cgroup = plan.cgroup if plan is not None else None
        self._supervised = plan.supervised if plan is not None else False
        self._cleanup = plan.cleanup if plan is not None else None
        self._timeout_ms = timeout_ms
        self._deadline = None if not timeout_ms else self._started + timeout_ms / 1000
        self._abort = abort_signal
        self._on_linger = on_linger
        self._leader_start = start_time(proc.pid) if proc is not None else None
        self._term_at: float | None = None
        self._escalated = False
        self._stdin_lock = threading.Lock()
        self._stdin: int | None = (
            proc.stdin.fileno() if proc is not None and proc.stdin is not None else None
        )

    def _start_io(self) -> None:
        thread = threading.Thread(
            target=self._io_main, name=f"agentvfs-process-{self.pid}", daemon=True
        )
        thread.start()

    def _fail(self, message: str) -> None:
        """The process could not be started: ``message`` goes to stderr, exit code 1."""
        self._emit("stderr", message)
        self._close(1)

    # -- control (event loop side) ----------------------------------------------------------------

    def kill_now(self) -> bool:
        """Synchronous :meth:`kill` (usable in ``finally`` blocks and at exit)."""
        if self._result is not None or self._proc is None:
            return False
        self.killed = True
        self._signal(signal.SIGKILL)
        return True

    async def kill(self) -> bool:
        """Kill the process group (SIGKILL; the process itself if the group is gone).

        Returns
        -------
        bool
            False if the process had already finished.
        """
        return self.kill_now()

    def _signal(self, sig: int) -> None:
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid
        if self._supervised and sig == signal.SIGKILL and proc.returncode is None:
            # The supervisor kills every descendant, session leaders included, then itself;
            # a SIGKILL would leave its orphans to init.
            with contextlib.suppress(OSError):
                proc.send_signal(KILL_SIGNAL)
            return
        if sig == signal.SIGKILL and self._cgroup is not None:
            # Processes of the command that left its group (setsid) are still in its cgroup;
            # one pass here, the I/O thread finishes the job once the leader is gone.
            for member in self._cgroup.pids():
                with contextlib.suppress(OSError):
                    os.kill(member, signal.SIGKILL)
        # Until the leader is reaped its pid names our group; afterwards check it still does.
        if (proc.returncode is None or group_is_ours(pgid, self._leader_start)) and signal_group(
            pgid, sig
        ):
            return
        with contextlib.suppress(OSError):
            proc.send_signal(sig)  # a no-op once reaped

    async def send_stdin(self, data: str | bytes) -> None:
        """Write ``data`` to standard input (text is UTF-8 encoded).

        Raises
        ------
        SandboxExecutionError
            The process has exited or has no standard input.
        """
        if self._result is not None:
            raise SandboxExecutionError(
                f"Process {self.pid} has already exited with code {self._result.exit_code}",
                {"pid": self.pid},
            )
        if self._stdin is None:
            raise SandboxExecutionError(
                f"Process {self.pid} does not have stdin available", {"pid": self.pid}
            )
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        await anyio.to_thread.run_sync(self._write_stdin, payload, abandon_on_cancel=True)

    def _write_stdin(self, payload: bytes) -> None:
        with self._stdin_lock:
            fd = self._stdin
            if fd is None:
                raise SandboxExecutionError(
                    f"Process {self.pid} does not have stdin available", {"pid": self.pid}
                )
            view = memoryview(payload)
            try:
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError as exc:
                raise SandboxExecutionError(
                    f"Cannot write to stdin of process {self.pid}: {exc.strerror or exc}",
                    {"pid": self.pid},
                ) from exc

    async def close_stdin(self) -> None:
        """Close standard input (a no-op if it is closed already)."""
        await anyio.to_thread.run_sync(self._close_stdin, abandon_on_cancel=True)

    def _close_stdin(self) -> None:
        with self._stdin_lock:
            fd, self._stdin = self._stdin, None
            proc = self._proc
            if fd is not None and proc is not None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()

    # -- the I/O thread ---------------------------------------------------------------------------

    def _io_main(self) -> None:
        try:
            self._io_loop()
        except BaseException:  # pragma: no cover - a bug here must not leave waiters hanging
            _log.exception("I/O thread of process %s failed", self.pid)
            self._signal(signal.SIGKILL)
            self._close(1, killed=True)
        finally:
            self._finish()

    def _finish(self) -> None:
        """After the command and its output: an empty cgroup is removed."""
        if self._cleanup is not None:
            try:
                self._cleanup()
            except Exception:  # pragma: no cover - cleanup is best effort
                _log.warning("cleanup after process %s failed", self.pid, exc_info=True)

    def _check_deadlines(self, now: float) -> None:
        if self._deadline is not None and not self.timed_out and now >= self._deadline:
            self.timed_out = True
            self.killed = True
            self._term_at = now
            self._signal(signal.SIGTERM)
        if (
            self._term_at is not None
            and not self._escalated
            and now >= self._term_at + _TERM_GRACE_SECONDS
        ):
            # The group ignored SIGTERM; a timeout must end the command all the same.
            self._escalated = True
            self._signal(signal.SIGKILL)
        if self._abort is not None and self._abort.is_set():
            self._abort = None
            self.kill_now()

    def _next_wakeup(self, now: float, exited_at: float | None, polling: bool) -> float | None:
        candidates: list[float] = []
        if exited_at is not None:
            candidates.append(exited_at + _EXIT_DRAIN_SECONDS - now)
        else:
            if self._deadline is not None and not self.timed_out:
                candidates.append(self._deadline - now)
            if self._term_at is not None and not self._escalated:
                candidates.append(self._term_at + _TERM_GRACE_SECONDS - now)
            if self._abort is not None or polling:
                candidates.append(_ABORT_POLL_SECONDS)
        return max(0.0, min(candidates)) if candidates else None

    def _io_loop(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        selector = selectors.DefaultSelector()
        streams: dict[int, StreamName] = {
            proc.stdout.fileno(): "stdout",
            proc.stderr.fileno(): "stderr",
        }
        for fd, name in streams.items():
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
            selector.register(fd, selectors.EVENT_READ, name)
        pidfd = open_pidfd(proc.pid)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ, "exit")
        exited_at: float | None = None
        last_data = 0.0
        try:
            while True:
                now = time.monotonic()
                if exited_at is None:
                    self._check_deadlines(now)
                    if pidfd is None and proc.poll() is not None:
                        exited_at = now
                # After the exit, read until the pipes close or stay silent for the drain
                # time (a background child may hold them open); data still arriving, even
                # slowly on a loaded machine, is never cut off.
                # The check follows a select that found nothing to read, so a reader thread
                # starved of CPU never mistakes its own delay for silence.
                quiet_since = max(exited_at, last_data) if exited_at is not None else None
                if quiet_since is not None and not streams:
                    break
                if (
                    self.killed
                    and exited_at is not None
                    and time.monotonic() - exited_at >= _EXIT_DRAIN_SECONDS
                ):
                    # Killed (a timeout, an abort): its result is due now, even if something
                    # it started in a session of its own (in its cgroup, killed below) keeps
                    # writing; waiting for silence would let the call outlive its timeout.
                    break
                events = selector.select(self._next_wakeup(now, quiet_since, pidfd is None))
                if (
                    not events
                    and quiet_since is not None
                    and time.monotonic() - quiet_since >= _EXIT_DRAIN_SECONDS
                ):
                    break
                for key, _ in events:
                    if key.data == "exit":
                        proc.wait()
                        exited_at = time.monotonic()
                        selector.unregister(key.fd)
                        continue
                    try:
                        data = os.read(key.fd, _READ_SIZE)
                    except OSError:
                        data = b""
                    if not data:
                        selector.unregister(key.fd)
                        del streams[key.fd]
                        continue
                    self._emit(key.data, data)
                    while self._backlogged():
                        self._check_deadlines(time.monotonic())
                        self._wait_for_space(_ABORT_POLL_SECONDS)
                    last_data = time.monotonic()
            if proc.returncode is None:
                proc.wait()
            returncode = proc.returncode
            if self.timed_out:
                self._emit(
                    "stderr", f"\nProcess timed out after {format_ms(self._timeout_ms or 0)}ms"
                )
                exit_code = 124
            elif returncode < 0 or (self.killed and returncode > 128):
                # Killed by a signal: the command itself, or (bubblewrap, the supervisor)
                # the command under a wrapper that reports its death as 128 + the signal,
                # when the kill reached the command before the wrapper.
                exit_code = 128
            else:
                exit_code = returncode
            killed = self.killed or returncode < 0
            if self.killed and self._cgroup is not None:
                # A killed or timed-out command ends whole, what left its group included.
                self._cgroup.kill()
            lingering = bool(streams) or group_alive(proc.pid)
            if lingering and self._on_linger is not None:
                # Children left running in the background keep the group; ``kill_all`` ends it.
                # Noted before the result is final: a caller that waited for it and then
                # calls ``kill_all`` must find the group.
                self._on_linger(proc.pid, self._leader_start)
            self._close(exit_code, timed_out=self.timed_out, killed=killed)
            self._close_stdin()
            # Output of such children is read and discarded until they close the pipes, so
            # they never block on a full pipe (and never die of SIGPIPE).
            while streams:
                for key, _ in selector.select():
                    try:
                        data = os.read(key.fd, _READ_SIZE)
                    except OSError:
                        data = b""
                    if not data:
                        selector.unregister(key.fd)
                        del streams[key.fd]
        finally:
            selector.close()
            for pipe in (proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    pipe.close()
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(pidfd)


@dataclass
class LaunchPlan:
    """How to start one command: what a sandbox's ``launch()`` gives the process manager.

    Attributes
    ----------
    argv : list of str
        What to execute (an absolute path or a name on ``PATH`` first).
    env : dict
        Variables added to the command's environment.
    pass_fds : tuple of int
        Descriptors the new process inherits; this process closes them once it started.
    gate : callable, optional
        ``gate(pid)``, called right after the start (in the spawning thread): puts the process
        in its cgroup, sets its rlimits and lets it go on. An ``OSError`` kills the process
        and the command fails with the message.
    cgroup : CommandCgroup, optional
        The command's cgroup: a kill of the command kills everything in it.
    supervised : bool
        The first process is a supervisor (:mod:`._supervisor`): it is never sent
        ``SIGKILL`` (its orphans would go to init) but :data:`~._supervisor.KILL_SIGNAL`.
    withheld : frozenset of str
        Variables of the command's environment the first process must not get: it runs on
        the host (bubblewrap), and the plan hands them to the command another way.
    cleanup : callable, optional
        Called once the command and its output have ended (removes an empty cgroup).
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    gate: Callable[[int], None] | None = None
    cgroup: CommandCgroup | None = None
    supervised: bool = False
    withheld: frozenset[str] = frozenset()
    cleanup: Callable[[], None] | None = None

    def close_fds(self) -> None:
        """Close the descriptors meant for the new process (idempotent)."""
        fds, self.pass_fds = self.pass_fds, ()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def abandon(self) -> None:
        """Release everything of a plan whose process never started."""
        self.close_fds()
        if self.cleanup is not None:
            with contextlib.suppress(Exception):
                self.cleanup()


_spawner_lock = threading.Lock()
_spawner_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that start processes. They live as long as this process: a child that
    asks to die with its parent (``PR_SET_PDEATHSIG``: bubblewrap's ``--die-with-parent``,
    the supervisor) is told of the death of the *thread* that started it, and a worker thread
    of the event loop's pool may end while the child runs."""
    global _spawner_pool
    with _spawner_lock:
        if _spawner_pool is None:
            _spawner_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="agentvfs-spawn"
            )
        return _spawner_pool


def _popen(
    plan: LaunchPlan, cwd: str, env: dict[str, str], stdin_mode: str
) -> subprocess.Popen[bytes] | str:
    """Start a process in a new session (so a new process group) and pass its gate; a str
    says why it could not."""
    if not os.path.isdir(cwd):
        plan.abandon()
        return f"Cannot run command: working directory does not exist: {cwd}"
    try:
        proc = subprocess.Popen(
            plan.argv,
            cwd=cwd,
            env={key: value for key, value in {**env, **plan.env}.items() if key not in plan.withheld},
            stdin=subprocess.PIPE if stdin_mode == "pipe" else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=plan.pass_fds,
            bufsize=0,
        )
    except OSError as exc:
        plan.abandon()
        where = f": {exc.filename}" if exc.filename else ""
        return f"Cannot run command: {exc.strerror or exc}{where}"
    plan.close_fds()
    if plan.gate is not None:
        try:
            plan.gate(proc.pid)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if plan.cleanup is not None:
                with contextlib.suppress(Exception):
                    plan.cleanup()
            return f"Cannot run command: {exc.strerror or exc}"
    return proc


# -- managers ----------------------------------------------------------------------------------------


class SandboxProcessManager(ABC):
    """Spawns and tracks a sandbox's processes.

    ``spawn``, ``list`` and ``get`` first make sure the sandbox runs (the first command
    starts it). A process stays tracked until it is released: :meth:`release`, a
    :meth:`kill` through the manager, or a :meth:`get` that finds it finished -- an exited
    process can be fetched exactly once more, after which it is "not found".

    Parameters
    ----------
    env : mapping, optional
        Variables given to every process (under the sandbox's and the call's).
    """

    def __init__(self, *, env: Mapping[str, str] | None = None) -> None:
        self.env: dict[str, str] = dict(env or {})
        #: The owning sandbox (set by the sandbox), or None for a standalone manager.
        self.sandbox: Any = None
        self._tracked: dict[str, ProcessHandle] = {}
        self._dismissed: OrderedDict[str, None] = OrderedDict()

    async def spawn(
        self,
        command: str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (milliseconds the process may run)
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        stdin_mode: Literal["pipe", "ignore"] = "pipe",
        max_retained_bytes: int | float = DEFAULT_MAX_RETAINED_BYTES,
        abort_signal: AbortSignal | None = None,
    ) -> ProcessHandle:
        """Start ``command`` through ``sh -c`` and return its handle at once.

        Parameters
        ----------
        command : str
            A shell command line.
        cwd : str, optional
            Working directory: the sandbox's by default; a relative one is resolved
            against the sandbox's working directory.
        env : mapping, optional
            Extra variables (a None value removes one). Only ``PATH`` comes from this
            process's environment.
        timeout : float, optional
            Milliseconds; then the process group gets SIGTERM (SIGKILL a second later if it
            is still there) and the result has exit code 124. None or 0: no limit.
        on_stdout, on_stderr : callable, optional
            Called with every decoded chunk, sync or async, from a task of this event loop.
        stdin_mode : {"pipe", "ignore"}
            ``"ignore"`` gives the process an empty standard input (``cat`` returns at once).
        max_retained_bytes : int or math.inf
            Output kept per stream (the newest); default 1 MiB.
        abort_signal : AbortSignal, optional
            When it becomes set, the process group is killed.

        Returns
        -------
        ProcessHandle

        Raises
        ------
        ValueError
            An invalid ``max_retained_bytes``, ``timeout`` or ``stdin_mode``.
        SandboxNotReadyError
            The sandbox was destroyed.
        """
        max_bytes = check_max_retained_bytes(max_retained_bytes)
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, not {type(command).__name__}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise ValueError(
                f"timeout must be a non-negative number of milliseconds, got {timeout!r}"
            )
        if stdin_mode not in ("pipe", "ignore"):
            raise ValueError(f"stdin_mode must be 'pipe' or 'ignore', got {stdin_mode!r}")
        merged: dict[str, str | None] = {}
        if self.sandbox is not None:
            await self.sandbox.ensure_running()
            merged.update(self.sandbox.get_env())
        merged.update(env or {})
        handle = await self._spawn(
            command,
            cwd=os.fspath(cwd) if cwd is not None else None,
            env=merged,
            timeout=timeout if timeout and not math.isinf(timeout) else None,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            stdin_mode=stdin_mode,
            max_retained_bytes=max_bytes,
            abort_signal=abort_signal,
        )
        handle.command = command
        self._tracked[handle.pid] = handle
        self._dismissed.pop(handle.pid, None)
        return handle

    @abstractmethod
    async def _spawn(
        self,
        command: str,
        *,
        cwd: str | None,
        env: dict[str, str | None],
        timeout: float | None,  # noqa: ASYNC109
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        stdin_mode: Literal["pipe", "ignore"],
        max_retained_bytes: int | float,
        abort_signal: AbortSignal | None,
    ) -> ProcessHandle:
        """Start the process (arguments validated, sandbox running, env merged)."""

    async def _find(self, pid: str) -> ProcessHandle | None:
        """Look up a pid that is not tracked (e.g. ask a remote sandbox); None by default."""
        return None

    async def list(self) -> list[dict[str, Any]]:
        """The tracked processes: ``[{"pid", "running", "exit_code"}]``."""
        if self.sandbox is not None:
            await self.sandbox.ensure_running()
        return [
            {"pid": pid, "running": handle.exit_code is None, "exit_code": handle.exit_code}
            for pid, handle in self._tracked.items()
        ]

    async def get(self, pid: str) -> ProcessHandle | None:
        """The handle of ``pid``, or None if unknown or dismissed.

        A handle that has finished is released by this call: it is returned this once,
        and later calls return None.
        """
        if self.sandbox is not None:
            await self.sandbox.ensure_running()
        pid = str(pid)
        if pid in self._dismissed:
            return None
        handle = self._tracked.get(pid) or await self._find(pid)
        if handle is not None and handle.exit_code is not None:
            self.release(pid)
        return handle

    async def kill(self, pid: str) -> bool:
        """Kill ``pid`` (its whole process group), wait for it to finish, and release it.

        Returns
        -------
        bool
            False if the process is unknown or had already finished.
        """
        pid = str(pid)
        handle = await self.get(pid)
        if handle is None:
            return False
        killed = await handle.kill()
        if killed:
            with anyio.move_on_after(10):
                await handle.wait()
        self.release(pid)
        return killed

    def release(self, pid: str) -> None:
        """Stop tracking ``pid``; later lookups return None."""
        pid = str(pid)
        self._tracked.pop(pid, None)
        self._dismissed[pid] = None
        while len(self._dismissed) > _DISMISSED_MAX:
            self._dismissed.popitem(last=False)

    async def kill_all(self) -> None:
        """Kill every running tracked process and wait (up to 10 s) for them to finish.

        Their handles stay tracked, so their output can still be fetched.
        """
        running = [handle for handle in self._tracked.values() if handle.exit_code is None]
        for handle in running:
            await handle.kill()
        with anyio.move_on_after(10):
            for handle in running:
                await handle.wait()


class LocalProcessManager(SandboxProcessManager):
    """Runs processes on this machine, each in a process group of its own.

    Without isolation a command runs as ``/bin/sh -c <command>``; with the sandbox's
    isolation (bubblewrap) it runs as ``bwrap ... -- sh -c <command>``. The environment is
    ``{"PATH": <this process's PATH>, **manager env, **sandbox env, **call env}`` and
    nothing else. Killing a process kills its group (SIGKILL). Children a command leaves
    running in the background are killed by :meth:`kill_all` (``sandbox.stop()``) and at
    interpreter exit.

    Parameters
    ----------
    env : mapping, optional
        Variables given to every process.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env=env)
        self._spawn_errors = itertools.count(1)
        # Process groups left running by finished commands: pgid -> leader start time.
        self._lingering: dict[int, int | None] = {}
        self._lingering_lock = threading.Lock()
        #: Called (in a worker thread) at the end of :meth:`kill_all`: the sandbox kills what
        #: no process group holds (its cgroup).
        self.on_kill_all: Callable[[], None] | None = None
        _MANAGERS.add(self)

    def _working_directory(self) -> str:
        sandbox: LocalSandbox | None = self.sandbox
        if sandbox is None:
            return os.getcwd()
        return os.path.abspath(sandbox.working_directory)

    def _resolve_cwd(self, cwd: str | None) -> str:
        workdir = self._working_directory()
        if cwd is None:
            return workdir
        cwd = os.path.expanduser(cwd)
        if os.path.isabs(cwd):
            return os.path.normpath(cwd)
        candidate = os.path.abspath(cwd)
        # "sandbox/sub" given relative to this process already points inside the working
        # directory; anything else is relative to the working directory.
        if candidate == workdir or candidate.startswith(workdir.rstrip(os.sep) + os.sep):
            return candidate
        return os.path.normpath(os.path.join(workdir, cwd))

    def _note_lingering(self, pgid: int, leader_start: int | None) -> None:
        with self._lingering_lock:
            self._lingering[pgid] = leader_start

    async def _spawn(
        self,
        command: str,
        *,
        cwd: str | None,
        env: dict[str, str | None],
        timeout: float | None,  # noqa: ASYNC109
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        stdin_mode: Literal["pipe", "ignore"],
        max_retained_bytes: int | float,
        abort_signal: AbortSignal | None,
    ) -> ProcessHandle:
        workdir = self._resolve_cwd(cwd)
        full_env: dict[str, str] = {}
        for key, value in {"PATH": os.environ.get("PATH", os.defpath), **self.env, **env}.items():
            if value is not None:
                full_env[key] = str(value)
        plan: LaunchPlan | None = None
        launch = getattr(self.sandbox, "launch", None) if self.sandbox is not None else None
        failure: str | None = None
        if callable(launch):
            try:
                # A launcher that takes the environment can keep what must not reach a
                # process on the host (bubblewrap) out of it.
                plan = launch(command, cwd=workdir, env=full_env) if _takes_env(launch) else launch(command, cwd=workdir)
            except OSError as exc:
                failure = f"Cannot run command: {exc.strerror or exc}"
        if plan is None:
            plan = LaunchPlan(["/bin/sh", "-c", command])

        def handle_for(proc: subprocess.Popen[bytes] | None, pid: str) -> _LocalProcessHandle:
            return _LocalProcessHandle(
                proc,
                pid,
                timeout_ms=timeout,
                abort_signal=abort_signal,
                max_retained_bytes=max_retained_bytes,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                on_linger=self._note_lingering,
                plan=plan,
            )

        if failure is not None:
            handle = handle_for(None, f"failed-{next(self._spawn_errors)}")
            handle._fail(failure)
            return handle
        # Forking a large process takes a moment: do it in a spawning thread (see _spawner),
        # shielded so that a cancellation cannot lose a process that was already started.
        with anyio.CancelScope(shield=True):
            future = _spawner().submit(_popen, plan, workdir, full_env, stdin_mode)
            started = await anyio.to_thread.run_sync(future.result)
        if isinstance(started, str):
            handle = handle_for(None, f"failed-{next(self._spawn_errors)}")
            handle._fail(started)
            return handle
        handle = handle_for(started, str(started.pid))
        handle._start_io()
        return handle

    async def kill_all(self) -> None:
        """Kill every running tracked process and every process group a finished command
        left running in the background, then wait (up to 10 s) for the tracked ones; then
        whatever the sandbox still holds (:attr:`on_kill_all`)."""
        await super().kill_all()
        self._kill_lingering()
        if self.on_kill_all is not None:
            await anyio.to_thread.run_sync(self.on_kill_all)

    def kill_all_now(self) -> None:
        """Synchronous, non-waiting :meth:`kill_all` (for interpreter exit)."""
        for handle in list(self._tracked.values()):
            if isinstance(handle, _LocalProcessHandle):
                handle.kill_now()
        self._kill_lingering()
        if self.on_kill_all is not None:
            self.on_kill_all()

    def _kill_lingering(self) -> None:
        with self._lingering_lock:
            groups, self._lingering = self._lingering, {}
        for pgid, leader_start in groups.items():
            if group_is_ours(pgid, leader_start):
                signal_group(pgid, signal.SIGKILL)


def _takes_env(launch: Callable[..., Any]) -> bool:
    try:
        return "env" in inspect.signature(launch).parameters
    except (TypeError, ValueError):
        return False
