"""The storage contract under a workspace filesystem: a small ABC of storage operations.

A :class:`Backend` knows storage, nothing of agents: no read-only mode, no instructions, no
change feed, no ``..`` handling. Its paths are already normalised and relative to its root
(``""`` is the root, ``"a/b.txt"`` a file below it). :class:`~agentvfs.vfs.BackendFilesystem`
is the agent-facing layer over any backend; the conformance suite
(:class:`agentvfs.testing.FilesystemTests`) runs through it, so a third-party backend is
tested like the bundled ones.

Two things the contract carries for the lifecycle of mounts and caches:

- **versions**: every file's :class:`~agentvfs.vfs.FileStat` has an ``etag`` that changes
  on every write, and :meth:`Backend.write` takes a ``guard`` (a :class:`Version`) and
  replaces the file only if it is still that version: a compare-and-swap, so that two
  writers of one file cannot overwrite each other without an error;
- **object metadata**: a backend with ``capabilities.metadata`` keeps a small string map
  per file (``write(..., metadata=)``, ``FileStat.metadata``), where a mount can keep what
  object stores have no place for (mode, owner, symlink targets).

Errors are the workspace's (:mod:`agentvfs.errors`), each also the matching builtin; a
backend that calls a library raising builtins translates them with :func:`translate` or
:func:`translated`, one table for every backend.
"""

from __future__ import annotations

import contextlib
import enum
import errno as _errno
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..errors import (
    DirectoryNotEmpty,
    FileExists,
    FileNotFound,
    FilesystemError,
    IsDirectory,
    NameTooLongError,
    NotDirectory,
    PermissionDenied,
)
from ._records import Capabilities, FileStat

__all__ = [
    "Backend",
    "ByteRange",
    "KnownVersions",
    "SupportsBatchRead",
    "SupportsReadIntoBuffer",
    "SupportsTreeWalk",
    "Version",
    "WriteMode",
    "translate",
    "translated",
]


class WriteMode(enum.Enum):
    """What a write does when the file exists."""

    #: Replace it.
    OVERWRITE = "overwrite"
    #: Refuse with :class:`~agentvfs.errors.FileExists`: create only.
    CREATE = "create"


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``start`` (inclusive) to ``end`` (exclusive, ``None``: to the end of the file).

    A range past the end of a file reads as fewer bytes, or none.
    """

    start: int
    end: int | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"invalid byte range {self.start}..{self.end}: need 0 <= start <= end")

    def of(self, data: bytes) -> bytes:
        """This range of ``data``."""
        return data[self.start : self.end]


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Version:
    """A version of a file a guarded write expects to replace.

    ``etag`` is compared where both sides have one (exact); otherwise ``modified_at`` to the
    millisecond (what a modification time observed through a tool can carry).
    """

    etag: str | None = None
    modified_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.etag is None and self.modified_at is None:
            raise ValueError("a Version needs an etag or a modification time")

    @classmethod
    def of(cls, stat: FileStat) -> Version:
        """The version ``stat`` describes."""
        return cls(stat.etag, stat.modified_at)

    def matches(self, current: FileStat) -> bool:
        """Whether ``current`` is this version."""
        if self.etag is not None and current.etag is not None:
            return self.etag == current.etag
        if self.modified_at is None:
            return False  # only an etag was expected, and the file has none now
        return _ms(self.modified_at) == _ms(current.modified_at)


class KnownVersions:
    """The version of each file as last seen, by path (the newest ``limit`` paths).

    A caller that kept only a modification time (a read tracker keeps
    ``FileStat.modified_at``) still gets a guard exact to the ``etag`` seen with that time:
    modification times of object stores are only precise to a second, and two writes within
    one millisecond share one time anywhere.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, stat: FileStat) -> None:
        """Record the version ``stat`` shows of the file at ``stat.path``."""
        if stat.etag is None:
            return
        with self._lock:
            self._seen[stat.path] = (_ms(stat.modified_at), stat.etag)
            self._seen.move_to_end(stat.path)
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)

    def guard(self, path: str, expected: datetime | FileStat) -> Version:
        """The version a write of ``path`` that expects ``expected`` must find."""
        if isinstance(expected, FileStat):
            return Version.of(expected)
        with self._lock:
            known = self._seen.get(path)
        if known is not None and known[0] == _ms(expected):
            return Version(known[1], expected)
        return Version(None, expected)


