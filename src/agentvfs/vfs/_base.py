"""The backend contract: a small ABC with concrete operations derived from it."""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import secrets
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.to_thread

from ..errors import (
    FileDecodeError,
    FileExists,
    FileNotFound,
    FilesystemNotReadyError,
    FileTooLarge,
    IsDirectory,
    PermissionDenied,
    StaleFileError,
    WorkspaceReadOnlyError,
)
from . import _paths
from ._backend import Version
from ._mime import normalize_extensions
from ._posix import PosixAttributes
from ._records import Capabilities, FileEntry, FileStat, GrepFileResult

if TYPE_CHECKING:
    from .._context import RequestContext

__all__ = [
    "AnnouncedUpload",
    "ChangeListener",
    "SupportsConditionalUpload",
    "SupportsGrep",
    "SupportsHardLinks",
    "SupportsListStats",
    "SupportsLocalAttributes",
    "SupportsLocalStaging",
    "SupportsPinnedRead",
    "SupportsPosixAttributes",
    "SupportsRangedRead",
    "SupportsReadMany",
    "SupportsStreamingUpload",
    "SupportsTransfer",
    "SupportsWalk",
    "UploadStream",
    "WorkspaceFilesystem",
    "as_bytes",
    "attribute_storage",
    "check_version",
    "decoded",
    "download_file",
    "drop_hidden",
    "filter_extension",
    "list_stats",
    "make_hard_link",
    "make_special",
    "new_id",
    "order_tree",
    "publish_file",
    "read_each",
    "read_local",
    "read_many",
    "read_range",
    "rewrite_file",
    "run_sync",
    "set_attributes",
    "upload_file",
    "walk",
    "write_local",
]

_log = logging.getLogger("agentvfs")

#: A change listener gets the filesystem, the operation name and the paths it changed.
ChangeListener = Callable[["WorkspaceFilesystem", str, tuple[str, ...]], None]

# The operations that change storage, and which of their arguments are the changed paths.
_MUTATORS: dict[str, tuple[int, ...]] = {
    "write_file": (0,),
    "append_file": (0,),
    "delete_file": (0,),
    "mkdir": (0,),
    "rmdir": (0,),
    "copy_file": (1,),
    "move_file": (0, 1),
    "upload_file": (1,),
}

#: Set while a caller (a FUSE mount) changes storage on its own behalf, so that its own
#: changes are not reported back to it.
change_origin: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "agentvfs_change_origin", default=None
)


