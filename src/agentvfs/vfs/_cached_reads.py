"""Reads of an object store through a :class:`~agentvfs.vfs.ContentCache`.

Every read first knows the version it wants (from a listing or stat younger than the TTL, else
one stat: close-to-open), then takes that version's entry from the cache, or fetches exactly
that version (a GET the store answers only for it: ``If-Match`` on S3, the generation on
GCS) and keeps it. A GET that is not pinned could return a newer version than the one it is
filed under, so a store whose reads cannot be pinned is read as if there were no cache.

On S3 an ETag is the MD5 of the content, and whoever writes can give new bytes the ETag of
old ones (an MD5 collision). There a version is the ETag and the modification second, and a
version is cached only once a listing or stat showed that second settled (see
:func:`~agentvfs.vfs.settled`): a version seen sooner is read from storage every time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from ..errors import FileNotFound, FileTooLarge, IsDirectory, StaleFileError
from . import _paths
from ._base import run_sync
from ._cache import CacheFill, ContentCache, VersionMemo, settled
from ._fsspec_backends import READ_THREADS
from ._records import FileStat

if TYPE_CHECKING:
    from ._fsspec import FsspecFilesystem
    from ._object_store import ObjectStoreBackend

__all__ = ["_CachedReads"]

_log = logging.getLogger("agentvfs.cache")

#: A file up to this size whose stat is asked is read whole instead (one GET, which answers
#: the stat too, instead of a HEAD now and a GET later); larger files are not fetched for a
#: stat (a listing of big files would download them).
_STAT_BY_GET = 64 * 1024
#: Entries up to this size are read on the event loop's thread (a thread hop costs more).
_INLINE_BYTES = 256 * 1024
#: Descriptors of entries kept open for ranged reads (an entry never changes).
_OPEN_ENTRIES = 32
#: Entries being filled by ranged reads at once; the oldest is given up beyond it.
_FILLS = 8
#: A fill no read has added to for this long is given up.
_FILL_IDLE = 30.0
#: A fill starts with a read this close to the start of a file: readers that go through a
#: file from its start (their first parts arrive in any order) fill the cache, readers that
#: jump to its end first (a Parquet footer) do not.
_FILL_START = 32 * 1024 * 1024
#: When a read reaches the end of a file being filled, bytes read before the fill began (at
#: most this many) are fetched to complete it.
_FILL_HOLES = 32 * 1024 * 1024
#: Subdirectories of a listed directory whose listings are fetched ahead, and the most a
#: listing fetched ahead may be old (seconds, and a share of the TTL) to be used.
_LIST_AHEAD = 16
_LIST_AHEAD_AGE = 1.0
#: Metadata records read ahead of the stats that use them, at most (see ``preload_stats``).
_STATS_AHEAD = 8192
#: Background fetches at once (prefetch of a directory's next files).
_PREFETCH_THREADS = 8
_PREFETCH_QUEUE = 256


#: Buffers (each at least this size) the writer of fills copies parts into, and how many:
#: what a fill may be ahead of the disk before its reader waits; and the longest wait
#: before the fill is given up.
_FILL_BUFFER_BYTES = 16 * 1024 * 1024
_FILL_BUFFERS = 4
_FILL_WAIT = 5.0


class _FillWriter:
    """Writes the parts of fills to disk in a thread of its own, from copies kept in a small
    pool of reused buffers (pages already mapped, so a copy is a plain memcpy): a reader of a
    large file waits for the disk only when it is more than the pool ahead of it."""

    def __init__(self, owner: _CachedReads) -> None:
        self._owner = owner
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._free: list[bytearray] = []
        self._made = 0
        self._queue: queue.SimpleQueue[tuple[CacheFill, tuple[str, str], int, bytearray, int] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def offer(self, fill: CacheFill, key: tuple[str, str], offset: int, data: memoryview) -> bool:
        """Queue ``data`` for ``fill`` (of ``key``) at ``offset``; False when no buffer is free."""
        length = len(data)
        deadline = time.monotonic() + _FILL_WAIT
        with self._ready:
            while True:
                buffer = next((b for b in self._free if len(b) >= length), None)
                if buffer is not None:
                    self._free.remove(buffer)
                    break
                if self._made < _FILL_BUFFERS:
                    self._made += 1
                    buffer = bytearray(max(length, _FILL_BUFFER_BYTES))
                    break
                # The disk is behind: the reader waits for it (a fill runs at the speed of
                # local disk at worst), but not for long.
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._ready.wait(left):
                    return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentvfs-cache-writer", daemon=True)
                self._thread.start()
        buffer[:length] = data
        with self._owner._lock:
            fill.queued += 1
        self._queue.put((fill, key, offset, buffer, length))
        return True

    def _give(self, buffer: bytearray) -> None:
        with self._ready:
            self._free.append(buffer)
            self._ready.notify()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fill, key, offset, buffer, length = item
            try:
                fill.write(offset, memoryview(buffer)[:length])
            except (OSError, ValueError) as exc:
                _log.warning("cache: fill of %s given up: %s", fill.describe.get("path", "?"), exc)
                self._owner._end_fill(key, fill, commit=False)
            finally:
                self._give(buffer)
                with self._owner._lock:
                    fill.queued -= 1
            self._owner._maybe_finish(key, fill)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()


_DATES = ("created_at", "modified_at")


def _stat_to(st: FileStat) -> dict[str, object]:
    out: dict[str, object] = {}
    for field in dataclasses.fields(st):
        value = getattr(st, field.name)
        if field.name in ("name", "path"):
            continue
        if field.name in _DATES:
            value = value.isoformat()
        elif field.name == "metadata" and value is not None:
            value = dict(value)
        out[field.name] = value
    return out


def _stat_from(record: dict[str, object], rel: str) -> FileStat:
    values = dict(record)
    for name in _DATES:
        values[name] = datetime.fromisoformat(str(values[name]))
    return FileStat(name=_paths.basename(rel), path=rel, **values)  # type: ignore[arg-type]


class _CachedReads:
    """The cached read paths of one :class:`~agentvfs.vfs.FsspecFilesystem`."""

    def __init__(self, owner: FsspecFilesystem, cache: ContentCache, ttl: float) -> None:
        backend = owner.backend
        if TYPE_CHECKING:
            assert isinstance(backend, ObjectStoreBackend)
        self.backend = backend
        self.cache = cache
        self.memo = VersionMemo(ttl)
        endpoint = backend.endpoint_url() or ""
        #: Names the store in keys: two workspaces of one bucket share entries.
        self.storage = f"{backend.protocol}://{endpoint}"
        #: Versions are ETags a writer can collide (S3): keys take the modification second
        #: too, and only versions seen settled are cached.
        self._digests = backend.capabilities.digest_etags
        backend.seen = self.memo.note
        self._lock = threading.Lock()
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._fills: OrderedDict[tuple[str, str], tuple[CacheFill, float]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._queued: dict[str, Future[None]] = {}
        #: Listings fetched ahead: directory -> (when the request started, its stats).
        self._ahead: dict[str, tuple[float, list[FileStat]]] = {}
        self._listing: set[str] = set()
        self._writer = _FillWriter(self)
        self._closed = False
        #: Metadata records of the files of recent listings, read in one query each: the
        #: stats a mount asks next of every file new to it (see ``preload_stats``).
        self._stats_ahead: dict[str, dict[str, object]] = {}

    def key(self, rel: str, version: str) -> str | None:
        """The cache key of ``version`` of ``rel``; None where it must not be cached: on a
        store of digest ETags, a version whose modification second was not seen settled (or
        not seen at all: the entry of another content of the same ETag could be served)."""
        if not self._digests:
            return ContentCache.key(self.storage, self.backend.bpath(rel), version)
        found = self.memo.stamp_of(rel, version)
        if found is None or not found[1]:
            return None
        return self._stamped_key(rel, version, found[0])

    def _stamped_key(self, rel: str, version: str, stamp: int) -> str:
        return ContentCache.key(self.storage, self.backend.bpath(rel), f"{version}@{stamp}")

    def _describe(self, rel: str, version: str) -> dict[str, str]:
        """What an entry's record names: the file in storage and its version."""
        return {"path": self.backend.bpath(rel), "version": version}

    def forget(self, *rels: str) -> None:
        self.memo.forget(*rels)

    # -- metadata ----------------------------------------------------------------------------------

    def _stat_key(self, rel: str, version: str, stamp: int, *, settled_then: bool) -> str | None:
        """The key of the metadata record of ``version`` of ``rel`` modified at ``stamp``;
        None where it must not be kept (a digest ETag whose second was not settled when seen,
        ``settled_then``)."""
        if self._digests and not settled_then:
            return None
        # The modification time too: a store may replace an object's metadata in place and
        # keep its ETag (an S3 copy onto itself), never its time.
        return ContentCache.key(self.storage, "stat\0" + self.backend.bpath(rel), f"{version}@{stamp}")

    def _seen_stat_key(self, rel: str, version: str, stamp: int) -> str | None:
        """:meth:`_stat_key` of a version the memo has seen."""
        found = self.memo.stamp_of(rel, version)
        return self._stat_key(rel, version, stamp, settled_then=found is not None and found == (stamp, True))

    def preload_stats(self, stats: Sequence[FileStat]) -> None:
        """Read the metadata records of the files of a listing (``stats``, paths relative to
        the backend) in one query, for the stats that follow it: a mount stats every file
        new to it right after listing its directory."""
        keys = []
        for st in stats:
            if st.type != "file":
                continue
            seen = self.memo.fresh_stamped(st.path)
            key = self._seen_stat_key(st.path, seen[0], seen[2]) if seen is not None else None
            if key is not None:
                keys.append(key)
        if not keys:
            return
        found = self.cache.get_stats(keys)
        with self._lock:
            if len(self._stats_ahead) + len(found) > _STATS_AHEAD:
                self._stats_ahead.clear()  # not asked for (nobody stats what it lists)
            self._stats_ahead.update(found)

    async def stat(self, rel: str, display: str) -> FileStat:
        """The stat of ``rel``: a file whose version a listing showed within the TTL is
        answered from the metadata record kept for that version (no HEAD); else storage is
        asked and the answer kept."""
        seen = self.memo.fresh_stamped(rel)
        key = self._seen_stat_key(rel, seen[0], seen[2]) if seen is not None else None
        if seen is not None and key is not None:
            version, size, stamp = seen
            with self._lock:
                record = self._stats_ahead.pop(key, None)
            if record is None:
                record = self.cache.get_stat(key)
            if record is not None:
                try:
                    st = _stat_from(record, rel)
                except (KeyError, TypeError, ValueError):
                    st = None
                if st is not None and st.etag == version and st.size == size:
                    return st
        if seen is not None and 0 < seen[1] <= _STAT_BY_GET:
            # A small file: one GET answers the stat and fills the cache, where a HEAD now
            # and a GET at open would be two requests.
            got = await run_sync(self._read_with_stat, rel, display, seen[0])
            if got is not None:
                return got
        st = await run_sync(self.backend.stat_sync, rel, display)
        if st.type == "file" and st.etag is not None and st.metadata is not None:
            stamp = int(st.modified_at.timestamp())
            key = self._stat_key(rel, st.etag, stamp, settled_then=settled(stamp, time.time()))
            if key is not None:
                await run_sync(self.cache.put_stat, key, _stat_to(st))
        return st

    def _read_with_stat(self, rel: str, display: str, version: str) -> FileStat | None:
        read = getattr(self.backend, "read_with_stat_sync", None)
        if read is None:
            return None
        try:
            got: tuple[bytes, FileStat] | None = read(rel, display, version)
        except (StaleFileError, FileNotFound):
            return None  # changed since the listing: a stat tells what is there now
        if got is None:
            return None
        data, st = got
        if st.etag is None or st.metadata is None:
            return None
        stamp = int(st.modified_at.timestamp())
        now_settled = settled(stamp, time.time())  # the answer is the storage's now
        if not self._digests:
            entry: str | None = ContentCache.key(self.storage, self.backend.bpath(rel), st.etag)
        else:
            entry = self._stamped_key(rel, st.etag, stamp) if now_settled else None
        if entry is not None:
            self.cache.put(entry, data, describe=self._describe(rel, st.etag))
        key = self._stat_key(rel, st.etag, stamp, settled_then=now_settled)
        if key is not None:
            self.cache.put_stat(key, _stat_to(st))
        return st

    # -- whole files -----------------------------------------------------------------------------

    async def current(self, rel: str, display: str) -> tuple[str, int] | None:
        """The version and size of the file ``rel`` now (within the TTL); None where the store
        gives no version."""
        fresh = self.memo.fresh(rel)
        if fresh is not None:
            return fresh
        st = await run_sync(self.backend.stat_sync, rel, display)
        if st.type == "directory":
            raise IsDirectory(display)
        return (st.etag, st.size) if st.etag is not None else None

    def fetch(self, rel: str, display: str, version: str, size: int) -> bytes | None:
        """One GET of exactly ``version`` (``size`` bytes), kept in the cache; None where the
        store cannot pin the read.

        Raises
        ------
        StaleFileError
            The file is at another version now (or gone).
        """
        # The key before the read: a listing showing a new second of the same ETag meanwhile
        # (new bytes, same digest) must not get the bytes read here filed under it.
        key = self.key(rel, version)
        buffer = bytearray(size)
        count = self.backend.read_exact_version_sync(rel, display, 0, memoryview(buffer), version)
        if count is None:
            return None
        if count != size:
            raise StaleFileError(display, None, None)
        if key is not None:
            self.cache.put(key, buffer, describe=self._describe(rel, version))
        return bytes(buffer)

    async def read(self, rel: str, display: str) -> bytes | None:
        """The content of the file ``rel``, through the cache; None to read it uncached."""
        for attempt in range(2):
            current = await self.current(rel, display)
            if current is None:
                return None
            version, size = current
            if size == 0:
                return b""
            key = self.key(rel, version)
            if key is None:
                data = None
            elif size <= _INLINE_BYTES:
                data = self.cache.get(key, size)
            else:
                data = await run_sync(self.cache.get, key, size)
            if data is not None:
                return data
            try:
                return await run_sync(self.fetch, rel, display, version, size)
            except StaleFileError:
                # Changed since the version was seen: ask storage again, once.
                self.memo.forget(rel)
                if attempt:
                    return None
        return None

    def cat_many(self, rels: list[str], max_bytes: int | None) -> dict[str, bytes | OSError]:
        """``backend.cat_many`` through the cache (in a worker thread)."""
        out: dict[str, bytes | OSError] = {}
        known: dict[str, tuple[str, int]] = {}
        unknown: list[str] = []
        for rel in rels:
            fresh = self.memo.fresh(rel)
            if fresh is None:
                unknown.append(rel)
            else:
                known[rel] = fresh
        if unknown:
            known.update(self._versions(unknown))
        missing: list[tuple[str, str, int]] = []
        for rel, (version, size) in known.items():
            if max_bytes is not None and size > max_bytes:
                out[rel] = FileTooLarge(rel, max_bytes)
                continue
            key = self.key(rel, version)
            data = b"" if size == 0 else self.cache.get(key, size) if key is not None else None
            if data is not None:
                out[rel] = data
            else:
                missing.append((rel, version, size))

        def one(item: tuple[str, str, int]) -> bytes | None:
            rel, version, size = item
            try:
                return self.fetch(rel, rel, version, size)
            except OSError:
                return None

        if missing:
            with ThreadPoolExecutor(min(READ_THREADS, len(missing)), thread_name_prefix="agentvfs-cache") as pool:
                for (rel, _, _), data in zip(missing, pool.map(one, missing), strict=True):
                    if data is not None:
                        out[rel] = data
        rest = [rel for rel in rels if rel not in out]
        if rest:
            out.update(self.backend.cat_many(rest, max_bytes))
        return out

    def _versions(self, rels: list[str]) -> dict[str, tuple[str, int]]:
        """Versions of files not seen lately: one listing of a directory several of them
        share, a stat of each other (misses are left out)."""
        by_parent: dict[str, list[str]] = {}
        for rel in rels:
            by_parent.setdefault(_paths.dirname(rel), []).append(rel)
        out: dict[str, tuple[str, int]] = {}
        single: list[str] = []
        for parent, members in by_parent.items():
            if len(members) < 2:
                single.extend(members)
                continue
            try:
                self.backend.list_stats_sync(parent, parent)  # tells the memo of every file
            except OSError:
                single.extend(members)
                continue
            for rel in members:
                fresh = self.memo.fresh(rel)
                if fresh is not None:
                    out[rel] = fresh

        def one(rel: str) -> tuple[str, int] | None:
            try:
                st = self.backend.stat_sync(rel, rel)
            except OSError:
                return None
            return (st.etag, st.size) if st.type == "file" and st.etag is not None else None

        if single:
            with ThreadPoolExecutor(min(READ_THREADS, len(single)), thread_name_prefix="agentvfs-cache") as pool:
                for rel, got in zip(single, pool.map(one, single), strict=True):
                    if got is not None:
                        out[rel] = got
        return out

    # -- ranges ----------------------------------------------------------------------------------

    def _entry_fd(self, rel: str, version: str, size: int) -> int | None:
        """A descriptor of the entry (a duplicate the caller closes), or None if not cached."""
        key = self.key(rel, version)
        if key is None:
            return None
        with self._lock:
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
                return os.dup(fd)
        fd = self.cache.open(key, size)
        if fd is None:
            return None
        with self._lock:
            if self._closed:
                return fd
            if key not in self._fds:
                self._fds[key] = os.dup(fd)
                while len(self._fds) > _OPEN_ENTRIES:
                    os.close(self._fds.popitem(last=False)[1])
        return fd

    def _read_fd(self, rel: str, version: str, size: int, start: int, buffer: memoryview) -> int | None:
        fd = self._entry_fd(rel, version, size)
        if fd is None:
            return None
        want = max(0, min(len(buffer), size - start))
        done = 0
        try:
            while done < want:
                count = os.preadv(fd, [buffer[done:want]], start + done)
                if count == 0:
                    break
                done += count
        finally:
            os.close(fd)
        return done

    async def read_into(self, rel: str, start: int, buffer: memoryview) -> int | None:
        """Bytes from ``start`` of the file's current version, where its entry is cached and
        the version was seen within the TTL; None otherwise (no request is made here)."""
        fresh = self.memo.fresh(rel)
        if fresh is None:
            return None
        version, size = fresh
        if len(buffer) <= _INLINE_BYTES:
            return self._read_fd(rel, version, size, start, buffer)
        return await run_sync(self._read_fd, rel, version, size, start, buffer)

    async def read_version_into(self, rel: str, display: str, start: int, buffer: memoryview, version: str) -> int | None:
        """A pinned ranged read through the cache: from the entry of ``version`` if cached;
        else from storage, the bytes also written into a fill of the entry, committed once
        every byte of the file has been read. None: read it uncached."""
        size = self.memo.size_of(rel, version)
        if size is None:
            return None
        count = await run_sync(self._read_fd, rel, version, size, start, buffer)
        if count is not None:
            return count
        fill = self._fill(rel, version, size, start)
        if fill is None:
            return None
        return await run_sync(self._fill_from_storage, fill, rel, display, start, buffer, version)

    def _fill(self, rel: str, version: str, size: int, start: int) -> CacheFill | None:
        key = (rel, version)
        now = time.monotonic()
        with self._lock:
            found = self._fills.get(key)
            if found is not None:
                self._fills[key] = (found[0], now)
                return found[0]
            if start >= _FILL_START or size > self.cache.max_bytes // 2 or self._closed:
                return None
            stale = [k for k, (_, at) in self._fills.items() if now - at > _FILL_IDLE]
            dropped = [self._fills.pop(k)[0] for k in stale]
            while len(self._fills) >= _FILLS:
                dropped.append(self._fills.popitem(last=False)[1][0])
        for old in dropped:
            old.abort()
        entry = self.key(rel, version)
        fill = self.cache.begin(entry, size, describe=self._describe(rel, version)) if entry is not None else None
        if fill is None:
            return None
        with self._lock:
            self._fills[key] = (fill, now)
        return fill

    def _fill_from_storage(
        self, fill: CacheFill, rel: str, display: str, start: int, buffer: memoryview, version: str
    ) -> int | None:
        key = (rel, version)
        with self._lock:
            fill.inflight += 1
        count: int | None = None
        try:
            count = self.backend.read_exact_version_sync(rel, display, start, buffer, version)
        except StaleFileError:
            self._end_fill(key, fill, commit=False)
            raise
        finally:
            with self._lock:
                fill.inflight -= 1
        if count is None:
            self._end_fill(key, fill, commit=False)
            return None
        # The reader goes on at once: the bytes are copied for the writer thread, and when it
        # is behind (the disk slower than the network) the fill is given up, never waited for.
        if not self._writer.offer(fill, key, start, buffer[:count]):
            _log.debug("cache: fill of %s given up: the disk is behind the reader", display)
            self._end_fill(key, fill, commit=False)
            return count
        if start + count >= fill.size:
            fill.reached_end = True
        self._maybe_finish(key, fill)
        return count

    def _maybe_finish(self, key: tuple[str, str], fill: CacheFill) -> None:
        """Commit ``fill`` once the reader has reached the end of the file and nothing of it
        is being read or written: what is still missing then was read before the fill began
        (fetched here if it is little)."""
        with self._lock:
            if not fill.reached_end or fill.inflight or fill.queued or fill.done or fill.finishing:
                return
            fill.finishing = True
        if not fill.complete:
            rel, version = key
            self._complete(fill, rel, rel, version)
        self._end_fill(key, fill, commit=fill.complete)

    def _complete(self, fill: CacheFill, rel: str, display: str, version: str) -> None:
        """A reader reached the end of a file being filled: fetch what was read before the
        fill began, if that is little (else the fill stays incomplete and is given up)."""
        holes = fill.missing()
        if sum(end - start for start, end in holes) > _FILL_HOLES:
            return
        for start, end in holes:
            buffer = bytearray(end - start)
            try:
                count = self.backend.read_exact_version_sync(rel, display, start, memoryview(buffer), version)
            except OSError:
                return
            if count != len(buffer):
                return
            fill.write(start, buffer)

    def _end_fill(self, key: tuple[str, str], fill: CacheFill, *, commit: bool) -> None:
        with self._lock:
            if self._fills.get(key, (None,))[0] is fill:
                del self._fills[key]
        if commit:
            fill.commit()
        else:
            fill.abort()

    # -- listings --------------------------------------------------------------------------------

    def take_listing(self, rel: str) -> list[FileStat] | None:
        """A listing of ``rel`` fetched ahead moments ago, used once; None: list it now.

        It is used only while younger than half the TTL (and a second), and not after a
        change made here in or above the directory: whoever lists a tree (a mount under
        ``grep -r``) waits for one listing at a time no more, and sees storage at most that
        much older than a listing of its own would show.
        """
        with self._lock:
            found = self._ahead.pop(rel, None)
        if found is None:
            return None
        started, stats = found
        if time.monotonic() - started > min(self.memo.ttl / 2, _LIST_AHEAD_AGE) or self.memo.changed_since(rel, started):
            return None
        return stats

    def list_ahead(self, rel: str, stats: Sequence[FileStat]) -> None:
        """Fetch the listings of the first subdirectories of ``rel`` in the background."""
        if self.memo.ttl <= 0:
            return
        subdirs = [st.path for st in stats if st.type == "directory"][:_LIST_AHEAD]
        if not subdirs:
            return
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_PREFETCH_THREADS, thread_name_prefix="agentvfs-prefetch")
            pool = self._pool
            wanted = [d for d in subdirs if d not in self._listing and d not in self._ahead]
            self._listing.update(wanted)
        for sub in wanted:
            pool.submit(self._list_one, sub)

    def _list_one(self, rel: str) -> None:
        started = time.monotonic()
        try:
            if not self._closed:
                stats = self.backend.list_stats_sync(rel, rel)
                with self._lock:
                    self._ahead[rel] = (started, stats)
                    if len(self._ahead) > 4 * _LIST_AHEAD:
                        # Never taken (the reader went elsewhere): the oldest go.
                        for key in sorted(self._ahead, key=lambda k: self._ahead[k][0])[: _LIST_AHEAD]:
                            del self._ahead[key]
        except OSError:
            pass  # gone or unreadable: the reader's own listing will say
        finally:
            with self._lock:
                self._listing.discard(rel)

    # -- for a mount -----------------------------------------------------------------------------

    async def open(self, rel: str, display: str, version: str, size: int, fetch_below: int) -> int | None:
        key = self.key(rel, version)
        if key is None:
            return None  # not to be cached (yet): read from storage
        fd = self.cache.open(key, size) if size <= _INLINE_BYTES else await run_sync(self.cache.open, key, size)
        if fd is not None or size > fetch_below or size == 0:
            return fd
        with self._lock:
            queued = self._queued.get(key)
        if queued is not None:
            # Being prefetched: wait for that fetch rather than making a second one.
            with contextlib.suppress(Exception):
                await run_sync(queued.result)
        else:
            try:
                await run_sync(self.fetch, rel, display, version, size)
            except StaleFileError:
                return None
        return self.cache.open(key, size)

    def prefetch(self, files: Sequence[tuple[str, str, int]]) -> None:
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_PREFETCH_THREADS, thread_name_prefix="agentvfs-prefetch")
            pool = self._pool
        for rel, version, size in files:
            key = self.key(rel, version)
            if key is None:
                continue
            with self._lock:
                if key in self._queued or len(self._queued) >= _PREFETCH_QUEUE:
                    continue
            if size == 0 or self.cache.contains(key, size):
                continue
            future = pool.submit(self._prefetch_one, rel, version, size, key)
            with self._lock:
                self._queued[key] = future

    def _prefetch_one(self, rel: str, version: str, size: int, key: str) -> None:
        try:
            if not self._closed and not self.cache.contains(key, size):
                self.fetch(rel, rel, version, size)
        except (OSError, FileNotFound):
            pass  # changed or gone since it was listed: the reader will see
        finally:
            with self._lock:
                self._queued.pop(key, None)

    def flush(self) -> None:
        """Wait for background fetches and for the parts of fills handed to the writer (a
        fill the reader finished is committed); the cache stays in use."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._writer.close()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            fds, self._fds = list(self._fds.values()), OrderedDict()
            fills, self._fills = [f for f, _ in self._fills.values()], OrderedDict()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._writer.close()
        for fd in fds:
            os.close(fd)
        for fill in fills:
            fill.abort()
        if self.backend.seen == self.memo.note:
            self.backend.seen = None
