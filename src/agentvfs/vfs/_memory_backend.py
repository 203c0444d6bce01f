"""A backend in this process's memory: the reference implementation of the storage contract.

Small enough to read in one sitting, complete (versions, object metadata, atomic moves), and
what a third-party backend can be compared with: the conformance suite runs on it.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FileTooLarge,
    IsDirectory,
    NotDirectory,
    StaleFileError,
)
from . import _paths
from ._backend import Backend, ByteRange, Version, WriteMode
from ._mime import get_mime_type
from ._records import Capabilities, FileStat

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _File:
    data: bytes
    created_at: datetime
    modified_at: datetime
    etag: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Dir:
    created_at: datetime
    modified_at: datetime


class MemoryBackend(Backend):
    """Files and directories in a dict, guarded by one lock: every operation is atomic.

    Each write gets a new ``etag`` (a counter), so guarded writes are exact even within one
    clock tick. Not shared between processes and gone with this object.
    """

    provider = "memory"
    capabilities = Capabilities(
        empty_dirs=True, atomic_rename=True, symlinks=False, versions=True, blocking=False, metadata=True
    )

    def __init__(self) -> None:
        now = datetime.now(UTC)
        self._dirs: dict[str, _Dir] = {"": _Dir(now, now)}
        self._files: dict[str, _File] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count(1)

    # -- helpers, called with the lock held -------------------------------------------------

    def _stat_of(self, path: str) -> FileStat:
        name = _paths.basename(path)
        item = self._files.get(path)
        if item is not None:
            return FileStat(
                name=name, path=path, type="file", size=len(item.data), created_at=item.created_at,
                modified_at=item.modified_at, mime_type=get_mime_type(name), etag=item.etag,
                metadata=dict(item.metadata),
            )  # fmt: skip
        folder = self._dirs.get(path)
        if folder is None:
            raise FileNotFound(path)
        return FileStat(name=name, path=path, type="directory", size=0, created_at=folder.created_at,
                        modified_at=folder.modified_at)  # fmt: skip

    def _require_parent(self, path: str) -> None:
        parent = _paths.dirname(path)
        if parent in self._dirs:
            return
        current = parent
        while current:
            if current in self._files:
                raise NotDirectory(current)
            current = _paths.dirname(current)
        raise DirectoryNotFound(parent)

    def _below(self, path: str) -> Iterator[str]:
        """Every file and directory below the directory ``path``; its errors if it is none."""
        if path in self._files:
            raise NotDirectory(path)
        if path not in self._dirs:
            raise DirectoryNotFound(path)
        prefix = f"{path}/" if path else ""
        return (key for key in itertools.chain(self._dirs, self._files) if key and key.startswith(prefix))

    def _touch_parent(self, path: str, now: datetime) -> None:
        self._dirs[_paths.dirname(path)].modified_at = now

    # -- the contract -------------------------------------------------------------------------

    async def stat(self, path: str) -> FileStat:
        with self._lock:
            return self._stat_of(path)

    async def list(self, path: str) -> list[FileStat]:
        depth = path.count("/") + 1 if path else 0
        with self._lock:
            return [self._stat_of(key) for key in self._below(path) if key.count("/") == depth]

    async def read(self, path: str, range: ByteRange | None = None) -> bytes:
        with self._lock:
            item = self._files.get(path)
            if item is None:
                if path in self._dirs:
                    raise IsDirectory(path)
                raise FileNotFound(path)
            return item.data if range is None else range.of(item.data)

    async def write(
        self,
        path: str,
        data: bytes,
        *,
        mode: WriteMode = WriteMode.OVERWRITE,
        guard: Version | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> FileStat:
        now = datetime.now(UTC)
        with self._lock:
            if path in self._dirs:
                raise IsDirectory(path)
            self._require_parent(path)
            old = self._files.get(path)
            if old is not None and mode is WriteMode.CREATE:
                raise FileExists(path)
            if guard is not None:
                if old is None:
                    raise StaleFileError(path, guard.modified_at, None)
                current = self._stat_of(path)
                if not guard.matches(current):
                    raise StaleFileError(path, guard.modified_at, current.modified_at)
            kept = dict(metadata) if metadata is not None else {}
            self._files[path] = _File(
                bytes(data), old.created_at if old is not None else now, now, f"m{next(self._versions)}", kept
            )
            self._touch_parent(path, now)
            return self._stat_of(path)

    async def walk(self, path: str) -> builtins.list[FileStat]:
        """Every file and directory below ``path``, in one pass under the lock."""
        with self._lock:
            return [self._stat_of(key) for key in self._below(path)]

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Many files in one pass under the lock (one consistent moment of the store)."""
        out: dict[str, bytes | OSError] = {}
        with self._lock:
            for path in paths:
                item = self._files.get(path)
                if item is None:
                    out[path] = IsDirectory(path) if path in self._dirs else FileNotFound(path)
                elif max_bytes is not None and len(item.data) > max_bytes:
                    out[path] = FileTooLarge(path, max_bytes)
                else:
                    out[path] = item.data
        return out

    async def delete(self, path: str) -> None:
        with self._lock:
            if path in self._dirs:
                raise IsDirectory(path)
            if self._files.pop(path, None) is None:
                raise FileNotFound(path)
            self._touch_parent(path, datetime.now(UTC))

    async def make_dir(self, path: str) -> None:
        now = datetime.now(UTC)
        with self._lock:
            if path in self._files:
                raise FileExists(path)
            if path in self._dirs:
                return
            self._require_parent(path)
            self._dirs[path] = _Dir(now, now)
            self._touch_parent(path, now)

    async def remove_dir(self, path: str) -> None:
        with self._lock:
            if not path:
                raise DirectoryNotFound(path)  # the root is never removed
            if any(True for _ in self._below(path)):
                raise DirectoryNotEmpty(path)
            del self._dirs[path]
            self._touch_parent(path, datetime.now(UTC))

    async def move(self, src: str, dest: str, *, mode: WriteMode = WriteMode.OVERWRITE) -> None:
        """Rename a file in one step (``capabilities.atomic_rename``)."""
        now = datetime.now(UTC)
        with self._lock:
            item = self._files.get(src)
            if item is None:
                if src in self._dirs:
                    raise IsDirectory(src)
                raise FileNotFound(src)
            if dest in self._dirs:
                raise IsDirectory(dest)
            self._require_parent(dest)
            if dest in self._files and mode is WriteMode.CREATE:
                raise FileExists(dest)
            del self._files[src]
            item.etag = f"m{next(self._versions)}"
            self._files[dest] = item
            self._touch_parent(src, now)
            self._touch_parent(dest, now)

    def __repr__(self) -> str:
        return f"MemoryBackend({len(self._files)} files, {len(self._dirs) - 1} directories)"
