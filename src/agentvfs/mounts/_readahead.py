"""Reading files of remote storage through a mount: read-ahead parts and random-read windows.

A sequential read fetches parts ahead of the reader (small ones first, doubling up to
``part_size``), a random read fetches the aligned window around it and keeps it for the next
reads of the same region. Everything fetched counts against ``read_cache_bytes``; full-size
part buffers are reused. All of it runs on the mount's trio thread; the bytes are fetched
through the filesystem in worker threads.
"""

from __future__ import annotations

import bisect
import collections
import errno
import mmap
from collections.abc import Callable
from typing import Any

import trio

from ..vfs import WorkspaceFilesystem, read_range, read_range_into
from ._options import MountOptions

__all__ = ["ReadAhead", "ReadState"]

#: Where a part's bytes land: a ``bytearray``, or an anonymous mapping for large parts.
Buffer = bytearray | mmap.mmap


class _PartLayout:
    """Where the read-ahead parts of a file begin and end.

    The first parts are small and double in size (1, 2, 4, 8 MiB...) up to ``part_size``:
    the first bytes of a file arrive after a small request, while a long read soon moves in
    full-size parts.
    """

    __slots__ = ("_ramp_starts", "part_size", "ramp_end")

    def __init__(self, part_size: int, first: int = 1024 * 1024) -> None:
        self.part_size = part_size
        starts = [0]
        size = min(first, part_size)
        while size < part_size:
            starts.append(starts[-1] + size)
            size *= 2
        self._ramp_starts = starts
        self.ramp_end = starts[-1]

    def index_of(self, offset: int) -> int:
        if offset >= self.ramp_end:
            return len(self._ramp_starts) - 1 + (offset - self.ramp_end) // self.part_size
        return bisect.bisect_right(self._ramp_starts, offset) - 1

    def bounds(self, index: int) -> tuple[int, int]:
        ramp = len(self._ramp_starts) - 1
        if index < ramp:
            return self._ramp_starts[index], self._ramp_starts[index + 1]
        start = self.ramp_end + (index - ramp) * self.part_size
        return start, start + self.part_size


class _Part:
    """One prefetched range of a file."""

    __slots__ = ("buffer", "data", "done", "dropped", "error", "pins", "size")

    def __init__(self, size: int, buffer: Buffer) -> None:
        self.size = size
        #: Where the range lands; ``data`` is the part of it that was read.
        self.buffer = buffer
        self.data: memoryview | None = None
        self.error: BaseException | None = None
        self.done = trio.Event()
        #: Dropped from its handle; the buffer goes back to the pool once the fetch has
        #: finished and no reader holds it.
        self.dropped = False
        self.pins = 0


def _fresh_buffer(size: int) -> Buffer:
    """A new buffer of ``size`` bytes, none of its memory touched yet.

    ``bytearray(size)`` zeroes every page on the mount's trio thread, with the interpreter
    lock held: 4,096 page faults and a 16 MiB ``memset`` per part, a third of that thread's
    time in a cold sequential read. An anonymous mapping costs nothing until written: the
    kernel maps (and zeroes) each page as the socket's bytes land in it, in the worker thread
    that reads them, with the lock released. Private: a shared anonymous mapping is backed
    by shmem, whose faults cost twice as much.
    """
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE) if size >= _MAPPED else bytearray(size)


#: Buffers from this size on are anonymous mappings.
_MAPPED = 1024 * 1024


class _Buffers:
    """Buffers of ``part_size`` bytes kept for the next parts.

    A fresh 16 MiB buffer costs 4,096 page faults (each a zeroed page) as the socket's bytes
    land in it: a fifth of the mount's samples in a perf profile of a sequential read from S3.
    Reused buffers are already mapped. At most ``keep`` wait here, within ``read_cache_bytes``
    together with the parts in use, and none once no read holds parts (see
    :meth:`ReadAhead._release_part`).
    """

    __slots__ = ("free", "keep", "size")

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self.free: list[Buffer] = []

    def take(self, size: int) -> Buffer:
        # Only full parts are pooled: the smaller ones of the ramp would hold a full buffer
        # for a few MiB of data.
        if size == self.size and self.free:
            return self.free.pop()
        return _fresh_buffer(size)

    def give(self, buffer: Buffer, budget: int) -> None:
        """Keep ``buffer`` if the free ones stay within ``budget`` bytes."""
        if len(buffer) == self.size and len(self.free) < self.keep and (len(self.free) + 1) * self.size <= budget:
            self.free.append(buffer)


