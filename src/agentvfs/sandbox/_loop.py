"""Event-loop plumbing of the process manager.

The I/O thread of a process wakes the event loop that waits for its output (``call_soon_
threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on trio), and output reaches callbacks
through subscriptions delivered by tasks of that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import sniffio

_log = logging.getLogger("agentvfs.sandbox")

__all__ = ["OutputCallback", "Subscription", "Waker", "deliver", "start_task"]


# -- event-loop plumbing ------------------------------------------------------------------------

#: A callback receiving one decoded chunk of output; it may be a coroutine function.
OutputCallback = Callable[[str], Any]


def _loop_call_soon() -> Callable[[Callable[[], object]], object]:
    """Return a thread-safe, non-blocking "run this soon in the current event loop"."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    return asyncio.get_running_loop().call_soon_threadsafe


# Strong references to asyncio tasks started by ``start_task`` (the loop keeps only weak ones).
_TASKS: set[asyncio.Task[None]] = set()


def start_task(fn: Callable[[], Awaitable[None]]) -> None:
    """Start ``fn()`` in the current event loop without an owner: it outlives the caller and
    is cancelled when the loop (or trio run) ends."""
    if sniffio.current_async_library() == "trio":
        import trio

        trio.lowlevel.spawn_system_task(fn)
        return

    async def run() -> None:
        await fn()

    task = asyncio.get_running_loop().create_task(run())
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


class Waker:
    """Wakes a task of one event loop from any thread, never blocking that thread."""

    __slots__ = ("_call_soon", "_event", "_lock", "_scheduled")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._call_soon = _loop_call_soon()
        self._lock = threading.Lock()
        self._scheduled = False

    def wake(self) -> None:
        """Make the current or next :meth:`wait` return (callable from any thread)."""
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        # RuntimeError: the loop has finished (trio.RunFinishedError is one): nobody to wake.
        with contextlib.suppress(RuntimeError):
            self._call_soon(self._fire)

    def _fire(self) -> None:
        with self._lock:
            self._scheduled = False
        self._event.set()

    async def wait(self, limit: float | None = None) -> None:
        """Wait for a wake (or ``limit`` seconds)."""
        with anyio.move_on_after(limit):
            await self._event.wait()
        # Only the loop thread replaces the event, right after it was set; a wake that comes
        # later sets the new one. No wake is lost because callers look at the state again.
        if self._event.is_set():
            self._event = anyio.Event()


class Subscription:
    """Output callbacks and the chunks queued for them."""

    __slots__ = ("backlog", "dead", "on_stderr", "on_stdout", "pump", "queue", "waker")

    def __init__(
        self,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        waker: Waker,
        *,
        pump: bool,
    ) -> None:
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.waker = waker
        self.pump = pump
        self.queue: deque[tuple[OutputCallback, str]] = deque()
        self.backlog = 0
        self.dead = False


async def deliver(items: list[tuple[OutputCallback, str]]) -> None:
    for callback, text in items:
        try:
            result = callback(text)
            if inspect.isawaitable(result):
                await result
        except Exception:
            _log.exception("output callback %r failed", callback)
