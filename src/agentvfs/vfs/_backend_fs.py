"""The workspace filesystem over any :class:`~agentvfs.vfs.Backend`: the agent-facing layer.

Everything agents rely on and storage knows nothing of lives here, once for every backend:
paths (``/`` and ``..`` never leave the root), read-only mode, recursive ``mkdir`` and
``rmdir``, parents created for writes, listings with extensions and depth, optimistic
concurrency (``expected_mtime`` becomes the backend's version guard), errors that name the
path the caller gave.
"""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import (
    Backend,
    ByteRange,
    KnownVersions,
    SupportsBatchRead,
    SupportsReadIntoBuffer,
    SupportsTreeWalk,
    WriteMode,
)
from ._base import (
    AnnouncedUpload,
    SupportsStreamingUpload,
    SupportsTransfer,
    UploadStream,
    WorkspaceFilesystem,
    as_bytes,
    decoded,
    drop_hidden,
    filter_extension,
    new_id,
    order_tree,
    read_each,
    read_local,
    run_sync,
    write_local,
)
from ._records import FileEntry, FileStat

__all__ = ["BackendFilesystem"]

T = TypeVar("T")

#: Errors that name one path, rebuilt to name the path the caller gave.
_ONE_PATH: tuple[type[FilesystemError], ...] = (
    FileNotFound, DirectoryNotFound, FileExists, IsDirectory, NotDirectory, DirectoryNotEmpty,
)  # fmt: skip

#: Depth of a recursive listing without ``max_depth`` (as the reference).
_DEFAULT_DEPTH = 100


