"""Per-path write locks and the read tracker shared by the tools of one ``create_tools`` call."""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC

import anyio

from ..errors import FileReadRequiredError
from ..vfs import FileStat

__all__ = ["ReadRecord", "ReadTracker", "WriteLocks", "iso_ms", "path_key"]


def path_key(path: str) -> str:
    """The key of a path as an agent gave it: ``a.txt`` and ``./a.txt`` are one file.

    Backslashes become ``/``, the path is normalised and a trailing ``/`` dropped; a leading
    ``/`` is kept (``/a.txt`` may name another file).
    """
    norm = posixpath.normpath(path.replace("\\", "/"))
    return norm.rstrip("/") or norm


class WriteLocks:
    """FIFO locks per file so concurrent writes to one path land in call order.

    Different paths proceed in parallel. Locks are created on demand and dropped when no one
    holds or waits for them.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, path: str) -> AsyncIterator[None]:
        """Hold the lock of ``path`` (waiting in arrival order)."""
        key = path_key(path)
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = anyio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            current, count = self._locks[key]
            if count <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (current, count - 1)


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """What a read saw: the file's stat (time and version) and the filesystem it came from."""

    stat: FileStat
    scope: str


def iso_ms(stat: FileStat) -> str:
    """A stat's modification time as JavaScript's ``toISOString`` writes it (ms, ``Z``)."""
    when = stat.modified_at.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class ReadTracker:
    """Which files an agent has read, for optimistic concurrency and read-before-write."""

    def __init__(self) -> None:
        self._records: dict[str, ReadRecord] = {}

    def record_read(self, path: str, stat: FileStat, scope: str) -> None:
        """Remember that ``path`` was read as ``stat`` from the filesystem ``scope``."""
        self._records[path_key(path)] = ReadRecord(stat, scope)

    def get(self, path: str, scope: str) -> ReadRecord | None:
        """The record of ``path`` from this scope, if any."""
        record = self._records.get(path_key(path))
        return record if record is not None and record.scope == scope else None

    def clear(self, path: str) -> None:
        """Forget ``path`` (a write consumed the read)."""
        self._records.pop(path_key(path), None)

    def require_fresh_read(self, path: str, current: FileStat, scope: str) -> None:
        """Raise unless ``path`` was read from this scope and has not changed since.

        Raises
        ------
        FileReadRequiredError
            With one of the reference's three messages.
        """
        record = self._records.get(path_key(path))
        if record is None:
            raise FileReadRequiredError(path, f'File "{path}" has not been read. You must read a file before writing to it.')
        if record.scope != scope:
            raise FileReadRequiredError(
                path, f'File "{path}" was read in a different filesystem. You must read a file before writing to it.'
            )
        seen = record.stat
        changed = (
            seen.etag != current.etag
            if seen.etag is not None and current.etag is not None
            else current.modified_at > seen.modified_at
        )
        if changed:
            raise FileReadRequiredError(
                path,
                f'File "{path}" was modified since last read (read at: {iso_ms(seen)}, current: {iso_ms(current)}). '
                "Please re-read the file to get the latest contents.",
            )