class Backend(ABC):
    """Storage: seven operations on relative paths, and two derived from them.

    Subclasses implement :meth:`stat`, :meth:`list`, :meth:`read`, :meth:`write`,
    :meth:`delete`, :meth:`make_dir` and :meth:`remove_dir`; :meth:`copy` and :meth:`move`
    are derived (read and write; copy and delete) and may be overridden where the storage
    does better (a server-side copy, an atomic rename). Operations are async; a backend
    over blocking I/O runs it in worker threads (``capabilities.blocking``).

    Attributes
    ----------
    provider : str
        A short name of the storage kind (``memory``, ``s3``...), shown to agents.
    capabilities : Capabilities
        What the storage does natively.
    """

    provider: str = "custom"
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    async def stat(self, path: str) -> FileStat:
        """Metadata of the file or directory at ``path``; the root always exists.

        Raises
        ------
        FileNotFound
            Nothing is there.
        """

    @abstractmethod
    async def list(self, path: str) -> list[FileStat]:
        """The children of the directory ``path``, in any order. Their ``metadata`` may be
        empty where the storage lists none (S3); :meth:`stat` has it.

        Raises
        ------
        DirectoryNotFound
            Nothing is there.
        NotDirectory
            A file is there.
        """

    @abstractmethod
    async def read(self, path: str, range: ByteRange | None = None) -> bytes:
        """The content of the file ``path``, or the ``range`` of it.

        Raises
        ------
        FileNotFound
            Nothing is there.
        IsDirectory
            A directory is there.
        """

    @abstractmethod
    async def write(
        self,
        path: str,
        data: bytes,
        *,
        mode: WriteMode = WriteMode.OVERWRITE,
        guard: Version | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> FileStat:
        """Write the whole file ``path`` atomically (readers see the old or the new content)
        and return its new metadata. The parent directory must exist.

        Parameters
        ----------
        mode : WriteMode
            ``CREATE`` refuses to replace an existing file.
        guard : Version, optional
            Replace the file only if it is still this version (compare-and-swap).
        metadata : mapping of str to str, optional
            Kept with the file where ``capabilities.metadata``; replaces what it had.

        Raises
        ------
        DirectoryNotFound
            The parent is missing.
        NotDirectory
            A parent is a file.
        IsDirectory
            A directory is at ``path``.
        FileExists
            ``mode`` is ``CREATE`` and a file is there.
        StaleFileError
            ``guard`` does not match the file (or the file is gone).
        """

    @abstractmethod
    async def delete(self, path: str) -> None:
        """Delete the file ``path``.

        Raises
        ------
        FileNotFound
            Nothing is there.
        IsDirectory
            A directory is there.
        """

    @abstractmethod
    async def make_dir(self, path: str) -> None:
        """Create the directory ``path``; an existing directory is fine. The parent must
        exist.

        Raises
        ------
        FileExists
            A file is there.
        DirectoryNotFound
            The parent is missing.
        NotDirectory
            A parent is a file.
        """

    @abstractmethod
    async def remove_dir(self, path: str) -> None:
        """Remove the empty directory ``path`` (never the root).

        Raises
        ------
        DirectoryNotFound
            Nothing is there.
        NotDirectory
            A file is there.
        DirectoryNotEmpty
            It has entries.
        """

    async def copy(self, src: str, dest: str, *, mode: WriteMode = WriteMode.OVERWRITE) -> None:
        """Copy the file ``src`` to ``dest`` (its parent must exist), keeping its metadata."""
        info = await self.stat(src)
        if info.type == "directory":
            raise IsDirectory(src)
        await self.write(dest, await self.read(src), mode=mode, metadata=info.metadata or None)

    async def move(self, src: str, dest: str, *, mode: WriteMode = WriteMode.OVERWRITE) -> None:
        """Move the file ``src`` to ``dest``: a copy, then the source deleted (atomic only
        where the backend overrides this and says ``capabilities.atomic_rename``)."""
        await self.copy(src, dest, mode=mode)
        await self.delete(src)

    async def close(self) -> None:  # noqa: B027  (an optional hook, empty by default)
        """Release connections and other resources; the stored data stays."""


@runtime_checkable
class SupportsReadIntoBuffer(Protocol):
    """Backends that read part of a file straight into the caller's buffer (no copy)."""

    async def read_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read from ``start`` into ``buffer`` (as many bytes as it holds, fewer at the end
        of the file); how many were read."""
        ...


@runtime_checkable
class SupportsBatchRead(Protocol):
    """Backends that read many files in one go (concurrent GETs, one pass over a store)."""

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Each path's bytes, or the error reading it raised (:class:`~agentvfs.errors.FileTooLarge`
        past ``max_bytes``)."""
        ...


@runtime_checkable
class SupportsTreeWalk(Protocol):
    """Backends that list a whole tree in one request (a paginated listing of a prefix)."""

    async def walk(self, path: str) -> list[FileStat]:
        """Every file and directory below the directory ``path``, in any order; each
        ``FileStat.path`` relative to the backend's root, as :meth:`Backend.stat` gives it.

        Raises
        ------
        DirectoryNotFound
            Nothing is there.
        NotDirectory
            A file is there.
        """
        ...


# -- errors ---------------------------------------------------------------------------------

#: The workspace error for each builtin a storage library raises, most specific first.
_BY_TYPE: tuple[tuple[type[OSError], Callable[[str, str], FilesystemError]], ...] = (
    (FileNotFoundError, lambda path, op: FileNotFound(path)),
    (FileExistsError, lambda path, op: FileExists(path)),
    (IsADirectoryError, lambda path, op: IsDirectory(path)),
    (NotADirectoryError, lambda path, op: NotDirectory(path)),
    (PermissionError, lambda path, op: PermissionDenied(path, op)),
)
#: The same for errors known only by their errno.
_BY_ERRNO: dict[int, Callable[[str, str], FilesystemError]] = {
    _errno.ENOENT: lambda path, op: FileNotFound(path),
    _errno.EEXIST: lambda path, op: FileExists(path),
    _errno.EISDIR: lambda path, op: IsDirectory(path),
    _errno.ENOTDIR: lambda path, op: NotDirectory(path),
    _errno.EACCES: lambda path, op: PermissionDenied(path, op),
    _errno.EPERM: lambda path, op: PermissionDenied(path, op),
    _errno.ENOTEMPTY: lambda path, op: DirectoryNotEmpty(path),
    _errno.ENAMETOOLONG: lambda path, op: NameTooLongError(path),
}


def translate(exc: BaseException, path: str, operation: str) -> FilesystemError:
    """The workspace error for ``exc``, raised by ``operation`` on ``path``: a workspace
    error as it is, a builtin ``OSError`` by its type or errno, anything else as a
    ``FilesystemError`` with its errno (``EIO`` if it has none) and its message."""
    if isinstance(exc, FilesystemError):
        return exc
    if isinstance(exc, OSError):
        for kind, make in _BY_TYPE:
            if isinstance(exc, kind):
                return make(path, operation)
        if exc.errno in _BY_ERRNO:
            return _BY_ERRNO[exc.errno](path, operation)
    code = exc.errno if isinstance(exc, OSError) and exc.errno else _errno.EIO
    err = FilesystemError(f"{operation} failed on {path}: {exc}", _errno.errorcode.get(code, "EIO"), path)
    err.errno = code
    return err


@contextlib.contextmanager
def translated(path: str, operation: str) -> Iterator[None]:
    """Raise what the block raises as workspace errors (``raise ... from`` the original)."""
    try:
        yield
    except FilesystemError:
        raise
    except OSError as exc:
        raise translate(exc, path, operation) from exc