class ReadState:
    """What one open file has fetched and how it has been read so far."""

    __slots__ = ("next_offset", "parts", "sequential", "served", "version", "windows")

    def __init__(self) -> None:
        #: The version of the file the handle reads (its ``etag`` when opened; None: any).
        self.version: str | None = None
        #: The handle has given the reader bytes from storage (of ``version``).
        self.served = False
        self.parts: dict[int, _Part] = {}
        #: Aligned windows fetched for random reads, least recently used first.
        self.windows: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.next_offset = 0
        self.sequential = 0


class ReadAhead:
    """The read-ahead of one mount: parts and windows of every open file, within one memory
    budget (``read_cache_bytes``), fetched at most 16 at a time.

    Parameters
    ----------
    filesystem : WorkspaceFilesystem
        Where the bytes are read from.
    options : MountOptions
        ``part_size``, ``prefetch_parts``, ``random_read_size`` and ``read_cache_bytes``.
    nursery : callable
        Returns the mount's nursery, where fetches ahead of the reader run.
    """

    def __init__(
        self, filesystem: WorkspaceFilesystem, options: MountOptions, nursery: Callable[[], trio.Nursery | None]
    ) -> None:
        self.fs = filesystem
        self.options = options
        self.nursery = nursery
        self.layout = _PartLayout(options.part_size)
        self.buffers = _Buffers(options.part_size, keep=options.prefetch_parts + 2)
        self.fetch_limit = trio.CapacityLimiter(16)
        #: Bytes held by parts and windows of all open files.
        self.used = 0

    async def read(self, handle: ReadState, path: str, size: int, off: int, end: int) -> Any:
        """Bytes ``off`` to ``end`` of the file ``path`` (``size`` bytes long) read through
        the open file ``handle``: from its parts or windows, fetching what is missing and
        starting the parts ahead of a sequential read. A memoryview where one part holds
        the whole range."""
        part_size = self.options.part_size
        sequential = off == handle.next_offset
        handle.sequential = handle.sequential + 1 if sequential else 0
        handle.next_offset = end
        width = self.options.random_read_size
        if handle.windows and all(i in handle.windows for i in range(off // width, (end - 1) // width + 1)):
            # Within windows a random read fetched: the kernel splits one read into several
            # requests, and the rest of the window is what the next requests ask for.
            return await self._read_windows(handle, path, size, off, end)
        if not sequential and off != 0 and end - off <= part_size:
            self._drop_parts(handle, keep_from=None)
            if width <= 0:
                return await read_range(self.fs, path, off, end, version=handle.version)  # exact ranges
            return await self._read_windows(handle, path, size, off, end)
        parts = self.layout
        first, last = parts.index_of(off), parts.index_of(end - 1)
        ahead = min(self.options.prefetch_parts, 1 + handle.sequential)
        for index in range(first, last + 1 + ahead):
            start, stop = parts.bounds(index)
            if start >= size:
                break
            if index not in handle.parts:
                if index > last and self.used + (stop - start) > self.options.read_cache_bytes:
                    break  # read-ahead waits for memory; the bytes asked for never do
                self._start_part(handle, path, index, start, min(size, stop))
        self._drop_parts(handle, keep_from=first)
        wanted = [(index, handle.parts[index]) for index in range(first, last + 1)]
        # Pinned while this read waits and slices: another read of the handle may drop a
        # part meanwhile, and its buffer must not be refilled under this one.
        for _, part in wanted:
            part.pins += 1
        try:
            for index, part in wanted:
                await part.done.wait()
                if part.error is not None:
                    if handle.parts.get(index) is part:
                        self._forget_part(handle, index)
                    raise part.error
            pieces: list[Any] = []
            for index, part in wanted:
                assert part.data is not None
                base = parts.bounds(index)[0]
                lo = max(off, base) - base
                hi = min(end, base + len(part.data)) - base
                pieces.append(part.data[lo:hi])
            # A view is safe to hand out after the pins go: pyfuse3 copies it into the reply
            # before this thread runs any other task, and only tasks refill buffers.
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        finally:
            for _, part in wanted:
                part.pins -= 1
                self._release_part(part)

    async def _read_windows(self, handle: ReadState, path: str, size: int, off: int, end: int) -> Any:
        """A random read: the aligned window(s) of ``random_read_size`` around it, kept for
        the handle's next reads (LRU, within ``read_cache_bytes``).

        Exact ranges cost a request each, and a request costs the same for 4 KiB as for
        1 MiB on most servers; a window turns scattered reads of one region (a database,
        an archive's index, fio's randread) into memory hits after the first, while a read
        of a huge file still fetches only one window, not a part.
        """
        width = self.options.random_read_size
        first, last = off // width, (end - 1) // width
        missing = [i for i in range(first, last + 1) if i not in handle.windows]
        need = sum(min(size, (i + 1) * width) - i * width for i in missing)
        while handle.windows and self.used + need > self.options.read_cache_bytes:
            _, old = handle.windows.popitem(last=False)
            self.used -= len(old)
        if self.used + need > self.options.read_cache_bytes:
            # No memory left for windows (read-ahead of other handles holds it): the bytes
            # asked for, uncached.
            return await read_range(self.fs, path, off, end, version=handle.version)
        if missing:
            fetched: dict[int, bytes] = {}

            async def fetch(i: int) -> None:
                async with self.fetch_limit:
                    fetched[i] = await read_range(
                        self.fs, path, i * width, min(size, (i + 1) * width), version=handle.version
                    )

            try:
                async with trio.open_nursery() as nursery:
                    for i in missing:
                        nursery.start_soon(fetch, i)
            except ExceptionGroup as group:
                # The windows fail together: the first error says why (a storage error
                # keeps its errno for the reader).
                cause: BaseException = group
                while isinstance(cause, BaseExceptionGroup):
                    cause = cause.exceptions[0]
                raise cause from None
            for i in missing:
                handle.windows[i] = fetched[i]
                self.used += len(fetched[i])
        pieces: list[Any] = []
        for i in range(first, last + 1):
            handle.windows.move_to_end(i)
            data = handle.windows[i]
            base = i * width
            pieces.append(memoryview(data)[max(off, base) - base : min(end, base + len(data)) - base])
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def _start_part(self, handle: ReadState, path: str, index: int, start: int, end: int) -> None:
        part = _Part(end - start, self.buffers.take(end - start))
        handle.parts[index] = part
        self.used += part.size
        nursery = self.nursery()
        assert nursery is not None

        async def fetch() -> None:
            try:
                async with self.fetch_limit:
                    view = memoryview(part.buffer)[: part.size]
                    count = await read_range_into(self.fs, path, start, view, version=handle.version)
                    part.data = view[:count]
            except BaseException as exc:  # handed to the reader that waits for this part
                part.error = exc if isinstance(exc, Exception) else OSError(errno.EIO, "read cancelled")
                if not isinstance(exc, Exception):
                    # Cancelled: the worker thread may still be writing into the buffer, so
                    # it is never reused.
                    part.buffer = bytearray()
                    part.done.set()
                    raise
            finally:
                part.done.set()
                self._release_part(part)

        nursery.start_soon(fetch)

    def _forget_part(self, handle: ReadState, index: int) -> None:
        part = handle.parts.pop(index)
        self.used -= part.size
        part.dropped = True
        self._release_part(part)

    def _release_part(self, part: _Part) -> None:
        """Give a dropped part's buffer back once its fetch is over and no read holds it."""
        if part.dropped and part.done.is_set() and not part.pins and part.buffer:
            buffer, part.buffer, part.data = part.buffer, bytearray(), None
            self.buffers.give(buffer, self.options.read_cache_bytes - self.used)
        if not self.used:
            self.buffers.free.clear()  # nothing is being read: the memory goes back

    def release(self, handle: ReadState) -> None:
        """The file was closed: its parts and windows go (buffers back to the pool)."""
        self._drop_parts(handle, keep_from=None)
        self._drop_windows(handle)

    def _drop_parts(self, handle: ReadState, keep_from: int | None) -> None:
        for index in list(handle.parts):
            if keep_from is None or index < keep_from:
                self._forget_part(handle, index)

    def _drop_windows(self, handle: ReadState) -> None:
        self.used -= sum(len(w) for w in handle.windows.values())
        handle.windows.clear()