class BackendFilesystem(WorkspaceFilesystem):
    """A workspace filesystem over a :class:`Backend`.

    Parameters
    ----------
    backend : Backend
        The storage.
    id, read_only, display_name, description, icon, instructions, text_extensions
        See :class:`WorkspaceFilesystem`.

    Examples
    --------
    >>> from agentvfs.vfs import BackendFilesystem, MemoryBackend
    >>> fs = BackendFilesystem(MemoryBackend())
    """

    name = "BackendFilesystem"

    def __init__(
        self,
        backend: Backend,
        *,
        id: str | None = None,
        read_only: bool = False,
        display_name: str | None = None,
        description: str | None = None,
        icon: str | None = None,
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        text_extensions: Iterable[str] = (),
    ) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        super().__init__(
            id=id or new_id(f"{backend.provider}-fs"),
            read_only=read_only,
            display_name=display_name,
            description=description,
            icon=icon,
            instructions=instructions,
            text_extensions=text_extensions,
        )
        self._backend = backend
        self._known = KnownVersions()
        self.provider = backend.provider
        self.capabilities = backend.capabilities

    @property
    def backend(self) -> Backend:
        """The storage under this filesystem."""
        return self._backend

    async def teardown(self) -> None:
        await self._backend.close()

    async def _call(self, display: str, rel: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run a backend call; errors about ``rel`` name ``display``, as the caller wrote it."""
        if self.status != "ready":
            await self.ensure_ready()
        try:
            return await call()
        except _ONE_PATH as exc:
            renamed = _named(exc, rel, display)
            if renamed is exc:
                raise
            raise renamed from None

    @staticmethod
    def _file(path: str) -> str:
        """``path`` normalised, where a file is expected: the root is a directory."""
        rel = _paths.normalize(path)
        if not rel:
            raise IsDirectory(path)
        return rel

    # -- reads ------------------------------------------------------------------------------

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        rel = self._file(path)
        data = await self._call(path, rel, lambda: self._backend.read(rel))
        return decoded(data, encoding, path)

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of a file, read as one range from the backend."""
        rel = self._file(path)
        if end <= start:
            return b""
        return await self._call(path, rel, lambda: self._backend.read(rel, ByteRange(start, end)))

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read from ``start`` into ``buffer``: straight into it where the backend can."""
        rel = self._file(path)
        backend = self._backend
        if isinstance(backend, SupportsReadIntoBuffer):
            return await self._call(path, rel, lambda: backend.read_into(rel, start, buffer))
        data = await self.read_range(path, start, start + len(buffer))
        buffer[: len(data)] = data
        return len(data)

    async def stat(self, path: str) -> FileStat:
        rel = _paths.normalize(path)
        stat = await self._call(path, rel, lambda: self._backend.stat(rel))
        self._known.remember(stat)
        return stat

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        rel = _paths.normalize(path)
        depth = _DEFAULT_DEPTH if max_depth is None else max_depth
        found: dict[str, FileEntry] = {}

        async def visit(directory: str, prefix: str, level: int) -> None:
            children = await self._call(path, rel, lambda: self._list_dir(directory))
            for child in sorted(children, key=lambda s: s.name):
                name = f"{prefix}{child.name}"
                found[name] = _entry(name, child)
                if recursive and child.type == "directory" and level < depth:
                    await visit(_paths.join(directory, child.name) if directory else child.name, name + "/", level + 1)

        await visit(rel, "", 1)
        entries = order_tree(found) if recursive else [found[n] for n in sorted(found)]
        return filter_extension(entries, extension)

    async def list_stats(self, path: str = "") -> list[FileStat]:
        """Metadata of every child of ``path``: the backend's listing, which has it."""
        rel = _paths.normalize(path)
        stats = await self._call(path, rel, lambda: self._list_dir(rel))
        return sorted(stats, key=lambda s: s.name)

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """List a whole tree: one request where the backend walks (``SupportsTreeWalk``), else
        a recursive listing. Names are relative to ``path``."""
        backend = self._backend
        if not isinstance(backend, SupportsTreeWalk):
            entries = await self.readdir(path, recursive=True, max_depth=max_depth)
            return entries if include_hidden else drop_hidden(entries)
        rel = _paths.normalize(path)
        depth = _DEFAULT_DEPTH if max_depth is None else max_depth
        prefix = f"{rel}/" if rel else ""
        found: dict[str, FileEntry] = {}
        for stat in await self._call(path, rel, lambda: backend.walk(rel)):
            name = stat.path[len(prefix):] if stat.path.startswith(prefix) else stat.path
            if name and name.count("/") < depth:
                found[name] = _entry(name, stat)
        entries = order_tree(found)
        return entries if include_hidden else drop_hidden(entries)

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Read many files: in one batch where the backend can (``SupportsBatchRead``), else
        eight at a time. Each path, as given, maps to its bytes or its error."""
        backend = self._backend
        if not isinstance(backend, SupportsBatchRead):
            return await read_each(self.read_file, paths, max_bytes=max_bytes)
        if self.status != "ready":
            await self.ensure_ready()
        out: dict[str, bytes | OSError] = {}
        given: dict[str, list[str]] = {}  # two spellings may name one file
        for path in paths:
            try:
                given.setdefault(self._file(path), []).append(path)
            except OSError as exc:
                out[path] = exc
        got = await backend.read_many(list(given), max_bytes=max_bytes)
        for rel, spellings in given.items():
            value = got.get(rel)
            for path in spellings:
                if value is None:
                    out[path] = FileNotFound(path)
                elif isinstance(value, _ONE_PATH):
                    out[path] = _named(value, rel, path)
                else:
                    out[path] = value
        return out

    async def _list_dir(self, rel: str) -> list[FileStat]:
        try:
            return await self._backend.list(rel)
        except FileNotFoundError:
            raise DirectoryNotFound(rel) from None

    # -- writes -----------------------------------------------------------------------------

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
        self._check_writable("write_file")
        rel = self._file(path)
        data = as_bytes(content)
        await self._parents(path, rel, recursive)
        guard = self._known.guard(rel, expected_mtime) if expected_mtime is not None else None
        mode = WriteMode.OVERWRITE if overwrite else WriteMode.CREATE
        try:
            await self._call(path, rel, lambda: self._backend.write(rel, data, mode=mode, guard=guard))
        except StaleFileError as exc:
            if exc.actual_mtime is None:
                # Gone since it was seen: the write creates it, as the reference does (and
                # fails if someone else created it meanwhile).
                await self._call(path, rel, lambda: self._backend.write(rel, data, mode=WriteMode.CREATE))
                return
            if exc.path != path:
                raise StaleFileError(path, exc.expected_mtime, exc.actual_mtime) from None
            raise

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish the local file ``local_path`` as ``path``, creating parents: streamed from
        disk where the backend transfers files (``SupportsTransfer``), else read and written
        whole."""
        self._check_writable("upload_file")
        rel = self._file(path)
        await self._parents(path, rel, True)
        backend = self._backend
        if isinstance(backend, SupportsTransfer):
            await self._call(path, rel, lambda: backend.upload_file(local_path, rel))
            return
        data = await run_sync(read_local, local_path)
        await self._call(path, rel, lambda: backend.write(rel, data))

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path``: streamed where the backend
        transfers files (``SupportsTransfer``), else read whole and written."""
        rel = self._file(path)
        backend = self._backend
        if isinstance(backend, SupportsTransfer):
            await self._call(path, rel, lambda: backend.download_file(rel, local_path))
            return
        data = await self._call(path, rel, lambda: backend.read(rel))
        await run_sync(write_local, local_path, data)

    async def open_upload(self, path: str, *, part_size: int) -> UploadStream | None:
        """A streamed upload of ``path`` where the backend streams (``SupportsStreamingUpload``),
        else None: the caller writes the file whole."""
        self._check_writable("open_upload")
        backend = self._backend
        if not isinstance(backend, SupportsStreamingUpload):
            return None
        rel = self._file(path)
        await self._parents(path, rel, True)
        stream = await self._call(path, rel, lambda: backend.open_upload(rel, part_size=part_size))
        return None if stream is None else AnnouncedUpload(stream, self, path)

    async def _parents(self, display: str, rel: str, recursive: bool) -> None:
        """Make sure the parent directory of ``rel`` exists (creating it with ``recursive``)."""
        parent = _paths.dirname(rel)
        if not parent:
            return
        try:
            info = await self._call(display, rel, lambda: self._backend.stat(parent))
        except FileNotFoundError:
            if not recursive:
                raise DirectoryNotFound(posixpath.dirname(display.rstrip("/")) or parent) from None
            await self._make_dirs(display, parent)
            return
        if info.type != "directory":
            raise NotDirectory(parent)

    async def _make_dirs(self, display: str, rel: str) -> None:
        missing: list[str] = []
        current = rel
        while current:
            try:
                info = await self._backend.stat(current)
            except FileNotFoundError:
                missing.append(current)
                current = _paths.dirname(current)
                continue
            if info.type != "directory":
                raise FileExists(display) if current == rel else NotDirectory(current)
            break
        for directory in reversed(missing):
            await self._call(display, rel, lambda d=directory: self._backend.make_dir(d))  # type: ignore[misc]

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        self._check_writable("delete_file")
        rel = self._file(path)
        try:
            await self._call(path, rel, lambda: self._backend.delete(rel))
        except FileNotFoundError:
            if not force:
                raise

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        self._check_writable("mkdir")
        rel = _paths.normalize(path)
        if not rel:
            return  # the root exists
        if recursive:
            await self._make_dirs(path, rel)
            return
        await self._parents(path, rel, recursive=False)
        await self._call(path, rel, lambda: self._backend.make_dir(rel))

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        self._check_writable("rmdir")
        rel = _paths.normalize(path)
        if not rel:
            raise PermissionDenied(path, "rmdir (the root cannot be removed)")
        try:
            info = await self._call(path, rel, lambda: self._backend.stat(rel))
        except FileNotFoundError:
            if force:
                return
            raise DirectoryNotFound(path) from None
        if info.type != "directory":
            raise NotDirectory(path)
        if recursive:
            await self._remove_tree(path, rel)
            return
        await self._call(path, rel, lambda: self._backend.remove_dir(rel))

    async def _remove_tree(self, display: str, rel: str) -> None:
        for child in await self._call(display, rel, lambda: self._list_dir(rel)):
            below = _paths.join(rel, child.name)
            if child.type == "directory":
                await self._remove_tree(display, below)
            else:
                await self._call(display, rel, lambda b=below: self._backend.delete(b))  # type: ignore[misc]
        await self._call(display, rel, lambda: self._backend.remove_dir(rel))

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        """Move a file with the backend's own move (atomic where it renames), a directory
        as a copy of the tree and then a removal."""
        self._check_writable("move_file")
        source, target = _paths.normalize(src), _paths.normalize(dest)
        info = await self._stat_src(src)
        if info.type == "directory" or source == target:
            await super().move_file(src, dest, overwrite=overwrite)
            return
        await self._parents(dest, target, recursive=True)
        mode = WriteMode.OVERWRITE if overwrite else WriteMode.CREATE
        try:
            await self._call(dest, target, lambda: self._backend.move(source, target, mode=mode))
        except FileNotFoundError as exc:
            if getattr(exc, "path", None) == source:
                raise FileNotFound(src) from None
            raise

    def metadata(self) -> dict[str, Any]:
        return {"backend": type(self._backend).__name__}

    def __repr__(self) -> str:
        return f"BackendFilesystem({self._backend!r}, read_only={self.read_only})"


def _named(exc: FilesystemError, rel: str, display: str) -> FilesystemError:
    """``exc``, an error of one of ``_ONE_PATH`` about ``rel``, naming ``display`` instead
    (the path as the caller wrote it); ``exc`` itself where it names something else."""
    if exc.path == rel and display != rel:
        return type(exc)(display)  # each of _ONE_PATH takes just the path
    return exc


def _entry(name: str, stat: FileStat) -> FileEntry:
    return FileEntry(name=name, type=stat.type, size=stat.size if stat.type == "file" else None)