def _announcing(name: str, method: Callable[..., Any], positions: tuple[int, ...]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(self: WorkspaceFilesystem, *args: Any, **kwargs: Any) -> Any:
        result = await method(self, *args, **kwargs)
        if self._listeners:
            paths = tuple(str(args[i]) for i in positions if i < len(args))
            self._announce(name, paths)
        return result

    wrapper.__announcing__ = True  # type: ignore[attr-defined]
    return wrapper

T = TypeVar("T")

_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
        if not n:
            return out


def new_id(prefix: str) -> str:
    """Return ``<prefix>-<base36 ms timestamp>-<6 random base36 chars>``, the reference's id form."""
    rand = "".join(secrets.choice(_BASE36) for _ in range(6))
    return f"{prefix}-{_base36(int(time.time() * 1000))}-{rand}"


async def run_sync(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call in a worker thread.

    Cancellation (and so ``operation_timeout``) abandons the thread rather than waiting for
    it: writes therefore stage their data and commit in one step, so an abandoned write
    either lands whole or not at all.
    """
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


@runtime_checkable
class SupportsWalk(Protocol):
    """A filesystem that lists a whole tree in as few round trips as the backend allows."""

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """List everything below ``path``; names are relative to it (``dir/child``)."""
        ...


@runtime_checkable
class SupportsRangedRead(Protocol):
    """A filesystem that reads part of a file without fetching the rest (a ranged GET)."""

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Return bytes ``start`` (inclusive) to ``end`` (exclusive) of a file."""
        ...


@runtime_checkable
class SupportsReadInto(Protocol):
    """A filesystem that reads part of a file straight into the caller's buffer."""

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read bytes from ``start`` into ``buffer`` (as many as it holds, fewer at the end
        of the file) and return how many. On error the buffer may hold part of the range."""
        ...


@runtime_checkable
class SupportsPinnedRead(Protocol):
    """A filesystem that reads part of one version of a file: a reader that opened a file
    keeps reading the bytes of that version, or learns it is gone, never the next version's
    bytes in the old one's place."""

    async def read_range_pinned(self, path: str, start: int, buffer: memoryview, version: str) -> int:
        """:meth:`SupportsReadInto.read_range_into` of the version ``version`` (a
        ``FileStat.etag``) only, where the store can name a version in a read; elsewhere of
        what is there.

        Raises
        ------
        StaleFileError
            ``ESTALE``: the file is not that version any more, or gone.
        """
        ...


@runtime_checkable
class SupportsReadMany(Protocol):
    """A filesystem that fetches many files in concurrent batches (one GET each, no HEAD)."""

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Read whole files; each path maps to its bytes or to the error reading it raised."""
        ...


async def walk(
    fs: WorkspaceFilesystem, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
) -> list[FileEntry]:
    """List a whole tree: natively (one paginated listing on object stores) where the
    filesystem can, else by a recursive ``readdir``; hidden entries dropped unless asked for."""
    if isinstance(fs, SupportsWalk):
        return await fs.walk(path, max_depth=max_depth, include_hidden=include_hidden)
    entries = await fs.readdir(path, recursive=True, max_depth=max_depth)
    return entries if include_hidden else drop_hidden(entries)


async def read_range(
    fs: WorkspaceFilesystem, path: str, start: int, end: int, *, version: str | None = None
) -> bytes:
    """Read bytes ``start`` to ``end`` of a file: natively where the filesystem can, else by
    reading it whole and slicing. With ``version``, of that version only where the
    filesystem can tell (:class:`SupportsPinnedRead`)."""
    if version is not None and isinstance(fs, SupportsPinnedRead) and end > start:
        buffer = bytearray(end - start)
        count = await fs.read_range_pinned(path, start, memoryview(buffer), version)
        del buffer[count:]
        return bytes(buffer)
    if isinstance(fs, SupportsRangedRead):
        return await fs.read_range(path, start, end)
    data = await fs.read_file(path)
    return (data if isinstance(data, bytes) else data.encode())[start:end]


async def read_range_into(
    fs: WorkspaceFilesystem, path: str, start: int, buffer: memoryview, *, version: str | None = None
) -> int:
    """Read bytes from ``start`` of a file into ``buffer``: natively where the filesystem can
    (no buffer of its own), else through :func:`read_range` and a copy. ``version`` as for
    :func:`read_range`."""
    if version is not None and isinstance(fs, SupportsPinnedRead):
        return await fs.read_range_pinned(path, start, buffer, version)
    if isinstance(fs, SupportsReadInto):
        return await fs.read_range_into(path, start, buffer)
    data = await read_range(fs, path, start, start + len(buffer))
    buffer[: len(data)] = data
    return len(data)


class ReadsFiles(Protocol):
    """Anything that reads a whole file by path: a filesystem, or a skill source."""

    async def read_file(self, path: str) -> str | bytes: ...


async def read_many(
    fs: ReadsFiles, paths: Sequence[str], *, concurrency: int = 8, max_bytes: int | None = None
) -> dict[str, bytes | OSError]:
    """Read many files: natively in batches where the filesystem can, else ``concurrency``
    reads at a time. Each path maps to its bytes (text is encoded as UTF-8) or to its error;
    a file larger than ``max_bytes`` maps to :class:`~agentvfs.errors.FileTooLarge` (on local
    disk without reading past the limit, whatever size a listing showed before)."""
    if isinstance(fs, SupportsReadMany):
        if max_bytes is None:
            return await fs.read_many(paths)
        return await fs.read_many(paths, max_bytes=max_bytes)
    return await read_each(fs.read_file, paths, concurrency=concurrency, max_bytes=max_bytes)


async def read_each(
    read: Callable[[str], Awaitable[str | bytes]],
    paths: Sequence[str],
    *,
    concurrency: int = 8,
    max_bytes: int | None = None,
) -> dict[str, bytes | OSError]:
    """:func:`read_many` by one ``read`` call per path, ``concurrency`` at a time."""
    out: dict[str, bytes | OSError] = {}
    limiter = anyio.Semaphore(concurrency)

    async def one(path: str) -> None:
        async with limiter:
            try:
                data = await read(path)
                raw = data if isinstance(data, bytes) else data.encode()
                too_large = max_bytes is not None and len(raw) > max_bytes
                out[path] = FileTooLarge(path, max_bytes) if max_bytes is not None and too_large else raw
            except OSError as exc:
                out[path] = exc

    async with anyio.create_task_group() as tg:
        for path in paths:
            tg.start_soon(one, path)
    return out


@runtime_checkable
class SupportsReadBeneath(Protocol):
    """Backends with symlinks that can read a file without leaving a given directory."""

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read ``path`` (relative) below ``directory``, never leaving it."""
        ...


async def read_file_beneath(
    fs: ReadsFiles, directory: str, path: str, *, max_bytes: int | None = None
) -> bytes:
    """Read the file ``path`` (relative to ``directory``) without leaving ``directory``.

    On local disk symlinks are followed only while they stay below ``directory``, and the
    whole resolution happens beneath a descriptor of it (a link swapped in meanwhile cannot
    lead out). Storage without symlinks needs only the lexical check.

    Raises
    ------
    PermissionDenied
        ``path`` is absolute, climbs above ``directory`` with ``..``, or (local disk) leads
        out of it through a symlink.
    """
    if isinstance(fs, SupportsReadBeneath):
        return await fs.read_file_beneath(directory, path, max_bytes=max_bytes)
    try:
        if path.startswith("/"):
            raise PermissionDenied(path, "access")
        rest = _paths.normalize(path)
    except PermissionDenied:
        raise PermissionDenied(path, "access (it leads outside its directory)") from None
    target = _paths.join(directory.rstrip("/"), rest) if directory.strip("/") else rest
    if max_bytes is not None:
        got = (await read_many(fs, [target], max_bytes=max_bytes))[target]
        if isinstance(got, OSError):
            raise got
        return got
    data = await fs.read_file(target)
    return data if isinstance(data, bytes) else data.encode("utf-8")


@runtime_checkable
class SupportsListStats(Protocol):
    """Backends that return full metadata of every child in one listing request."""

    async def list_stats(self, path: str = "") -> list[FileStat]:
        """Metadata of the children of ``path`` (not recursive), in listing order."""
        ...


class UploadStream(Protocol):
    """A file being uploaded while it is written: invisible until ``commit``."""

    async def write(self, data: bytes) -> None:
        """Append bytes (sent in parts as they accumulate)."""
        ...

    async def commit(self) -> None:
        """Finish the upload: the file appears whole, replacing any previous one."""
        ...

    async def abort(self) -> None:
        """Drop the upload; storage keeps what it had."""
        ...


class AnnouncedUpload:
    """An upload stream whose commit is announced on its filesystem's change feed (as the
    ``upload_file`` of its path), like every other change."""

    def __init__(self, stream: UploadStream, owner: WorkspaceFilesystem, path: str) -> None:
        self._stream = stream
        self._owner = owner
        self._path = path

    async def write(self, data: bytes) -> None:
        await self._stream.write(data)

    async def commit(self) -> None:
        await self._stream.commit()
        self._owner._announce("upload_file", (self._path,))

    async def abort(self) -> None:
        await self._stream.abort()

    def ticket(self) -> dict[str, str] | None:
        """The stream's ``ticket()`` where it has one (see :class:`SupportsUploadRecovery`)."""
        ticket = getattr(self._stream, "ticket", None)
        return ticket() if callable(ticket) else None


@runtime_checkable
class SupportsUploadRecovery(Protocol):
    """Filesystems whose streamed uploads can be aborted by another process: a stream's
    ``ticket()`` names it in storage once its first part is out, and ``abort_upload`` drops
    it (after a crash, an incomplete multipart upload would otherwise stay in the bucket)."""

    async def abort_upload(self, ticket: Mapping[str, str]) -> bool:
        """Abort the upload ``ticket`` names; False when storage no longer knows it."""
        ...


@runtime_checkable
class SupportsStreamingUpload(Protocol):
    """Filesystems and storage backends (:class:`~agentvfs.vfs.Backend`) that can upload a
    file while it is still being written (multipart)."""

    async def open_upload(self, path: str, *, part_size: int) -> UploadStream | None:
        """Start a streamed upload of ``path``, or None where this backend gains nothing.
        Filesystems that keep attributes as object metadata (:class:`SupportsPosixAttributes`)
        also take ``attributes`` and ``keep``, as their ``publish_file`` does."""
        ...


@runtime_checkable
class SupportsTransfer(Protocol):
    """Filesystems and storage backends (:class:`~agentvfs.vfs.Backend`) that move whole files
    between local disk and storage without holding them in memory (multipart uploads,
    streamed downloads).
    A backend's ``upload_file`` needs the parent directory to exist."""

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish the local file as ``path``, atomically, creating parents."""
        ...

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path``."""
        ...


@runtime_checkable
class SupportsConditionalUpload(Protocol):
    """Filesystems that publish a local file only over the version of it the caller saw (or
    only where nothing is): what keeps two writers of one file from losing each other's
    writes without an error."""

    async def publish_file(
        self, local_path: str, path: str, *, expected: Version | None = None, create: bool = False
    ) -> str | None:
        """Publish ``local_path`` as ``path`` (whole and atomic, like ``upload_file``), only
        over the version ``expected`` or, with ``create``, only where nothing is; returns the
        version now there where the store gives it with the write, else None.

        Raises
        ------
        StaleFileError
            ``ESTALE``: the file is another version now, or gone (``actual_mtime`` None).
        FileExists
            ``EEXIST``: ``create``, and something is there.
        """
        ...


async def publish_file(
    fs: WorkspaceFilesystem,
    local_path: str,
    path: str,
    *,
    expected: Version | None = None,
    create: bool = False,
    attributes: PosixAttributes | None = None,
    keep: Mapping[str, str] | None = None,
) -> str | None:
    """:meth:`SupportsConditionalUpload.publish_file` where ``fs`` has it; elsewhere the
    version is checked with a ``stat`` just before an ``upload_file`` (a race between the two
    that the filesystem cannot close). ``attributes`` (and, on object stores, ``keep``) go
    with the file where ``fs`` keeps attributes (:class:`SupportsPosixAttributes`)."""
    if (attributes is not None or keep) and attribute_storage(fs) is not None:
        assert isinstance(fs, SupportsPosixAttributes)
        return await fs.publish_file(
            local_path, path, expected=expected, create=create, attributes=attributes, keep=keep
        )
    if isinstance(fs, SupportsConditionalUpload):
        return await fs.publish_file(local_path, path, expected=expected, create=create)
    await check_version(fs, path, expected=expected, create=create)
    await upload_file(fs, local_path, path)
    return None


def attribute_storage(fs: WorkspaceFilesystem) -> Literal["native", "metadata"] | None:
    """Where ``fs`` keeps POSIX attributes (:class:`SupportsPosixAttributes`), or None."""
    if isinstance(fs, SupportsPosixAttributes):
        return fs.attribute_storage
    return None


async def set_attributes(
    fs: WorkspaceFilesystem, path: str, attrs: PosixAttributes, *, expected: Version | None = None
) -> str | None:
    """:meth:`SupportsPosixAttributes.set_attributes`; ``PermissionDenied`` where ``fs``
    keeps no attributes."""
    if attribute_storage(fs) is None:
        raise PermissionDenied(path, "set attributes (this storage keeps none)")
    assert isinstance(fs, SupportsPosixAttributes)
    return await fs.set_attributes(path, attrs, expected=expected)


async def make_special(fs: WorkspaceFilesystem, path: str, attrs: PosixAttributes) -> None:
    """:meth:`SupportsPosixAttributes.make_special`; ``PermissionDenied`` where ``fs``
    keeps no special files."""
    if attribute_storage(fs) is None:
        raise PermissionDenied(path, "create a special file (this storage keeps none)")
    assert isinstance(fs, SupportsPosixAttributes)
    await fs.make_special(path, attrs)


async def make_hard_link(fs: WorkspaceFilesystem, src: str, dest: str) -> None:
    """:meth:`SupportsHardLinks.make_hard_link`; ``PermissionDenied`` (``EPERM``) where the
    storage has no hard links (a copy would drift apart from the original)."""
    if not isinstance(fs, SupportsHardLinks):
        raise PermissionDenied(dest, "link (this storage has no hard links)")
    await fs.make_hard_link(src, dest)


async def rewrite_file(
    fs: WorkspaceFilesystem,
    local_path: str,
    path: str,
    *,
    expected: Version | None = None,
    attributes: PosixAttributes | None = None,
) -> str | None:
    """:meth:`SupportsHardLinks.rewrite_file`; ``PermissionDenied`` where the storage has no
    hard links (a publish replaces the file there)."""
    if not isinstance(fs, SupportsHardLinks):
        raise PermissionDenied(path, "write in place (this storage has no hard links)")
    return await fs.rewrite_file(local_path, path, expected=expected, attributes=attributes)


async def check_version(
    fs: WorkspaceFilesystem, path: str, *, expected: Version | None = None, create: bool = False
) -> None:
    """Refuse, as a conditional publish would, unless ``path`` is the version ``expected``
    or, with ``create``, nothing is there: one ``stat``, for writes whose storage call
    carries no condition of its own.

    Raises
    ------
    StaleFileError
        ``ESTALE``: another version is there, or none (``actual_mtime`` None).
    FileExists
        ``EEXIST``: ``create``, and something is there.
    """
    if expected is None and not create:
        return
    try:
        current = await fs.stat(path)
    except FileNotFoundError:
        if expected is not None:
            raise StaleFileError(path, expected.modified_at, None) from None
        return
    if create:
        raise FileExists(path)
    if expected is not None and not expected.matches(current):
        raise StaleFileError(path, expected.modified_at, current.modified_at)


@runtime_checkable
class SupportsWalkStats(Protocol):
    """Filesystems that give the metadata of a whole tree's files from one listing."""

    async def walk_stats(self, path: str = "", *, max_depth: int | None = None) -> list[tuple[str, FileStat]]:
        """``(name relative to path, metadata)`` of every file below ``path``."""
        ...


async def walk_stats(
    fs: WorkspaceFilesystem, path: str = "", *, max_depth: int | None = None
) -> list[tuple[str, FileStat]]:
    """The metadata of every file below ``path`` with names relative to it: from one listing
    where the filesystem can, else a walk and one :func:`list_stats` per directory. Files
    below a linked directory are left out (a walk does not follow links)."""
    if isinstance(fs, SupportsWalkStats):
        return await fs.walk_stats(path, max_depth=max_depth)
    return await walk_stats_by_listing(fs, path, max_depth=max_depth)


@runtime_checkable
class SupportsPutNew(Protocol):
    """Filesystems that create a file in one request, checking no directory above it."""

    async def put_new(self, path: str, content: bytes) -> None:
        """Create ``path`` holding ``content`` (``FileExists`` where a file is)."""
        ...


async def put_new(fs: WorkspaceFilesystem, path: str, content: bytes) -> None:
    """Create the file ``path`` holding ``content``, creating its parents; never replace one.

    For trees only their owner writes, whose names say what they hold (content-addressed
    blobs): where ``fs`` can (:class:`SupportsPutNew`, an object store), this is one
    create-only PUT, without the checks a ``write_file`` makes that no file is above ``path``
    and no directory at it, which on an object store cost a listing of the parent when its
    kept listing has expired. Elsewhere it is ``write_file(path, content, overwrite=False)``.

    Raises
    ------
    FileExists
        A file is at ``path`` (where the store can tell: a store without conditional PUTs
        replaces it, with the same bytes when names are content hashes).
    """
    if isinstance(fs, SupportsPutNew):
        await fs.put_new(path, content)
        return
    await fs.write_file(path, content, overwrite=False)


async def walk_stats_by_listing(
    fs: WorkspaceFilesystem, path: str = "", *, max_depth: int | None = None
) -> list[tuple[str, FileStat]]:
    """:func:`walk_stats` for any filesystem: a walk, then one :func:`list_stats` per
    directory holding files."""
    entries = await walk(fs, path, max_depth=max_depth)
    linked = tuple(e.name + "/" for e in entries if e.type == "directory" and e.is_symlink)
    wanted: dict[str, set[str]] = {}
    for entry in entries:
        if entry.type == "file" and not (linked and entry.name.startswith(linked)):
            parent, _, name = entry.name.rpartition("/")
            wanted.setdefault(parent, set()).add(name)
    out: list[tuple[str, FileStat]] = []
    base = _paths.normalize(path)
    for parent, names in wanted.items():
        try:
            stats = await list_stats(fs, _paths.join(base, parent) if parent else base or ".")
        except FileNotFoundError:
            continue  # removed since the walk
        for stat in stats:
            name = _paths.basename(str(stat.path).rstrip("/")) or stat.name
            if stat.type == "file" and name in names:
                out.append((f"{parent}/{name}" if parent else name, stat))
    return out


async def list_stats(fs: WorkspaceFilesystem, path: str = "") -> list[FileStat]:
    """Metadata of every child of ``path``: one listing where the backend can, else a
    listing and one ``stat`` per entry."""
    if isinstance(fs, SupportsListStats):
        return await fs.list_stats(path)
    out: list[FileStat] = []
    for entry in await fs.readdir(path):
        try:
            out.append(await fs.stat(_paths.join(_paths.normalize(path), entry.name)))
        except FileNotFoundError:
            continue  # removed between the listing and the stat
    return out


async def upload_file(fs: WorkspaceFilesystem, local_path: str, path: str) -> None:
    """Publish a local file as ``path`` (whole and atomic, like ``write_file``)."""
    if isinstance(fs, SupportsTransfer):
        await fs.upload_file(local_path, path)
        return
    data = await run_sync(read_local, local_path)
    await fs.write_file(path, data)


async def download_file(fs: WorkspaceFilesystem, path: str, local_path: str) -> None:
    """Copy ``path`` into the local file ``local_path`` (replacing its content)."""
    if isinstance(fs, SupportsTransfer):
        await fs.download_file(path, local_path)
        return
    data = await fs.read_file(path)
    assert isinstance(data, bytes)
    await run_sync(write_local, local_path, data)


def read_local(local_path: str) -> bytes:
    """The bytes of the local file ``local_path``."""
    with open(local_path, "rb") as f:
        return f.read()


def write_local(local_path: str, data: bytes) -> None:
    """Replace the content of the local file ``local_path`` with ``data``."""
    with open(local_path, "wb") as f:
        f.write(data)


def copy_local(src: str, dest: str) -> None:
    """Copy a local file's bytes (kernel-side where the OS can)."""
    shutil.copyfile(src, dest)


@runtime_checkable
class SupportsLocalFiles(Protocol):
    """Backends on this machine's disk that hand out descriptors of their files, for readers
    and writers that work on descriptors (a FUSE mount's passthrough). Synchronous: they are
    called from threads that must not wait for an event loop.

    Descriptors, not paths: a path handed out could be redirected by a symlink swapped in
    before it is opened; a descriptor names what the backend resolved, inside its root.
    """

    def local_open(self, path: str, flags: int, mode: int = 0o600) -> int:
        """Open the regular file at ``path`` with ``os.open`` ``flags``; a new descriptor."""
        ...

    def local_unlink(self, path: str) -> None:
        """Remove the name ``path`` on disk."""
        ...


@runtime_checkable
class SupportsLocalAttributes(Protocol):
    """Backends on local disk that keep a file's permission bits, owner and times, and let a
    FUSE mount set them (``chmod``, ``chown``, ``utime`` through the mount reach the disk).
    Synchronous, as :class:`SupportsLocalFiles`."""

    def local_set_attributes(
        self,
        path: str,
        *,
        mode: int | None = None,
        owner: tuple[int, int] | None = None,
        times_ns: tuple[int, int] | None = None,
        expected: Version | None = None,
    ) -> str | None:
        """Set what is given of the mode bits, the owner ``(uid, gid)`` (-1 keeps one) and the
        access and modification times (nanoseconds) of ``path``, only while the regular file
        there is the version ``expected`` when one is given. Returns the version of a regular
        file after the change (times are part of it), None for any other entry.

        Raises
        ------
        StaleFileError
            ``expected`` is not what is there.
        """
        ...

    def local_lstat(self, path: str) -> os.stat_result:
        """The status of the entry ``path`` itself (a symbolic link is not followed)."""
        ...


@runtime_checkable
class SupportsPosixAttributes(Protocol):
    """Filesystems that keep POSIX attributes (mode, owner, times) and special files
    (symbolic links, FIFOs, sockets, device nodes) in storage, so that a FUSE mount shows
    after a remount what it showed before: natively on local disk, as object metadata on
    object stores (:mod:`agentvfs.vfs._posix` has the names).

    ``attribute_storage`` says which, or None where this filesystem's storage keeps none
    (then the methods refuse with ``PermissionDenied``)."""

    @property
    def attribute_storage(self) -> Literal["native", "metadata"] | None: ...

    async def set_attributes(self, path: str, attrs: PosixAttributes, *, expected: Version | None = None) -> str | None:
        """Keep ``attrs`` with the file ``path`` (metadata stores: without sending its data
        again, and only while it is the version ``expected``); returns its version now,
        None where unknown.

        Raises
        ------
        StaleFileError
            ``ESTALE``: ``expected`` is not what is there, or the file is gone.
        """
        ...

    async def make_special(self, path: str, attrs: PosixAttributes) -> None:
        """Create the symbolic link (``attrs.target``), FIFO, socket or device node ``path``
        (the kind is ``attrs.mode``'s file-type bits), only where nothing is.

        Raises
        ------
        FileExists
            Something is at ``path``.
        """
        ...

    async def publish_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        create: bool = False,
        attributes: PosixAttributes | None = None,
        keep: Mapping[str, str] | None = None,
    ) -> str | None:
        """:meth:`SupportsConditionalUpload.publish_file`, the new file carrying
        ``attributes`` and, on metadata stores, the other tools' metadata keys ``keep``."""
        ...


@runtime_checkable
class SupportsHardLinks(Protocol):
    """Filesystems whose storage has hard links (local disk)."""

    async def make_hard_link(self, src: str, dest: str) -> None:
        """Make ``dest`` a second name of the file ``src``."""
        ...

    async def rewrite_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        attributes: PosixAttributes | None = None,
    ) -> str | None:
        """Replace the content of the file ``path`` with the local file ``local_path`` in
        place, keeping the file (and so every other name of it), only while it is the
        version ``expected``; with ``attributes``' times. Not atomic (a rename would split the
        names), but checked and written under the lock that guarded publishes take.
        Returns the version now there.

        Raises
        ------
        StaleFileError
            ``expected`` is not what is there, or the file is gone.
        """
        ...


