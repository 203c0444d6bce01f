"""``FsspecFilesystem``: any fsspec backend as a workspace filesystem under a root.

This is the agent-facing layer: path rules (a leading ``/`` is the root, ``..`` never leaves
it), read-only mode, the workspace root's rules, the change feed and instructions. Storage is
a backend of the kind of the fsspec instance (:mod:`agentvfs.vfs._fsspec_backends`), chosen
once at construction and shown as :attr:`FsspecFilesystem.backend`; each call below runs one
of its blocking steps in a worker thread (inline for memory).
"""

from __future__ import annotations

import functools
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import anyio
import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import (
    FileExists,
    FileNotFound,
    FileTooLarge,
    IsDirectory,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import Version
from ._base import (
    AnnouncedUpload,
    UploadStream,
    WorkspaceFilesystem,
    as_bytes,
    decoded,
    drop_hidden,
    filter_extension,
    new_id,
    run_sync,
)
from ._cache import ContentCache
from ._cached_reads import _CachedReads
from ._fsspec_backends import NEVER, FsspecBackend, MemoryStoreBackend, names_local_disk
from ._grep import compile_pattern, grep_lines
from ._mime import is_text_file
from ._object_store import OBJECT_STORES, GcsBackend, ObjectStoreBackend, S3Backend
from ._posix import PosixAttributes, metadata_for
from ._records import FileEntry, FileStat, GrepFileResult
from ._storage_options import check_storage_options

__all__ = ["FsspecFilesystem", "fsspec_backend"]

T = TypeVar("T")

_DEFAULT_MAX_DEPTH = 100


def fsspec_backend(fs: fsspec.AbstractFileSystem, root: str, *, listing_ttl: float = 2.0) -> FsspecBackend:
    """The backend of the kind of ``fs``, rooted at ``root`` (a path of ``fs``, no protocol).

    Local disk (a ``LocalFileSystem``) gets the descriptor-based :class:`~agentvfs.vfs.DiskBackend`.
    """
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if isinstance(fs, LocalFileSystem):
        from ._disk_fs import DiskBackend  # it builds on this module's filesystem class

        return DiskBackend(root or "/", fs=fs)
    if isinstance(fs, MemoryFileSystem):
        return MemoryStoreBackend(fs, root)
    if set(protocols) & OBJECT_STORES:
        kinds = {"s3": S3Backend, "s3a": S3Backend, "gs": GcsBackend, "gcs": GcsBackend}
        return kinds.get(protocols[0], ObjectStoreBackend)(fs, root, listing_ttl=listing_ttl)
    return FsspecBackend(fs, root)




def _open_url(url: str, storage_options: dict[str, Any]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec instance and path of ``url``, refusing what would fail later or silently:
    a protocol whose package is missing (``ImportError`` naming the extra) and a storage
    option its class does not take (``ValueError`` naming the closest one)."""
    if "::" not in url:  # a chained URL's options are per link: left to fsspec
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        check_storage_options(protocol, storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except TypeError as exc:  # a class not checked above refused a keyword
        raise ValueError(f"The storage options for {url} were refused: {exc}") from exc
    return fs, str(path)


class FsspecFilesystem(WorkspaceFilesystem):
    """Any fsspec filesystem, confined to a root, as a workspace filesystem.

    Parameters
    ----------
    fs_or_url : fsspec.AbstractFileSystem or str
        A filesystem instance, or a URL such as ``s3://bucket/prefix``, ``gcs://bucket``,
        ``memory://`` or ``file:///path`` (resolved with ``fsspec.url_to_fs``).
    root : str
        A path below the instance's (or URL's) location that becomes the workspace root.
    read_only : bool
        Refuse every write before any request reaches the backend.
    storage_options : dict, optional
        Passed to the fsspec constructor when ``fs_or_url`` is a URL. Never reported.
    id, display_name, description, icon, instructions, text_extensions
        See :class:`WorkspaceFilesystem`.
    listing_ttl : float
        Seconds an object-store directory listing is trusted for write conflict checks.
    cache : ContentCache, bool, str or path-like, optional
        Keep the files read from remote storage (object stores) in a persistent local cache:
        ``True`` for the default directory (:func:`~agentvfs.vfs.default_cache_dir`), a
        directory, or a :class:`~agentvfs.vfs.ContentCache` to share. See :meth:`use_cache`.
    cache_bytes : int, optional
        The budget of a cache made from ``True`` or a directory.
    metadata_ttl : float
        With a cache: seconds a file's version seen in a listing or stat is trusted before a
        read asks storage again (close-to-open). Changes made through this object are seen
        at once; a change made directly in storage is served after at most this long.

    Notes
    -----
    Paths are relative to the root; a leading ``/`` also means the root and ``..`` never
    leaves it. On object stores (S3, GCS, Azure) directories are key prefixes: ``mkdir``
    writes a zero-byte ``dir/`` marker so empty directories persist, deleting the last entry
    of a directory keeps the directory, and ``rmdir`` of a non-empty prefix is refused.
    Writes are whole-object PUTs (atomic); on other backends they are staged in a hidden
    sibling and renamed into place. Stale-write checks use the ETag or generation where the
    backend has one, since object-store modification times are only precise to a second.
    """

    name = "FsspecFilesystem"

    def __new__(cls, fs_or_url: Any = None, *args: Any, **kwargs: Any) -> FsspecFilesystem:
        # Local disk has a filesystem class of its own (descriptor-based access for mounts).
        if cls is FsspecFilesystem and names_local_disk(fs_or_url):
            from ._disk_fs import DiskFilesystem

            return super().__new__(DiskFilesystem)
        return super().__new__(cls)

    def __init__(
        self,
        fs_or_url: fsspec.AbstractFileSystem | str,
        *,
        root: str = "",
        read_only: bool = False,
        storage_options: dict[str, Any] | None = None,
        id: str | None = None,
        display_name: str | None = None,
        description: str | None = None,
        icon: str | None = None,
        instructions: str | Callable[[dict[str, Any]], str] | None = None,
        text_extensions: Iterable[str] = (),
        listing_ttl: float = 2.0,
        cache: ContentCache | bool | str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        metadata_ttl: float = 5.0,
    ) -> None:
        super().__init__(
            id=id or new_id("fsspec-fs"),
            read_only=read_only,
            display_name=display_name,
            description=description,
            icon=icon,
            instructions=instructions,
            text_extensions=text_extensions,
        )
        if isinstance(fs_or_url, str):
            fs, base = _open_url(fs_or_url, storage_options or {})
        elif isinstance(fs_or_url, fsspec.AbstractFileSystem):
            if storage_options:
                raise TypeError("storage_options apply only when a URL is given, not an instance")
            fs, base = fs_or_url, ""
        else:
            raise TypeError(
                "fs_or_url must be an fsspec.AbstractFileSystem or a URL string, "
                f"not {type(fs_or_url).__name__}"
            )
        _paths.check_name(root)
        # A URL's path and a relative root join; an instance's root is a path of its own.
        joined = (posixpath.join(base, root.lstrip("/")) if base else root) if root else base
        if ".." in joined.split("/"):
            raise PermissionDenied(root, "access (the root must not contain '..')")
        stripped: str = fs._strip_protocol(joined) if joined else ""
        self._root = stripped.rstrip("/")
        self._backend = self._make_backend(fs, self._root, listing_ttl)
        self._protocol = self._backend.protocol
        self.provider = self._backend.provider
        self.capabilities = self._backend.capabilities
        self._cached: _CachedReads | None = None
        if cache is not None and cache is not False:
            self.use_cache(cache, cache_bytes=cache_bytes, metadata_ttl=metadata_ttl)
        elif cache_bytes is not None:
            raise TypeError("cache_bytes applies only with a cache: pass cache=True or a cache directory too")

    def _make_backend(self, fs: fsspec.AbstractFileSystem, root: str, listing_ttl: float) -> FsspecBackend:
        """The backend of the kind of ``fs`` (the local-disk class builds its own)."""
        return fsspec_backend(fs, root, listing_ttl=listing_ttl)

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def backend(self) -> FsspecBackend:
        """The storage under this filesystem: a :class:`~agentvfs.vfs.Backend` of the kind of
        the fsspec instance (memory, object store, local disk or generic)."""
        return self._backend

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The wrapped fsspec instance (no confinement: use with care)."""
        return self._backend.fs

    @property
    def root(self) -> str:
        """The backend path of the workspace root."""
        return self._backend.root_path

    @property
    def location(self) -> str | None:
        return self._backend.root_path or None

    def _rel(self, path: str) -> str:
        return _paths.normalize(path)

    def _is_root(self, rel: str) -> bool:
        return not rel

    def _public_path(self, rel: str) -> str:
        """How results name ``rel``: relative to the workspace root, ``/``-separated."""
        return rel

    def _public_stat(self, stat: FileStat) -> FileStat:
        """``stat`` (its path relative to the backend's root) as results show it."""
        return stat

    def _info(self, rel: str) -> dict[str, Any] | None:
        return self._backend.info(rel)

    async def probe(self) -> None:
        """One request that proves the storage answers; on object stores, that the bucket
        exists (a missing bucket otherwise looks like an empty root)."""
        if self.status != "ready":
            await self.ensure_ready()
        await self._call(self._backend.probe_sync, self._rel(""), "")

    async def setup(self) -> None:
        """Create the root directory on backends with real directories (not object stores)."""
        if not self.read_only:
            await self._call(self._backend.setup_sync)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self.capabilities.blocking:
            return await run_sync(fn, *args)
        return fn(*args)

    async def _call_write(self, fn: Callable[..., T], *args: Any) -> T:
        if self._cached is not None:
            # Versions seen before a change here are not trusted after it (nor while it runs).
            self._cached.forget(*(a for a in args[:3:2] if isinstance(a, str)))
            try:
                return await self._call_write_now(fn, *args)
            finally:
                self._cached.forget(*(a for a in args[:3:2] if isinstance(a, str)))
        return await self._call_write_now(fn, *args)

    async def _call_write_now(self, fn: Callable[..., T], *args: Any) -> T:
        # A write abandoned by a timeout keeps running in its thread; the event tells it not
        # to commit, so the operation lands whole before the deadline or not at all. Inline
        # (memory) writes cannot be abandoned midway and share one event that is never set.
        if not self.capabilities.blocking:
            return fn(*args, NEVER)
        cancel = threading.Event()
        try:
            return await self._call(fn, *args, cancel)
        except anyio.get_cancelled_exc_class():
            cancel.set()
            raise

    # -- read side ------------------------------------------------------------------------------

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """Read a whole file; see :meth:`WorkspaceFilesystem.read_file`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        backend = self._backend
        if isinstance(backend, MemoryStoreBackend):
            data = backend.read_now(rel, path)  # no thread, no await
        else:
            cached = await self._cached.read(rel, path) if self._cached is not None else None
            data = cached if cached is not None else await self._call(backend.read_sync, rel, path)
        return decoded(data, encoding, path)

    async def stat(self, path: str) -> FileStat:
        """Return metadata; see :meth:`WorkspaceFilesystem.stat`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._cached is not None and rel:
            return self._public_stat(await self._cached.stat(rel, path))
        return self._public_stat(await self._call(self._backend.stat_sync, rel, path))

    async def exists(self, path: str) -> bool:
        """Tell whether anything is at ``path``; containment violations still raise."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if not rel:
            return True
        return await self._call(self._backend.info, rel) is not None

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        """List a directory; see :meth:`WorkspaceFilesystem.readdir`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if recursive:
            # Through _call_write for its cancel event: a walk given up on stops walking.
            entries = await self._call_write(
                self._backend.walk_sync, rel, path, max_depth or _DEFAULT_MAX_DEPTH
            )
        else:
            entries = await self._call(self._backend.list_sync, rel, path)
        return filter_extension(entries, extension)

    async def walk_stats(self, path: str = "", *, max_depth: int | None = None) -> list[tuple[str, FileStat]]:
        """The metadata of every file below ``path`` (names relative to it) from the one
        listing a :meth:`walk` makes: a tree's change detection needs nothing else."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        found = await self._call_write(
            self._backend.walk_stats_sync, rel, path, max_depth or _DEFAULT_MAX_DEPTH
        )
        return [(name, self._public_stat(stat)) for name, stat in found]

    async def list_stats(self, path: str = "") -> list[FileStat]:
        """Metadata of every child of ``path`` from one (paginated) listing request."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        cached = self._cached
        stats = cached.take_listing(rel) if cached is not None else None
        if stats is None:
            stats = await self._call(self._backend.list_stats_sync, rel, path)
        if cached is not None:
            cached.list_ahead(rel, stats)
            cached.preload_stats(stats)
        return [self._public_stat(s) for s in stats]

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish a local file as ``path`` without reading it into memory: a (multipart)
        upload on object stores, a staged copy and rename on local disk."""
        self._check_writable("upload_file")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        await self._call_write(self._backend.upload_sync, rel, path, local_path)

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
        """Publish a local file as ``path`` only over the version ``expected`` (or, with
        ``create``, only where nothing is); see :class:`SupportsConditionalUpload`. On S3 the
        condition is the PUT's own (``If-Match``, ``If-None-Match``). On object stores that
        keep POSIX attributes the object carries ``attributes`` and the foreign metadata
        keys ``keep`` (see :class:`~agentvfs.vfs.SupportsPosixAttributes`)."""
        self._check_writable("upload_file")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        upload = functools.partial(
            self._backend.upload_sync, guard=expected, create=create, **self._published_with(attributes, keep)
        )
        return await self._call_write(upload, rel, path, local_path)

    def _published_with(self, attributes: PosixAttributes | None, keep: Mapping[str, str] | None) -> dict[str, Any]:
        """The keyword arguments of ``upload_sync`` that give a published file ``attributes``
        (object metadata here; local disk sets them on the file itself)."""
        return {"metadata": self._metadata_for(attributes, keep)}

    def _metadata_for(self, attributes: PosixAttributes | None, keep: Mapping[str, str] | None) -> dict[str, str] | None:
        style = self._backend.metadata_style
        if style is None or (attributes is None and not keep):
            return None
        if attributes is None:
            return dict(keep or {})
        return metadata_for(attributes, style, keep)

    # -- POSIX attributes (SupportsPosixAttributes) -------------------------------------------

    @property
    def attribute_storage(self) -> Literal["native", "metadata"] | None:
        """Where this filesystem keeps POSIX attributes: ``metadata`` on object stores that
        keep object metadata, None elsewhere (local disk's own class says ``native``)."""
        return "metadata" if self._backend.metadata_style is not None else None

    async def set_attributes(self, path: str, attrs: PosixAttributes, *, expected: Version | None = None) -> str | None:
        """Keep ``attrs`` with the file ``path``; see :class:`~agentvfs.vfs.SupportsPosixAttributes`."""
        self._check_writable("setattr")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        backend = self._backend
        if not isinstance(backend, ObjectStoreBackend) or backend.metadata_style is None:
            raise PermissionDenied(path, f"set attributes (the {self.provider} store keeps none)")
        return await self._call_write(
            lambda r, p, cancel: backend.set_attributes_sync(r, p, attrs, expected), rel, path
        )

    async def make_special(self, path: str, attrs: PosixAttributes) -> None:
        """Create a symbolic link, FIFO, socket or device node; see
        :class:`~agentvfs.vfs.SupportsPosixAttributes`."""
        self._check_writable("mknod")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        backend = self._backend
        make = getattr(backend, "make_special_sync", None)
        if make is None or self.attribute_storage is None:
            raise PermissionDenied(path, f"create a special file (the {self.provider} store keeps none)")
        await self._call_write(lambda r, p, cancel: make(r, p, attrs), rel, path)

    async def open_upload(
        self,
        path: str,
        *,
        part_size: int,
        attributes: PosixAttributes | None = None,
        keep: Mapping[str, str] | None = None,
    ) -> UploadStream | None:
        """Start a multipart upload of ``path`` on an object store (None elsewhere: a local
        or memory write gains nothing from streaming); the object carries ``attributes``
        and ``keep`` as :meth:`publish_file`'s does."""
        self._check_writable("open_upload")
        backend = self._backend
        if not isinstance(backend, ObjectStoreBackend):
            return None
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        stream = await backend.open_upload_as(
            rel, path, part_size=part_size, metadata=self._metadata_for(attributes, keep)
        )
        return None if stream is None else AnnouncedUpload(stream, self, path)

    async def abort_upload(self, ticket: Mapping[str, str]) -> bool:
        """Abort the streamed upload a ``ticket()`` named (S3 multipart uploads; False where
        the store cannot, or no longer knows it)."""
        abort = getattr(self._backend, "abort_upload_sync", None)
        if abort is None:
            return False
        if self.status != "ready":
            await self.ensure_ready()
        return bool(await self._call(abort, ticket))

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path`` in a streamed transfer."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call(self._backend.download_sync, rel, path, local_path)

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """List a whole tree in one paginated request on object stores.

        Names are relative to ``path``; hidden entries (a segment starting with ``.``) and
        everything below hidden directories are dropped unless ``include_hidden``.
        """
        entries = await self.readdir(path, recursive=True, max_depth=max_depth)
        return entries if include_hidden else drop_hidden(entries)

    # -- write side ---------------------------------------------------------------------------------

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
        """Write a whole file atomically; see :meth:`WorkspaceFilesystem.write_file`."""
        rel, data = await self._whole_write(path, content)
        backend = self._backend
        guard = backend.known.guard(rel, expected_mtime) if expected_mtime is not None else None
        try:
            await self._call_write(self._write, rel, path, data, recursive, overwrite, guard, mime_type)
        except StaleFileError as exc:
            if exc.actual_mtime is not None:
                raise
            # Gone since it was seen: the write creates it, as the reference does (and fails
            # if someone else created it meanwhile).
            await self._call_write(self._write, rel, path, data, recursive, False, None, mime_type)

    def _write(
        self,
        rel: str,
        display: str,
        data: bytes,
        recursive: bool,
        overwrite: bool,
        guard: Any,
        mime_type: str | None,
        cancel: threading.Event,
    ) -> None:
        self._backend.write_sync(
            rel, display, data, recursive=recursive, overwrite=overwrite, guard=guard,
            mime_type=mime_type, cancel=cancel,
        )  # fmt: skip

    async def put_new(self, path: str, content: bytes) -> None:
        """Create ``path`` holding ``content``, never over a file; see :func:`agentvfs.vfs.put_new`.

        On object stores one create-only PUT, without the parent checks of :meth:`write_file`;
        elsewhere the same as ``write_file(path, content, overwrite=False)``."""
        rel, data = await self._whole_write(path, content)
        await self._call_write(self._backend.put_new_sync, rel, path, data)

    async def _whole_write(self, path: str, content: str | bytes) -> tuple[str, bytes]:
        """The checks every whole-file write makes; its relative path and bytes."""
        self._check_writable("write_file")
        data = as_bytes(content)
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        return rel, data

    async def append_file(self, path: str, content: str | bytes) -> None:
        """Append to a file, creating it and its parents if missing: the whole object is
        rewritten with a version check, so a concurrent writer is never silently overwritten
        (local disk appends in place)."""
        self._check_writable("append_file")
        await super().append_file(path, content)

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        """Delete a file; see :meth:`WorkspaceFilesystem.delete_file`."""
        self._check_writable("delete_file")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise IsDirectory(path)
        await self._call(self._backend.delete_sync, rel, path, force)

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Create a directory; see :meth:`WorkspaceFilesystem.mkdir`."""
        self._check_writable("mkdir")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            return
        await self._call(self._backend.mkdir_sync, rel, path, recursive)

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Remove a directory; see :meth:`WorkspaceFilesystem.rmdir`."""
        self._check_writable("rmdir")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._is_root(rel):
            raise PermissionDenied(path or ".", "rmdir (the workspace root cannot be removed)")
        await self._call(self._backend.rmdir_sync, rel, path, recursive, force)

    async def copy_file(
        self, src: str, dest: str, *, overwrite: bool = True, recursive: bool = False
    ) -> None:
        """Copy a file (server side where the backend can) or, with ``recursive``, a tree."""
        self._check_writable("copy_file")
        if self.status != "ready":
            await self.ensure_ready()
        src_rel, dest_rel = self._rel(src), self._rel(dest)
        info = await self._call(self._backend.info, src_rel)
        if info is None and src_rel:
            raise FileNotFound(src)
        if info is None or info.get("type") == "directory":
            if not recursive:
                raise IsDirectory(src)
            await self._copy_tree(src, dest, overwrite=overwrite)
            return
        if src_rel == dest_rel:
            # Copying a file onto itself changes nothing (object stores would refuse it).
            if not overwrite:
                raise FileExists(dest)
            return
        if self._is_root(dest_rel):
            raise IsDirectory(dest)
        await self._call_write(self._backend.copy_sync, src_rel, src, dest_rel, dest, overwrite)

    async def _copy_tree(self, src: str, dest: str, *, overwrite: bool) -> None:
        # Each file copied by the store itself (server side on object stores), so its object
        # metadata goes along; a directory's marker object too, where it has one.
        backend = self._backend
        await self.mkdir(dest, recursive=True)
        markers = backend if isinstance(backend, ObjectStoreBackend) else None
        if markers is not None:
            await self._call(markers.copy_marker_sync, self._rel(src), self._rel(dest))
        for entry in await self.readdir(src, recursive=True):
            source = _paths.join(_paths.normalize(src), entry.name)
            target = _paths.join(_paths.normalize(dest), entry.name)
            if entry.type == "directory":
                await self.mkdir(target, recursive=True)
                if markers is not None:
                    await self._call(markers.copy_marker_sync, self._rel(source), self._rel(target))
                continue
            try:
                await self._call_write(backend.copy_sync, self._rel(source), source, self._rel(target), target, overwrite)
            except FileExistsError:
                # A tree copy without overwrite keeps what is already there, like ``cp -n``.
                continue

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        """Move a file or directory: an atomic rename on local disk and in memory, else copy
        then delete (not atomic: a failure in between leaves both copies, never neither)."""
        self._check_writable("move_file")
        if self.status != "ready":
            await self.ensure_ready()
        src_rel, dest_rel = self._rel(src), self._rel(dest)
        if src_rel == dest_rel:
            # Like rename(2): moving onto itself is a no-op (never copy-then-delete it away).
            if await self._call(self._backend.info, src_rel) is None:
                raise FileNotFound(src)
            if not overwrite:
                raise FileExists(dest)
            return
        if not self.capabilities.atomic_rename:
            await super().move_file(src, dest, overwrite=overwrite)
            return
        await self._call(self._move_sync, src_rel, src, dest_rel, dest, overwrite)

    def _move_sync(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> None:
        if self._is_root(src_rel):
            raise PermissionDenied(src or ".", "move_file (the workspace root cannot be moved)")
        if self._is_root(dest_rel):
            if self._backend.info(src_rel) is None:
                raise FileNotFound(src)
            raise IsDirectory(dest)
        self._backend.move_sync(src_rel, src, dest_rel, dest, overwrite)

    # -- search --------------------------------------------------------------------------------------

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
        """Search the text files below ``path`` (by extension) for a Python regex.

        The tree is listed in one paginated request on object stores and the files fetched
        in concurrent batches, instead of one round trip per directory and file. Matching may
        take :data:`~agentvfs.vfs._grep.DEFAULT_MATCH_TIMEOUT` seconds of wall-clock time over
        all files, else :class:`~agentvfs.errors.MatchTimeout` is raised.
        """
        regex = compile_pattern(pattern, case_sensitive=case_sensitive)
        rel = self._rel(path)
        info = await self._call(self._backend.info, rel) if rel else {"type": "directory"}
        if info is None:
            raise FileNotFound(path)
        if info.get("type") == "directory":
            entries = await self.walk(path, include_hidden=include_hidden)
            files = [
                _paths.join(rel, e.name)
                for e in entries
                if e.type == "file" and is_text_file(e.name, self.text_extensions)
            ]
        else:
            files = [rel]
        contents = await self._call(self._cat_many, files, None)

        def match() -> list[GrepFileResult]:
            # In a worker thread: the regex engine releases the GIL, so the event loop runs
            # while a slow pattern uses up its budget (MatchTimeout names the public path).
            results: list[GrepFileResult] = []
            budget = max_total_matches
            for rel_file in files:
                data = contents.get(rel_file)
                if not isinstance(data, bytes):
                    continue
                found = grep_lines(
                    self._public_path(rel_file), data, regex, max_count=max_count_per_file,
                    context_lines=context_lines, budget=budget,
                )  # fmt: skip
                if found is None:
                    continue
                results.append(found)
                if budget is not None:
                    budget -= len(found.matches)
                    if budget <= 0:
                        break
            return results

        try:
            found = await run_sync(match)
        except BaseException:
            regex.cancel()  # an abandoned search stops at once, its matcher process too
            raise
        regex.close()
        return found

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        """Read bytes ``start`` to ``end`` (exclusive) of a file: one ranged request on object
        stores, a seek and read elsewhere.

        Raises
        ------
        FileNotFound, IsDirectory, PermissionDenied
            As :meth:`read_file`.
        """
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if start >= end:
            return b""
        if self._is_root(rel):
            raise IsDirectory(path)
        backend = self._backend
        if isinstance(backend, MemoryStoreBackend):
            return backend.read_range_now(rel, path, start, end)  # no thread, no await
        if self._cached is not None:
            buffer = bytearray(end - start)
            count = await self._cached.read_into(rel, start, memoryview(buffer))
            if count is not None:
                return bytes(buffer[:count])
        return await self._call(backend.read_range_sync, rel, path, start, end)

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        """Read bytes from ``start`` into ``buffer``; see :func:`agentvfs.vfs._base.read_range_into`.

        On S3 and GCS the response lands in the buffer straight from the socket: a reader
        that reuses its buffers touches no fresh memory per range.
        """
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if not len(buffer):
            return 0
        if self._is_root(rel):
            raise IsDirectory(path)
        if self._cached is not None:
            count = await self._cached.read_into(rel, start, buffer)
            if count is not None:
                return count
        return await self._call(self._backend.read_into_sync, rel, path, start, buffer)

    async def read_range_pinned(self, path: str, start: int, buffer: memoryview, version: str) -> int:
        """:meth:`read_range_into` of the version ``version`` (an ``etag``) of the file only;
        see :class:`SupportsPinnedRead`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if not len(buffer):
            return 0
        if self._is_root(rel):
            raise IsDirectory(path)
        if self._cached is not None:
            count = await self._cached.read_version_into(rel, path, start, buffer, version)
            if count is not None:
                return count
        return await self._call(self._backend.read_version_into_sync, rel, path, start, buffer, version)

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        """Read many files in concurrent batches (on object stores one GET each, no HEAD).

        Each path maps to its bytes, or to the error it raised (outside the root, missing,
        a directory, or a link on local disk that leads out; ``FileTooLarge`` past
        ``max_bytes``, of which no more than one byte beyond is read on local disk).
        """
        if self.status != "ready":
            await self.ensure_ready()
        out: dict[str, bytes | OSError] = {}
        rels: dict[str, str] = {}
        for path in paths:
            try:
                rels[path] = self._rel(path)
            except OSError as exc:
                out[path] = exc
        got = await self._call(self._cat_many, list(set(rels.values())), max_bytes)
        for path, rel in rels.items():
            data = got.get(rel)
            if isinstance(data, FileTooLarge):
                out[path] = FileTooLarge(path, data.limit)
            elif isinstance(data, bytes) and max_bytes is not None and len(data) > max_bytes:
                out[path] = FileTooLarge(path, max_bytes)
            else:
                out[path] = data if isinstance(data, bytes) else FileNotFound(path)
        return out

    def _cat_many(self, rels: list[str], max_bytes: int | None) -> dict[str, bytes | OSError]:
        if self._cached is not None:
            return self._cached.cat_many(rels, max_bytes)
        return self._backend.cat_many(rels, max_bytes)

    # -- the content cache ---------------------------------------------------------------------------

    def use_cache(
        self,
        cache: ContentCache | bool | str | os.PathLike[str] = True,
        *,
        cache_bytes: int | None = None,
        metadata_ttl: float = 5.0,
    ) -> ContentCache | None:
        """Keep what is read of remote storage in a persistent local cache from now on.

        Whole files are kept under their storage, path and version, so a file changed in
        storage is never served from the cache: every read knows the file's version first,
        from a listing or stat at most ``metadata_ttl`` seconds old, else by asking storage
        (close-to-open). ``read_file``, ``read_many``, ``grep`` and ranged reads use it, and a
        FUSE mount of this filesystem serves cached files from local disk. Only stores whose
        reads can name a version (S3, GCS) are cached; on others this does nothing.

        Parameters
        ----------
        cache : ContentCache, bool, str or path-like
            ``True`` for :func:`~agentvfs.vfs.default_cache_dir`, a directory, or a cache.
        cache_bytes : int, optional
            The budget of a cache made here (default
            :data:`~agentvfs.vfs.DEFAULT_CACHE_BYTES`).
        metadata_ttl : float
            Seconds a version seen in a listing or stat is trusted.

        Returns
        -------
        ContentCache or None
            The cache in use; None where this store is not cached.
        """
        if isinstance(cache, ContentCache):
            if cache_bytes is not None:
                raise TypeError("cache_bytes applies to a cache made here, not to a ContentCache given")
            made = cache
        elif cache is True or isinstance(cache, (str, os.PathLike)):
            directory = None if cache is True else cache
            made = ContentCache(directory, **({} if cache_bytes is None else {"max_bytes": cache_bytes}))
        else:
            raise TypeError(f"cache must be True, a directory or a ContentCache, not {cache!r}")
        if metadata_ttl < 0:
            raise ValueError(f"metadata_ttl must be at least 0 seconds, not {metadata_ttl!r}")
        backend = self._backend
        if not isinstance(backend, ObjectStoreBackend):
            return None  # local files and memory need no cache; other stores cannot pin versions
        if self._cached is not None:
            self._cached.close()
        else:
            # Every change announced by this object (writes, deletes, moves, directories)
            # distrusts what was seen of its paths; writes through _call_write are covered too.
            self.watch(self._forget_changed)
        self._cached = _CachedReads(self, made, metadata_ttl)
        return made

    def _forget_changed(self, fs: WorkspaceFilesystem, operation: str, paths: tuple[str, ...]) -> None:
        if self._cached is not None:
            rels: list[str] = []
            for path in paths:
                try:
                    rels.append(self._rel(path))
                except OSError:
                    continue
            self._cached.forget(*rels)

    @property
    def cache(self) -> ContentCache | None:
        """The content cache in use (see :meth:`use_cache`), or None."""
        return self._cached.cache if self._cached is not None else None

    async def open_cached(self, path: str, version: str, size: int, *, fetch_below: int = 0) -> int | None:
        """A read-only descriptor of the cached bytes of ``version`` of ``path`` (``size``
        bytes), fetching it first when it is missing and smaller than ``fetch_below``; None
        where it is not cached (or there is no cache). The caller closes the descriptor."""
        if self._cached is None:
            return None
        return await self._cached.open(self._rel(path), path, version, size, fetch_below)

    def prefetch(self, files: Sequence[tuple[str, str, int]]) -> None:
        """Fetch the ``(path, version, size)`` files into the cache in the background (a
        bounded number at a time); returns at once. Nothing without a cache."""
        if self._cached is not None:
            self._cached.prefetch([(self._rel(p), v, n) for p, v, n in files])

    def flush_cache(self) -> None:
        """Wait for what the cache is being filled with in the background (prefetches, the
        parts of files read through) to be written; blocking. Nothing without a cache."""
        if self._cached is not None:
            self._cached.flush()

    async def close_cache(self) -> None:
        """Stop using the cache: background fetches are abandoned, descriptors closed."""
        if self._cached is not None:
            cached, self._cached = self._cached, None
            await run_sync(cached.close)

    # -- description ---------------------------------------------------------------------------------

    def default_instructions(self) -> str:
        """Describe the storage and its path rules to an agent."""
        where = f"{self._protocol}://{self._root}" if self._root else f"{self._protocol}://"
        mode = " It is read-only." if self.read_only else ""
        return (
            f'Filesystem at "{where}". Relative paths resolve from its root; '
            f'"/" also means the root and paths cannot leave it.{mode}'
        )

    def get_mount_config(self) -> dict[str, Any]:
        """Return ``{"type": "fsspec", "protocol", "root", "read_only"}``; never credentials."""
        return {
            "type": "fsspec",
            "protocol": self.provider,
            "root": self._root,
            "read_only": self.read_only,
        }

    def metadata(self) -> dict[str, Any]:
        """Protocol and root (never storage options or credentials)."""
        return {"protocol": self.provider, "root": self._root}

    def __repr__(self) -> str:
        return (
            f"FsspecFilesystem(protocol={self.provider!r}, root={self._root!r}, "
            f"read_only={self.read_only})"
        )
