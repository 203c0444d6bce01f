"""Where skills are read from: the ``SkillSource`` interface, ``LocalSkillSource``, and the
listing helpers discovery uses on any source.

A skill source is the read side of a filesystem: ``exists``, ``stat``, ``read_file`` and
``readdir`` (every ``WorkspaceFilesystem`` is one), optionally ``realpath`` (to tell two paths
to one directory apart from two skills) and ``walk`` (a whole tree in few requests).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import stat as stat_module
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import anyio
import anyio.to_thread

from ..errors import (
    DirectoryNotFound,
    FileNotFound,
    NotDirectory,
)
from ..vfs import (
    Disk,
    DiskEntry,
    FileEntry,
    FileStat,
    WorkspaceFilesystem,
    get_mime_type,
    leads_out_of_directory,
    run_sync,
    translated_reads,
)
from ..vfs import read_many as vfs_read_many

__all__ = [
    "LocalSkillSource",
    "SkillSource",
    "Tree",
    "TreeCache",
    "is_flat",
    "join_path",
    "norm_path",
    "read_files",
    "walk_source",
]

_log = logging.getLogger("agentvfs.skills")

#: Files read at once during discovery and indexing.
READ_CONCURRENCY = 16


@runtime_checkable
class SkillSource(Protocol):
    """The read operations skills need; every ``WorkspaceFilesystem`` provides them.

    Paths use ``/``; missing paths raise ``FileNotFoundError``.
    """

    async def exists(self, path: str) -> bool:
        """Tell whether anything is at ``path``."""
        ...

    async def stat(self, path: str) -> FileStat:
        """Metadata of a file or directory."""
        ...

    async def read_file(self, path: str) -> str | bytes:
        """A whole file (bytes, or text for sources that decode)."""
        ...

    async def readdir(self, path: str) -> list[FileEntry]:
        """The entries of a directory, sorted by name."""
        ...


def norm_path(path: str) -> str:
    """Canonical form for comparing paths of one source: no ``./``, no trailing ``/``, and
    ``""`` for the root."""
    if path in ("", ".", "./"):
        return ""
    normal = posixpath.normpath(path)
    return "" if normal == "." else normal


def join_path(base: str, name: str) -> str:
    """``base/name``, keeping the caller's form of ``base`` (``./skills`` stays ``./skills``);
    an empty or ``.`` base gives ``name``."""
    if base in ("", "."):
        return name.strip("/")
    return base.rstrip("/") + "/" + name.strip("/")


def is_flat(source: object) -> bool:
    """True for object stores, where one listing returns a whole tree whatever its depth."""
    capabilities = getattr(source, "capabilities", None)
    return capabilities is not None and getattr(capabilities, "empty_dirs", True) is False


async def walk_source(source: SkillSource, path: str, max_depth: int) -> list[FileEntry]:
    """Everything below ``path`` to ``max_depth`` levels, names relative to ``path``, children
    after their parent: natively where the source can (one listing on object stores).

    Raises
    ------
    FileNotFoundError, NotADirectoryError
        Nothing at ``path``, or a file.
    """
    walk = getattr(source, "walk", None)
    if callable(walk):
        entries: list[FileEntry] = await walk(path, max_depth=max_depth)
        return entries
    if isinstance(source, WorkspaceFilesystem):
        return await source.readdir(path, recursive=True, max_depth=max_depth)
    out: list[FileEntry] = []

    async def visit(directory: str, prefix: str, depth: int) -> None:
        for entry in await source.readdir(directory):
            name = prefix + entry.name
            out.append(
                FileEntry(name, entry.type, entry.size, entry.is_symlink, entry.symlink_target)
            )
            if entry.type == "directory" and depth < max_depth:
                await visit(join_path(directory, entry.name), name + "/", depth + 1)

    await visit(path, "", 1)
    return out


async def read_files(source: SkillSource, paths: Sequence[str]) -> dict[str, bytes | OSError]:
    """Read many files at once; each path maps to its bytes or to the error reading it."""
    return await vfs_read_many(source, list(paths), concurrency=READ_CONCURRENCY)


class Tree:
    """A walked directory: entries by path relative to it, to a known depth."""

    __slots__ = ("_below", "depth", "entries")

    def __init__(self, entries: dict[str, FileEntry], depth: int) -> None:
        self.entries = entries
        self.depth = depth
        self._below: dict[str, dict[str, FileEntry]] | None = None

    def _children(self) -> dict[str, dict[str, FileEntry]]:
        """Entries grouped by their first segment (built once: slicing stays linear)."""
        if self._below is None:
            below: dict[str, dict[str, FileEntry]] = {}
            for name, entry in self.entries.items():
                head, sep, rest = name.partition("/")
                if sep:
                    below.setdefault(head, {})[rest] = entry
            self._below = below
        return self._below

    def child_dirs(self) -> list[str]:
        """Names of the immediate subdirectories, sorted."""
        return sorted(n for n, e in self.entries.items() if "/" not in n and e.type == "directory")

    def is_file(self, name: str) -> bool:
        entry = self.entries.get(name)
        return entry is not None and entry.type == "file"

    def is_dir(self, name: str) -> bool:
        entry = self.entries.get(name)
        return entry is not None and entry.type == "directory"

    def sub(self, name: str) -> Tree | None:
        """The part below the subdirectory ``name`` (None if it is not a directory here)."""
        if not self.is_dir(name):
            return None
        head, sep, rest = name.partition("/")
        child = Tree(self._children().get(head, {}), self.depth - 1)
        return child.sub(rest) if sep else child

    def complete(self) -> bool:
        """Everything below is listed (no directory sits at the depth the walk stopped at)."""
        return self.depth > 0 and not any(
            e.type == "directory" and n.count("/") + 1 >= self.depth
            for n, e in self.entries.items()
        )

    def files_below(self, name: str) -> list[str]:
        """Files below the subdirectory ``name``, relative to it, in walk order; nothing below
        a symlinked directory (links are not followed out of a skill's subdirectories)."""
        sub = self.sub(name)
        if sub is None:
            return []
        linked = [n + "/" for n, e in sub.entries.items() if e.type == "directory" and e.is_symlink]
        return [
            n
            for n, e in sub.entries.items()
            if e.type == "file" and not any(n.startswith(d) for d in linked)
        ]

    def signature(self, depth: int | None = None) -> frozenset[tuple[str, str, int | None, bool]]:
        """What changes when a file or directory appears, goes, or changes size (down to
        ``depth`` levels)."""
        return frozenset(
            (n, e.type, e.size, e.is_symlink)
            for n, e in self.entries.items()
            if depth is None or n.count("/") < depth
        )


class TreeCache:
    """Walks of one source during one discovery: a walk of a directory also answers for every
    directory below it, as deep as it went."""

    def __init__(self, source: SkillSource) -> None:
        self.source = source
        self._walks: dict[str, Tree | None] = {}

    async def tree(self, path: str, depth: int) -> Tree | None:
        """The tree below ``path`` to ``depth`` levels, or None if ``path`` is no directory
        (missing, a file, or unreadable: the last is logged)."""
        key = norm_path(path)
        if key in self._walks:
            walked = self._walks[key]
            if walked is None or walked.depth >= depth:
                return walked
        # A walk of an ancestor deep enough answers too (ancestors are few: look each up).
        ancestor, levels = key, 0
        while ancestor not in ("", "/"):
            ancestor = posixpath.dirname(ancestor)
            levels += 1
            above = self._walks.get(ancestor)
            if above is not None and above.depth >= levels + depth:
                rel = key if ancestor == "" else key[len(ancestor) + 1 :]
                return above.sub(rel)
        try:
            entries = await walk_source(self.source, path, depth)
        except (FileNotFoundError, NotADirectoryError):
            self._walks[key] = None
            return None
        except OSError as exc:
            hint = ""
            if path.startswith("/") and isinstance(exc, PermissionError):
                # "/skills" on a contained filesystem is a host path; "skills" was likely meant.
                with contextlib.suppress(OSError):
                    if await self.source.exists(path[1:]):
                        hint = f' (did you mean to use the relative path "{path[1:]}"?)'
            _log.warning('[WorkspaceSkills] Cannot access skills path "%s": %s%s', path, exc, hint)
            self._walks[key] = None
            return None
        walked = Tree({e.name: e for e in entries}, depth)
        self._walks[key] = walked
        return walked


# -- LocalSkillSource --------------------------------------------------------------------------------


def _timestamp(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


class LocalSkillSource:
    """Skills read straight from local disk, read-only: relative paths resolve against
    ``base_path`` (default: the current directory), absolute paths are used as they are.

    Everything is read through descriptors (:class:`~agentvfs.vfs._disk.Disk`): a path under
    ``base_path`` is resolved beneath it, and symlinks are followed only while they stay there
    (an agent that can write ``base_path``, its sandbox's working directory for instance,
    cannot point a skill elsewhere, not even by swapping a directory during a read); an
    absolute path outside ``base_path`` is configuration and followed as it is, but a skill's
    files are still read beneath its directory. FIFOs, devices and sockets are never opened.

    Parameters
    ----------
    base_path : str or os.PathLike, optional
        Where relative skills paths start.
    """

    read_only = True

    def __init__(self, base_path: str | os.PathLike[str] | None = None) -> None:
        self.base_path = os.path.abspath(
            os.fspath(base_path) if base_path is not None else os.getcwd()
        )
        self._inside = Disk([self.base_path])
        self._anywhere = Disk(["/"])

    def _resolve(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(self.base_path, path))

    def _disk_for(self, host: str) -> Disk:
        return self._inside if self._inside.contains(host) else self._anywhere

    async def exists(self, path: str) -> bool:
        """Tell whether anything is at ``path`` (a broken link, or one that leads out of
        ``base_path``, counts as nothing)."""

        def look() -> bool:
            host = self._resolve(path)
            try:
                return self._disk_for(host).exists(host)
            except PermissionError:
                return False

        return await run_sync(look)

    async def stat(self, path: str) -> FileStat:
        """Metadata of a file or directory (links followed).

        Raises
        ------
        FileNotFound
            ``ENOENT`` (also for a link that leads out of ``base_path``).
        """
        host = self._resolve(path)
        try:
            info = await run_sync(self._disk_for(host).stat, host)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            raise FileNotFound(path) from None
        is_dir = stat_module.S_ISDIR(info.st_mode)
        name = posixpath.basename(path.rstrip("/")) or os.path.basename(host)
        return FileStat(
            name=name,
            path=path,
            type="directory" if is_dir else "file",
            size=0 if is_dir else info.st_size,
            created_at=_timestamp(info.st_ctime),
            modified_at=_timestamp(info.st_mtime),
            mime_type=None if is_dir else get_mime_type(name),
            mode=stat_module.S_IMODE(info.st_mode),
        )

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file.

        Raises
        ------
        FileNotFound
            ``ENOENT``.
        IsDirectory
            ``EISDIR``.
        NotRegularFile
            A FIFO, device or socket.
        """
        return await self._read(path, None)

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Read many files; each path maps to its bytes or its error (``FileTooLarge`` past
        ``max_bytes``, of which no more than one byte beyond is read)."""
        out: dict[str, bytes | OSError] = {}
        limiter = anyio.Semaphore(READ_CONCURRENCY)

        async def one(path: str) -> None:
            async with limiter:
                try:
                    out[path] = await self._read(path, max_bytes)
                except OSError as exc:
                    out[path] = exc

        async with anyio.create_task_group() as group:
            for path in paths:
                group.start_soon(one, path)
        return out

    async def _read(self, path: str, max_bytes: int | None) -> bytes:
        host = self._resolve(path)
        disk = self._disk_for(host)

        def read() -> bytes:
            with translated_reads(path, lambda: FileNotFound(path)):
                return disk.read(host, max_bytes=max_bytes)
            raise AssertionError("unreachable")  # pragma: no cover - the context re-raises

        return await run_sync(read)

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read ``path`` (relative) below ``directory`` without leaving it: symlinks are
        followed only while they stay below it, resolved beneath a descriptor of it (see
        :func:`agentvfs.vfs.read_file_beneath`).

        Raises
        ------
        PermissionDenied
            ``path`` leads out of ``directory`` (or ``directory`` out of ``base_path``).
        FileNotFound, IsDirectory, FileTooLarge
            ``ENOENT``, ``EISDIR``, ``EFBIG``.
        """
        shown = f"{directory.rstrip('/')}/{path}"

        def read() -> bytes:
            host = os.path.normpath(self._resolve(directory))
            with translated_reads(shown, lambda: leads_out_of_directory(path)):
                return self._disk_for(host).read_beneath(host, path, max_bytes=max_bytes)
            raise AssertionError("unreachable")  # pragma: no cover - the context re-raises

        return await run_sync(read)

    async def readdir(self, path: str) -> list[FileEntry]:
        """The entries of a directory, sorted by name; links are reported with the type of
        their target.

        Raises
        ------
        DirectoryNotFound, NotDirectory
            ``ENOENT``, ``ENOTDIR``.
        """
        return await self.walk(path, max_depth=1)

    async def walk(self, path: str, *, max_depth: int | None = None) -> list[FileEntry]:
        """Everything below ``path`` (to ``max_depth`` levels), names relative to it, children
        after their parent; symlinked directories are followed (inside ``base_path`` only
        while they stay there), each directory entered once.

        Raises
        ------
        DirectoryNotFound, NotDirectory
            ``ENOENT``, ``ENOTDIR``.
        """
        host = self._resolve(path)
        limit = max_depth if max_depth is not None else 100
        disk = self._disk_for(host)

        def walk() -> list[FileEntry]:
            try:
                found = disk.walk(host, max_depth=limit)
            except (FileNotFoundError, PermissionError):
                raise DirectoryNotFound(path) from None
            except NotADirectoryError:
                raise NotDirectory(path) from None
            return [_entry(item) for item in found]

        return await run_sync(walk)

    async def realpath(self, path: str) -> str:
        """The canonical path: relative to ``base_path`` when inside it, else absolute."""
        return await run_sync(self._realpath, path)

    def _realpath(self, path: str) -> str:
        host = self._resolve(path)
        try:
            real = self._disk_for(host).realpath(host)
        except PermissionError:
            raise FileNotFound(path) from None
        base = os.path.realpath(self.base_path)
        if real == base:
            return ""
        if real.startswith(base.rstrip(os.sep) + os.sep):
            return os.path.relpath(real, base).replace(os.sep, "/")
        return real

    def __repr__(self) -> str:
        return f"LocalSkillSource(base_path={self.base_path!r})"


def _entry(item: DiskEntry) -> FileEntry:
    """A listed entry: links typed by their (contained) target, broken ones as files."""
    is_dir = item.is_dir
    size = None if is_dir or item.stat is None else item.stat.st_size
    return FileEntry(item.name, "directory" if is_dir else "file", size, item.link is not None, item.link)