@runtime_checkable
class SupportsLocalStaging(Protocol):
    """Backends on local disk that lend a directory beside their files, where a FUSE mount
    stages what is written so that publishing is a link and a rename instead of a copy."""

    def local_staging_dir(self) -> str | None:
        """The directory (a ``/proc/self/fd/N`` path), or None where there is none; each
        call is given back with :meth:`local_staging_release`."""
        ...

    def local_staging_release(self) -> None:
        """One user of :meth:`local_staging_dir` is done."""
        ...


@runtime_checkable
class SupportsGrep(Protocol):
    """A filesystem that searches file contents itself (batched reads, or server side)."""

    async def grep(
        self,
        pattern: str,
        path: str = "",
        *,
        case_sensitive: bool = True,
        include_hidden: bool = False,
        max_count_per_file: int | None = None,
        max_total_matches: int | None = None,
        context_lines: int = 0,
    ) -> list[GrepFileResult]:
        """Search text files below ``path`` for a Python regular expression."""
        ...


class WorkspaceFilesystem(ABC):
    """A filesystem an agent can work in: the reference's ``WorkspaceFilesystem`` contract.

    Subclasses implement the seven abstract operations; appending, copying, moving and
    ``exists`` are derived from them and may be overridden where the backend does better.
    Every operation initialises the filesystem on first use (``init`` is idempotent), and
    paths are relative to the filesystem root with ``/`` separators.

    Parameters
    ----------
    id : str
        Stable identifier.
    read_only : bool
        Refuse every write with :class:`~agentvfs.errors.WorkspaceReadOnlyError` before any
        request reaches the storage.
    display_name, description, icon : str, optional
        Shown to agents in instructions and listings of mount points.
    instructions : str or callable, optional
        Replaces the default instructions (a string; ``""`` suppresses them), or a function
        ``fn({"default_instructions": str, "request_context": ctx}) -> str``.
    text_extensions : iterable of str
        Extra extensions that grep reads as text.
    """

    name: ClassVar[str] = "WorkspaceFilesystem"
    provider: str = "unknown"
    capabilities: Capabilities = Capabilities()
    _listeners: tuple[ChangeListener, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every implementation of a changing operation announces its paths once it succeeded,
        # so mounts of this filesystem drop what they cached (one mechanism for every backend).
        for name, positions in _MUTATORS.items():
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "__announcing__", False):
                setattr(cls, name, _announcing(name, method, positions))

    def __init__(
        self,
        *,
        id: str,
        read_only: bool = False,
        display_name: str | None = None,
        description: str | None = None,
        icon: str | None = None,
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        text_extensions: Iterable[str] = (),
    ) -> None:
        self.id = id
        self.read_only = bool(read_only)
        self.display_name = display_name
        self.description = description
        self.icon = icon
        self.text_extensions = normalize_extensions(text_extensions)
        self.status: str = "pending"
        self.error: str | None = None
        self._instructions = instructions
        self._init_done: anyio.Event | None = None

    # -- change feed ----------------------------------------------------------------------

    def watch(self, listener: ChangeListener) -> Callable[[], None]:
        """Call ``listener(fs, operation, paths)`` after every successful change made through
        this object; returns a function that stops the calls.

        Listeners run synchronously in the changing task; they must be quick and never raise
        (an exception is logged and ignored).
        """
        self._listeners = (*self._listeners, listener)

        def unwatch() -> None:
            self._listeners = tuple(cb for cb in self._listeners if cb is not listener)

        return unwatch

    def _announce(self, operation: str, paths: tuple[str, ...]) -> None:
        for listener in self._listeners:
            try:
                listener(self, operation, paths)
            except Exception:
                _log.exception("change listener failed for %s %s", operation, paths)

    # -- lifecycle -----------------------------------------------------------------------

    async def init(self) -> None:
        """Prepare the backend (create the root where that applies); idempotent.

        Concurrent calls share one initialisation. A failure sets ``status`` to ``error`` and
        is raised.
        """
        if self.status == "ready":
            return
        if self._init_done is not None:
            await self._init_done.wait()
            return
        done = self._init_done = anyio.Event()
        self.status = "initializing"
        try:
            await self.setup()
        except BaseException as exc:
            self.status = "error"
            self.error = str(exc)
            raise
        else:
            self.status = "ready"
            self.error = None
        finally:
            self._init_done = None
            done.set()

    async def destroy(self) -> None:
        """Release resources. Never deletes stored data."""
        if self.status in ("destroyed", "destroying"):
            return
        if self.status == "pending":
            self.status = "destroyed"
            return
        self.status = "destroying"
        try:
            await self.teardown()
        except BaseException as exc:
            self.status = "error"
            self.error = str(exc)
            raise
        self.status = "destroyed"

    async def setup(self) -> None:  # noqa: B027  (an optional hook, empty by default)
        """Hook run by :meth:`init`; override to create roots or open connections."""

    async def teardown(self) -> None:  # noqa: B027
        """Hook run by :meth:`destroy`."""

    async def probe(self) -> None:
        """Make one request that proves the storage answers (used before mounting).

        Raises
        ------
        OSError
            The storage cannot be reached or does not exist.
        """
        await self.stat("")

    async def ensure_ready(self) -> None:
        """Initialise on first use; raise if the filesystem cannot become ready.

        Raises
        ------
        FilesystemNotReadyError
            Initialisation did not reach ``ready``.
        """
        if self.status != "ready":
            await self.init()
            if self.status != "ready":
                raise FilesystemNotReadyError(self.id)

    def _check_writable(self, operation: str) -> None:
        if self.read_only:
            raise WorkspaceReadOnlyError(operation)

    # -- the required core -----------------------------------------------------------------

    @abstractmethod
    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """Read a whole file: ``bytes`` without ``encoding``, else decoded text.

        Raises
        ------
        FileNotFound
            ``ENOENT``.
        IsDirectory
            ``EISDIR``.
        PermissionDenied
            ``EACCES``: outside the root.
        UnicodeDecodeError
            The bytes are not valid in ``encoding``.
        """

    @abstractmethod
    async def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        recursive: bool = True,
        overwrite: bool = True,
        mime_type: str | None = None,
        expected_mtime: datetime | FileStat | None = None,
    ) -> None:
        """Write a whole file atomically: readers see the old or the new content, never a mix.

        Parameters
        ----------
        path : str
            Target file.
        content : str or bytes
            ``str`` is written as UTF-8.
        recursive : bool
            Create missing parent directories; if False the parent must exist.
        overwrite : bool
            If False, refuse to replace an existing file.
        mime_type : str, optional
            Content type to record where the backend keeps one (S3, GCS); ignored elsewhere.
        expected_mtime : datetime or FileStat, optional
            Optimistic concurrency: refuse if the file changed since this was observed. A
            ``FileStat`` also compares its ``etag`` where the backend has versions.

        Raises
        ------
        WorkspaceReadOnlyError
            ``EROFS``, before any request.
        DirectoryNotFound
            ``ENOENT``: parent missing and ``recursive`` is False.
        NotDirectory
            ``ENOTDIR``: a parent is a file.
        FileExists
            ``EEXIST``: ``overwrite`` is False and the file exists.
        IsDirectory
            ``EISDIR``: the path is a directory.
        StaleFileError
            ``ESTALE``: the file changed since ``expected_mtime``.
        """

    @abstractmethod
    async def delete_file(self, path: str, *, force: bool = False) -> None:
        """Delete a file.

        Raises
        ------
        FileNotFound
            ``ENOENT``, unless ``force``.
        IsDirectory
            ``EISDIR``.
        """

    @abstractmethod
    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Create a directory; an existing directory is fine.

        Raises
        ------
        FileExists
            ``EEXIST``: a file is there.
        DirectoryNotFound
            ``ENOENT``: parent missing and ``recursive`` is False.
        NotDirectory
            ``ENOTDIR``: a parent is a file.
        """

    @abstractmethod
    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Remove a directory.

        Raises
        ------
        DirectoryNotFound
            ``ENOENT``, unless ``force``.
        NotDirectory
            ``ENOTDIR``: a file is there.
        DirectoryNotEmpty
            ``ENOTEMPTY``: entries remain and ``recursive`` is False.
        PermissionDenied
            ``EACCES``: the root itself.
        """

    @abstractmethod
    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        """List a directory, sorted by name; recursive listings put children after their parent.

        Parameters
        ----------
        path : str
            Directory to list.
        recursive : bool
            Descend into subdirectories (names become ``dir/child``).
        extension : str or list of str, optional
            Keep only files with these extensions (``.ts`` or ``ts``); directories stay.
        max_depth : int, optional
            Depth limit for recursive listings (default 100).

        Raises
        ------
        DirectoryNotFound
            ``ENOENT``.
        NotDirectory
            ``ENOTDIR``.
        """

    @abstractmethod
    async def stat(self, path: str) -> FileStat:
        """Return metadata of a file or directory.

        Raises
        ------
        FileNotFound
            ``ENOENT``.
        """

    # -- derived operations ------------------------------------------------------------------

    async def exists(self, path: str) -> bool:
        """Tell whether anything exists at ``path``. Containment violations still raise."""
        try:
            await self.stat(path)
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            return False
        return True

    async def append_file(self, path: str, content: str | bytes) -> None:
        """Append to a file, creating it (and its parents) if missing.

        The result is written whole, so a failure leaves the old content.
        """
        self._check_writable("append_file")
        data = content.encode() if isinstance(content, str) else bytes(content)
        try:
            old = await self.stat(path)
        except FileNotFoundError:
            await self.write_file(path, data, overwrite=False)
            return
        if old.type == "directory":
            raise IsDirectory(path)
        previous = await self.read_file(path)
        assert isinstance(previous, bytes)
        await self.write_file(path, previous + data, expected_mtime=old)

    async def copy_file(
        self, src: str, dest: str, *, overwrite: bool = True, recursive: bool = False
    ) -> None:
        """Copy a file, or a directory tree with ``recursive``; parents of ``dest`` are created.

        Raises
        ------
        FileNotFound
            ``src`` is missing.
        IsDirectory
            ``src`` is a directory and ``recursive`` is False, or ``dest`` is a directory.
        FileExists
            ``dest`` exists and ``overwrite`` is False (files only; a tree copy skips them).
        """
        self._check_writable("copy_file")
        info = await self._stat_src(src)
        if info.type == "directory":
            if not recursive:
                raise IsDirectory(src)
            await self._copy_tree(src, dest, overwrite=overwrite)
            return
        data = await self.read_file(src)
        await self._write_copy(dest, data, overwrite=overwrite)

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        """Move a file or directory: copy then delete where the backend cannot rename.

        Raises
        ------
        FileNotFound
            ``src`` is missing.
        FileExists
            ``dest`` exists and ``overwrite`` is False.
        """
        self._check_writable("move_file")
        info = await self._stat_src(src)
        source, target = _paths.normalize(src), _paths.normalize(dest)
        if source == target:
            # Like rename(2): onto itself is a no-op, never copy-then-delete it away.
            if not overwrite:
                raise FileExists(dest)
            return
        if info.type == "directory" and target.startswith(source + "/"):
            # Copy-then-delete would delete the copy with its source.
            raise PermissionDenied(dest, "move_file (cannot move a directory into itself)")
        if not overwrite and await self.exists(dest):
            raise FileExists(dest)
        await self.copy_file(src, dest, overwrite=overwrite, recursive=True)
        if info.type == "directory":
            await self.rmdir(src, recursive=True)
        else:
            await self.delete_file(src)

    async def _stat_src(self, src: str) -> FileStat:
        try:
            return await self.stat(src)
        except FileNotFoundError:
            raise FileNotFound(src) from None

    async def _write_copy(self, dest: str, data: str | bytes, *, overwrite: bool) -> None:
        try:
            await self.write_file(dest, data, overwrite=overwrite)
        except IsADirectoryError:
            raise IsDirectory(dest) from None

    async def _copy_tree(self, src: str, dest: str, *, overwrite: bool) -> None:
        await self.mkdir(dest, recursive=True)
        for entry in await self.readdir(src, recursive=True):
            source = _paths.join(_paths.normalize(src), entry.name)
            target = _paths.join(_paths.normalize(dest), entry.name)
            if entry.type == "directory":
                await self.mkdir(target, recursive=True)
                continue
            try:
                await self.write_file(target, await self.read_file(source), overwrite=overwrite)
            except FileExistsError:
                # A tree copy without overwrite keeps what is already there, like ``cp -n``.
                continue

    # -- description ------------------------------------------------------------------------

    def default_instructions(self) -> str:
        """The instructions agents get when none are configured."""
        return ""

    def get_instructions(self, *, request_context: RequestContext | None = None) -> str:
        """Return how agents should use this filesystem (``instructions`` wins if set)."""
        default = self.default_instructions()
        custom = self._instructions
        if custom is None:
            return default
        if isinstance(custom, str):
            return custom
        return str(custom({"default_instructions": default, "request_context": request_context}))

    def get_mount_config(self) -> dict[str, Any] | None:
        """Return how a sandbox can mount this filesystem, without secrets; None if it cannot."""
        return None

    @property
    def location(self) -> str | None:
        """Where the storage is, as a string that tells two storages apart (a local
        directory, a bucket prefix); None where the filesystem cannot say. Used to scope
        what is remembered per storage, such as the files read before a write."""
        return None

    def metadata(self) -> dict[str, Any]:
        """Backend-specific facts for :meth:`get_info` (never credentials)."""
        return {}

    async def get_info(self) -> dict[str, Any]:
        """Describe the filesystem: ``id, name, provider, read_only, status, error, icon, metadata``."""
        return {
            "id": self.id,
            "name": self.name,
            "provider": self.provider,
            "read_only": self.read_only,
            "status": self.status,
            "error": self.error,
            "icon": self.icon,
            "metadata": self.metadata(),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, provider={self.provider!r}, read_only={self.read_only})"


