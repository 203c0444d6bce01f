"""A child process for the slow searches of one pattern, so that a deadline can stop them.

The ``regex`` engine takes a ``timeout``, but measures it in CPU time of the whole process
(C's ``clock()``): on a busy machine, where this process gets a fraction of a core, a search
given 5 s runs for 10 or 20 s of wall-clock time, and nothing can stop a call already in
the engine from another thread. A search run in a child process is stopped at its deadline
by killing the child, which also ends the CPU it burns.

The child runs only ``regex`` (imported from the parent's copy, so the answers are the
same), reads requests on standard input and answers on standard output:

* first the patterns, marshalled: ``[(source, flags), ...]``, compiled once;
* then per search, marshalled: ``(pattern index, text, pos, endpos, seconds)``, answered by
  three 64-bit integers: ``(0, 0, 0)`` no match, ``(1, start, end)`` a match,
  ``(2, 0, 0)`` the ``seconds`` of CPU time ran out (a backstop for a child whose parent
  died without killing it; the parent kills it at the deadline first).

Requests are framed by their length (8 bytes, little-endian). marshal keeps every ``str``,
lone surrogates included (grep matches text in UTF-16 code units), and the child unmarshals
only what its parent wrote.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import struct
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

import regex

__all__ = ["Matcher", "MatcherDied", "matcher_supported"]

_HEAD = struct.Struct("<Q")
_REPLY = struct.Struct("<qqq")
_NONE, _FOUND, _SPENT = 0, 1, 2

# The child, run with ``python -I -S -c``: no site, no environment, only regex from the
# directory the parent imported it from.
_CHILD = r"""
import marshal, struct, sys
sys.path.insert(0, sys.argv[1])
import regex
head, reply = struct.Struct("<Q"), struct.Struct("<qqq")
source, sink = sys.stdin.buffer, sys.stdout.buffer
def frame():
    size = source.read(8)
    if len(size) < 8:
        raise SystemExit(0)
    return marshal.loads(source.read(head.unpack(size)[0]))
patterns = [regex.compile(text, flags) for text, flags in frame()]
while True:
    index, text, pos, endpos, seconds = frame()
    try:
        found = patterns[index].search(text, pos, endpos, timeout=seconds)
    except TimeoutError:
        answer = (2, 0, 0)
    else:
        answer = (0, 0, 0) if found is None else (1, *found.span())
    sink.write(reply.pack(*answer))
    sink.flush()
"""


class MatcherDied(RuntimeError):
    """The child ended without being asked to (killed from outside, out of memory)."""


def matcher_supported() -> bool:
    """Whether a matcher process can be started here (an interpreter to run, and ``poll``)."""
    return bool(sys.executable) and hasattr(select, "poll")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)  # a SIGKILLed process is reaped at once
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


class Matcher:
    """A child process that searches with ``patterns`` (each a ``(source, flags)`` pair), one
    search at a time, each under a deadline.

    :meth:`kill` may be called from any thread, also while another thread waits in
    :meth:`search`: that search then ends at once with :class:`TimeoutError`. The thread
    that searches owns the pipes: it closes them (:meth:`close`) once a search failed, and
    the child is reaped and its pipes closed when the matcher is collected.

    Raises
    ------
    OSError
        The child could not be started.
    """

    def __init__(self, patterns: Sequence[tuple[str, int]]) -> None:
        regex_dir = os.path.dirname(os.path.dirname(os.path.abspath(regex.__file__)))
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD, regex_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        self._out = self._proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._killed = False
        # A matcher dropped without kill() (an abandoned search) must not outlive it.
        self._finalizer = weakref.finalize(self, _kill, self._proc)
        self._pending = self._frame([(source, int(flags)) for source, flags in patterns])

    @staticmethod
    def _frame(value: Any) -> bytes:  # anything marshal takes
        data = marshal.dumps(value)
        return _HEAD.pack(len(data)) + data

    def search(self, index: int, text: str, pos: int, endpos: int | None, deadline: float) -> tuple[int, int] | None:
        """The span of the first match of pattern ``index`` in ``text[pos:endpos]`` (as
        ``regex``'s ``search`` finds it), or None.

        Raises
        ------
        TimeoutError
            ``deadline`` (a :func:`time.monotonic` time) passed first, or the matcher was
            killed; the child is killed, and every later search raises too.
        MatcherDied
            The child ended on its own.
        """
        if self._killed:
            raise TimeoutError("the matcher was stopped")
        # Only the text the search can see: ``pos`` is the start of a line or 0, and the
        # character before it (a newline) is kept, for what looks behind ``pos`` (``^``,
        # ``\b``, lookbehind) to see what it saw in the whole text.
        start = max(pos - 1, 0)
        end = len(text) if endpos is None else min(endpos, len(text))
        seconds = max(deadline - time.monotonic(), 0.0)
        request = self._frame((index, text[start:end], pos - start, end - start, seconds))
        try:
            self._send(self._pending + request, deadline)
            self._pending = b""
            kind, first, last = _REPLY.unpack(self._receive(_REPLY.size, deadline))
        except BaseException:
            self.close()
            raise
        if kind == _SPENT:
            self.close()
            raise TimeoutError("the search took longer than its deadline")
        return None if kind == _NONE else (first + start, last + start)

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        # A child killed meanwhile (kill() from another thread) closes its ends of the
        # pipes, which wakes the poll: POLLHUP for the reply, POLLERR for the request.
        poller = select.poll()
        poller.register(fd, event)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the search took longer than its deadline")
            if poller.poll(remaining * 1000 + 1):
                return

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._in, select.POLLOUT, deadline)
            try:
                view = view[os.write(self._in, view) :]
            except BlockingIOError:
                continue
            except OSError as exc:
                raise self._died() from exc

    def _receive(self, size: int, deadline: float) -> bytes:
        data = b""
        while len(data) < size:
            self._wait(self._out, select.POLLIN, deadline)
            chunk = os.read(self._out, size - len(data))
            if not chunk:
                raise self._died()
            data += chunk
        return data

    def _died(self) -> Exception:
        if self._killed:
            return TimeoutError("the matcher was stopped")
        return MatcherDied(f"the matcher process ended unexpectedly (exit status {self._proc.poll()})")

    def kill(self) -> None:
        """Stop the child now (SIGKILL), from any thread; idempotent."""
        self._killed = True
        with contextlib.suppress(OSError):
            self._proc.kill()

    def close(self) -> None:
        """Kill the child, reap it and close the pipes; only where no search runs."""
        self._killed = True
        self._finalizer()
