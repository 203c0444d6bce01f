"""The live side: a workspace's tree as storage shows it now, and its files' contents."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import stat as stat_module
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import anyio

from ..errors import BlobIntegrityError
from ..vfs import (
    FileStat,
    SupportsPinnedRead,
    Version,
    WorkspaceFilesystem,
    list_stats,
    read_range,
    settled,
    sha256_hex,
)
from ._manifest import FileRecord, is_reserved
from ._versions import unwrapped

__all__ = ["Tree", "VersionKind", "read_live", "same_version", "scan", "task_group", "version_kind", "vouches"]

#: Listings (one per directory) in flight at once while a tree is scanned.
SCAN_CONCURRENCY = 16


@dataclass
class Tree:
    """What a scan found below the root, agentvfs's own data left out."""

    files: dict[str, FileStat] = field(default_factory=dict)
    directories: set[str] = field(default_factory=set)
    #: Symbolic links (not followed) and their targets.
    links: dict[str, str] = field(default_factory=dict)
    #: FIFOs, sockets and device nodes: neither recorded nor restored.
    special: set[str] = field(default_factory=set)

    def kind(self, path: str) -> str | None:
        """``file``, ``directory``, ``symlink``, ``special`` or None (nothing there)."""
        if path in self.files:
            return "file"
        if path in self.directories:
            return "directory"
        if path in self.links:
            return "symlink"
        return "special" if path in self.special else None


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group that raises the error of a failed task as itself (the first, where
    several failed), not wrapped in an exception group: callers catch ``FileNotFoundError``
    or ``BlobIntegrityError`` as they would from one call."""
    try:
        async with anyio.create_task_group() as tg:
            yield tg
    except BaseExceptionGroup as group:
        leaves: list[BaseException] = []
        pending: list[BaseException] = [group]
        while pending:
            exc = pending.pop(0)
            if isinstance(exc, BaseExceptionGroup):
                pending[:0] = exc.exceptions
            else:
                leaves.append(exc)
        errors = [e for e in leaves if isinstance(e, Exception)]
        if len(leaves) == 1 or (errors and len(errors) == len(leaves)):
            # One failure (a KeyboardInterrupt too) comes out as itself, with its own cause.
            first = leaves[0] if len(leaves) == 1 else errors[0]
            raise first from first.__cause__
        raise


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


async def scan(fs: WorkspaceFilesystem, top: str = "") -> Tree:
    """Every file, directory and symbolic link below ``top``, from one listing of each
    directory (its files' metadata, ETags included, come with the listing where storage
    gives them). A directory that disappears while it is scanned is left out."""
    tree = Tree()
    limiter = anyio.Semaphore(SCAN_CONCURRENCY)

    async def visit(directory: str, tg: anyio.abc.TaskGroup) -> None:
        async with limiter:
            try:
                children = await list_stats(fs, directory)
            except (FileNotFoundError, NotADirectoryError):
                return
        for child in children:
            path = _join(directory, child.name)
            if is_reserved(path):
                continue
            if child.file_kind == stat_module.S_IFLNK:
                tree.links[path] = child.link_target or ""
            elif child.file_kind is not None and child.file_kind != stat_module.S_IFREG:
                tree.special.add(path)
            elif child.type == "directory":
                tree.directories.add(path)
                tg.start_soon(visit, path, tg)
            else:
                # The path as this scan reached it (a listing's own may be spelled otherwise).
                tree.files[path] = child if child.path == path else dataclasses.replace(child, path=path)

    async with task_group() as tg:
        await visit(top, tg)
    return tree


#: How far a file's ETag tells its content: ``versions`` where storage issues a new token on
#: every write (GCS generations, the memory backend); ``digests`` where the ETag is a digest
#: of the content a writer can collide (S3's MD5); ``none`` where it is derived from a
#: modification time and size (local disk, fsspec's memory).
VersionKind = Literal["versions", "digests", "none"]

#: An S3 ETag of an object uploaded in one request (the MD5 of its bytes); one of a
#: multipart upload ends in ``-<parts>``.
_SINGLE_PART = re.compile(r"[0-9a-f]{32}")


def version_kind(fs: WorkspaceFilesystem) -> VersionKind:
    """How far equal ETags of one path mean equal content on ``fs`` (see :data:`VersionKind`)."""
    capabilities = unwrapped(fs).capabilities
    if not capabilities.versions:
        return "none"
    return "digests" if capabilities.digest_etags else "versions"


def _second(moment: datetime) -> int:
    return int(moment.timestamp())


def same_version(before: FileStat, after: FileStat) -> bool:
    """Whether two stats of one file show one version (its ETag where both have one, else
    its modification time to the millisecond; its size, and its time to the second, too:
    an ETag that is a digest may be kept by other bytes)."""
    return (
        before.size == after.size
        and Version.of(before).matches(after)
        and _second(before.modified_at) == _second(after.modified_at)
    )


def vouches(record: FileRecord, observed: datetime, current: FileStat, kind: VersionKind) -> bool:
    """Whether ``current`` is known, without reading it, to hold the content ``record``
    names; ``record`` is of a snapshot whose listing was made after ``observed`` (its
    ``created_at``).

    Where ETags are versions, an equal ETag and size are enough. Where they are digests
    (S3), the agent can write other bytes of the same MD5: only an equal ETag, size and
    server modification time vouch, and only where that time was settled (see
    :func:`agentvfs.vfs.settled`) when the snapshot listed it, so that any later write has
    a later time; and only for an object uploaded whole (a multipart object's time is when
    its upload began, which a writer holding one open chooses). Elsewhere nothing does.
    """
    if kind == "none" or record.etag is None or current.etag != record.etag or current.size != record.size:
        return False
    if kind == "versions":
        return True
    return (
        _SINGLE_PART.fullmatch(record.etag) is not None
        and _second(current.modified_at) == _second(record.modified_at)
        and settled(_second(record.modified_at), observed.timestamp())
    )


async def read_live(fs: WorkspaceFilesystem, stat: FileStat) -> bytes:
    """The content of the file ``stat`` describes, of that version where storage can name a
    version in a read (S3 ``If-Match``, GCS generation), else of what is there.

    Raises
    ------
    StaleFileError
        The file is another version now (only where the read names a version).
    """
    path = stat.path
    if stat.etag is not None and stat.size > 0 and isinstance(unwrapped(fs), SupportsPinnedRead):
        data = await read_range(fs, path, 0, stat.size, version=stat.etag)
        if len(data) == stat.size:
            return data
    raw = await fs.read_file(path)
    return raw if isinstance(raw, bytes) else raw.encode("utf-8")


def check_content(record: FileRecord, data: bytes, where: str) -> bytes:
    """``data`` if it is the content ``record`` names (its SHA-256 and size).

    Raises
    ------
    BlobIntegrityError
        It is not.
    """
    if len(data) != record.size or sha256_hex(data) != record.sha256:
        raise BlobIntegrityError(
            f"The content of {record.path} read from {where} is not what the snapshot recorded "
            f"(SHA-256 {record.sha256}, {record.size} bytes); refusing it"
        )
    return data