for _name, _positions in _MUTATORS.items():
    # The derived operations of the base class announce too (their inner writes already do,
    # but a listener must not depend on how an operation is composed).
    if _name in WorkspaceFilesystem.__dict__:
        setattr(WorkspaceFilesystem, _name, _announcing(_name, WorkspaceFilesystem.__dict__[_name], _positions))


def as_bytes(content: str | bytes | bytearray | memoryview, name: str = "content") -> bytes:
    """``content`` as bytes (text as UTF-8); ``TypeError`` naming ``name`` for anything else."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise TypeError(f"{name} must be str or bytes, not {type(content).__name__}")


def decoded(data: bytes, encoding: str | None, path: str) -> str | bytes:
    """``data`` as ``read_file`` returns it: the bytes, or text in ``encoding``.

    Raises
    ------
    FileDecodeError
        The bytes are not valid in ``encoding``; the message names the first bad byte.
    """
    if encoding is None:
        return data
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise FileDecodeError(path, encoding, f"byte 0x{data[exc.start]:02x} at offset {exc.start}") from None


def filter_extension(entries: list[FileEntry], extension: str | list[str] | None) -> list[FileEntry]:
    """Keep directories and the files whose extension is in ``extension``."""
    if extension is None:
        return entries
    wanted = normalize_extensions([extension] if isinstance(extension, str) else extension)
    return [
        e for e in entries if e.type == "directory" or any(e.name.lower().endswith(x) for x in wanted)
    ]


def order_tree(entries: Mapping[str, FileEntry]) -> list[FileEntry]:
    """Order a recursive listing depth-first, siblings by name, children after their parent."""
    children: dict[str, list[str]] = {}
    for rel in entries:
        children.setdefault(_paths.dirname(rel), []).append(rel)
    out: list[FileEntry] = []

    def visit(parent: str) -> None:
        for rel in sorted(children.get(parent, ())):
            out.append(entries[rel])
            visit(rel)

    visit("")
    return out


def drop_hidden(entries: list[FileEntry]) -> list[FileEntry]:
    """Drop entries with a segment starting with ``.`` (hidden, or below a hidden directory)."""
    return [e for e in entries if not any(s.startswith(".") for s in e.name.split("/"))]
