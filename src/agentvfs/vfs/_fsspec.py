"""``FsspecFilesystem``: any fsspec backend as a workspace filesystem under a root."""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    FileTooLarge,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
)
from . import _paths
from ._backend import KnownVersions, translate
from ._base import (
    UploadStream,
    WorkspaceFilesystem,
    as_bytes,
    decoded,
    drop_hidden,
    filter_extension,
    new_id,
    order_tree,
    run_sync,
)
from ._disk import TMP_MARK as _TMP_MARK
from ._disk import staged_name
from ._grep import compile_pattern, grep_lines
from ._mime import get_mime_type, is_text_file
from ._ranged import SignedRangeReader, signed_range_reader
from ._records import Capabilities, FileEntry, FileStat, FileType, GrepFileResult

__all__ = ["FsspecFilesystem"]

T = TypeVar("T")

# Protocols whose directories are only key prefixes (plus optional "dir/" marker objects).
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2"})
_PROVIDER_ALIASES = {"gs": "gcs", "local": "file", "s3a": "s3", "abfss": "abfs", "az": "abfs"}

_UPLOAD_CHUNK = 160 * 1024 * 1024
# Files read at once by a batch read through signed URLs (read_many, grep).
_READ_THREADS = 16


_EPOCH = datetime.fromtimestamp(0, UTC)
_DEFAULT_MAX_DEPTH = 100
# A directory whose listing is larger than this is not cached for write checks; a write
# into it checks its own name instead (one request) rather than re-listing thousands of keys.
_LISTING_CACHE_LIMIT = 2000
# However slow a listing was, its names are not trusted longer than this.
_LISTING_TTL_CAP = 30.0


_NEVER = threading.Event()


def _names_local_disk(fs_or_url: Any) -> bool:
    """Whether ``FsspecFilesystem(fs_or_url)`` would sit on this machine's disk."""
    if isinstance(fs_or_url, LocalFileSystem):
        return True
    if isinstance(fs_or_url, str) and "::" not in fs_or_url:
        protocol, _ = fsspec.core.split_protocol(fs_or_url)
        return protocol in (None, "file", "local")
    return False


class _Cancelled(Exception):
    """Internal: a staged write saw its caller give up before committing."""


class _Listings:
    """Short-lived knowledge of the names in object-store directories, for write checks.

    On an object store nothing stops a key ``a`` and a prefix ``a/`` from coexisting, so a
    write must check that it does not create a file where a directory is (or under a file).
    Doing that with a request per write would double its cost; instead the names of a
    directory are listed once and kept for ``ttl`` seconds, updated by our own writes. Only
    these checks, and a forced delete of a name they show as a file (which then skips its
    existence check: deleting a missing key succeeds anyway), read it: reads, stats and
    listings always go to the backend.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._dirs: OrderedDict[str, tuple[float, dict[str, str] | None]] = OrderedDict()

    def get(self, rel: str) -> tuple[bool, dict[str, str] | None]:
        """Return ``(known, names)``; ``names`` None means the directory is too big to keep."""
        with self._lock:
            item = self._dirs.get(rel)
            if item is None or item[0] < time.monotonic():
                return False, None
            return True, item[1]

    def put(self, rel: str, names: dict[str, str] | None, cost: float = 0.0) -> None:
        """Keep ``names`` for ``ttl`` seconds, or 25 times what listing them cost, so that
        re-listing a large directory takes at most 4 % of the time spent writing into it."""
        if self.ttl <= 0:
            return  # listing_ttl=0 turns the cache off: every write check lists afresh
        with self._lock:
            self._dirs[rel] = (time.monotonic() + min(max(self.ttl, 25 * cost), _LISTING_TTL_CAP), names)
            self._dirs.move_to_end(rel)
            while len(self._dirs) > 256:
                self._dirs.popitem(last=False)

    def add(self, rel: str, kind: str) -> None:
        """Record that ``rel`` now exists as ``kind``, and every ancestor as a directory, in
        whatever parent listings are kept (a write to ``a/b/c`` makes ``b`` a directory of ``a``)."""
        with self._lock:
            while rel:
                parent, name = _paths.dirname(rel), _paths.basename(rel)
                item = self._dirs.get(parent)
                if item is not None and item[1] is not None:
                    item[1][name] = kind
                rel, kind = parent, "directory"

    def discard(self, rel: str) -> None:
        """Record that ``rel`` (and everything below it) is gone."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        with self._lock:
            item = self._dirs.get(parent)
            if item is not None and item[1] is not None:
                item[1].pop(name, None)
            below = rel + "/"
            for key in [k for k in self._dirs if k == rel or k.startswith(below)]:
                del self._dirs[key]

    def kind(self, rel: str) -> str | None:
        """``"file"`` or ``"directory"`` when a kept listing of the parent shows ``rel``."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        with self._lock:
            item = self._dirs.get(parent)
            if item is None or item[0] < time.monotonic() or item[1] is None:
                return None
            return item[1].get(name)

    def has_others(self, rel: str) -> bool:
        """Tell whether the kept listing of ``rel``'s parent shows entries besides ``rel``."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        with self._lock:
            item = self._dirs.get(parent)
            if item is None or item[0] < time.monotonic() or item[1] is None:
                return False
            return any(n != name for n in item[1])

    def forget(self, rel: str | None = None) -> None:
        """Drop what is known about ``rel``, its parent and everything below it (or all)."""
        with self._lock:
            if rel is None:
                self._dirs.clear()
                return
            self._dirs.pop(_paths.dirname(rel), None)
            below = rel + "/"
            for key in [k for k in self._dirs if k == rel or k.startswith(below)]:
                del self._dirs[key]


def _to_datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _first(info: dict[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        value = info.get(key)
        if value is not None:
            return value
    return None


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _display_parent(display: str) -> str:
    return posixpath.dirname(display.rstrip("/")) or "."


class _FileUpload:
    """A streamed upload through an fsspec file object (parts go out as they fill)."""

    def __init__(self, owner: FsspecFilesystem, rel: str, display: str, handle: Any) -> None:
        self._owner = owner
        self._rel = rel
        self._display = display
        self._handle = handle

    async def write(self, data: bytes) -> None:
        try:
            await self._owner._call(self._handle.write, data)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._owner._translate(exc, self._display, "upload") from exc

    async def commit(self) -> None:
        try:
            await self._owner._call(self._handle.close)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._owner._translate(exc, self._display, "upload") from exc
        self._owner._listings.add(self._rel, "file")
        self._owner._announce("upload_file", (self._display,))

    async def abort(self) -> None:
        with contextlib.suppress(Exception):
            await self._owner._call(self._handle.discard)


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
        # One class per storage kind, chosen here: local disk gets the descriptor-based one.
        if cls is FsspecFilesystem and _names_local_disk(fs_or_url):
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
            fs, base = fsspec.core.url_to_fs(fs_or_url, **(storage_options or {}))
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
        self._fs: fsspec.AbstractFileSystem = fs
        self._root = stripped.rstrip("/")
        marker = getattr(fs, "root_marker", "")
        self._prefix = f"{self._root}/" if self._root else marker
        self._root_path = self._root or marker
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        first = protocols[0] if protocols else "unknown"
        self.provider = _PROVIDER_ALIASES.get(first, first)
        self._protocol = first
        self._memory = isinstance(fs, MemoryFileSystem)
        self._local = isinstance(fs, LocalFileSystem)
        self._object = bool(set(protocols) & _OBJECT_STORES)
        self.capabilities = Capabilities(
            empty_dirs=not self._object,
            atomic_rename=self._local or self._memory,
            symlinks=self._local,
            versions=self._object,
            blocking=not self._memory,
        )
        self._ls_kwargs: dict[str, Any] = {"refresh": True} if self._object else {}
        self._listings = _Listings(listing_ttl)
        self._known = KnownVersions()
        #: Ranged reads through signed URLs where the store signs them (``_ranged``).
        self._ranged: SignedRangeReader | None = signed_range_reader(fs) if self._object else None

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The wrapped fsspec instance (no confinement: use with care)."""
        return self._fs

    @property
    def root(self) -> str:
        """The backend path of the workspace root."""
        return self._root_path

    @property
    def location(self) -> str | None:
        return self._root_path or None

    def _bpath(self, rel: str) -> str:
        return self._prefix + rel if rel else self._root_path

    def _rel(self, path: str) -> str:
        return _paths.normalize(path)

    def _is_root(self, rel: str) -> bool:
        return not rel

    def _public_path(self, rel: str) -> str:
        """How results name ``rel``: relative to the workspace root, ``/``-separated."""
        return rel

    async def probe(self) -> None:
        """One request that proves the storage answers; on object stores, that the bucket
        exists (a missing bucket otherwise looks like an empty root)."""
        if self.status != "ready":
            await self.ensure_ready()
        if self._object:
            bucket = self._root_path.strip("/").split("/", 1)[0]
            if bucket and not await self._call(self._bucket_exists, bucket):
                raise DirectoryNotFound(f"{self._protocol}://{bucket}")
            return
        await self.stat("")

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            return bool(self._fs.exists(bucket))
        except FileNotFoundError:
            return False
        except Exception:
            return True  # cannot tell (no permission to look at the bucket): let requests decide
        finally:
            self._fs.invalidate_cache(bucket)

    async def setup(self) -> None:
        """Create the root directory on backends with real directories (not object stores)."""
        if not self._object and not self.read_only and self._root:
            await self._call(self._fs.makedirs, self._root_path, True)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self.capabilities.blocking:
            return await run_sync(fn, *args)
        return fn(*args)

    async def _call_write(self, fn: Callable[..., T], *args: Any) -> T:
        # A write abandoned by a timeout keeps running in its thread; the event tells it not
        # to commit, so the operation lands whole before the deadline or not at all. Inline
        # (memory) writes cannot be abandoned midway and share one event that is never set.
        if not self.capabilities.blocking:
            return fn(*args, _NEVER)
        cancel = threading.Event()
        try:
            return await self._call(fn, *args, cancel)
        except anyio.get_cancelled_exc_class():
            cancel.set()
            raise

    def _info(self, rel: str) -> dict[str, Any] | None:
        """Backend info of ``rel`` or None if nothing is there."""
        bpath = self._bpath(rel)
        if self._memory:
            # MemoryFileSystem.info scans every key; files are a dict lookup away.
            item = self._fs.store.get(bpath)
            if item is not None:
                return {"name": bpath, "size": item.size, "type": "file"}
        try:
            info: dict[str, Any] = self._fs.info(bpath)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            if self._object:
                self._fs.invalidate_cache(bpath)
        return info

    def _stat_from_info(self, rel: str, info: dict[str, Any]) -> FileStat:
        kind: FileType = "directory" if info.get("type") == "directory" else "file"
        bpath = self._bpath(rel)
        modified: datetime | None
        if self._memory and kind == "file":
            item = self._fs.store.get(bpath)
            modified = getattr(item, "modified", None)
            created = getattr(item, "created", None) or modified
        else:
            modified = _to_datetime(
                _first(info, ("mtime", "LastModified", "updated", "last_modified", "modified"))
            )
            created = _to_datetime(
                _first(info, ("created", "timeCreated", "creation_time", "ctime"))
            )
        modified = modified or created or _EPOCH
        etag = _first(info, ("generation", "ETag", "etag", "md5Hash", "VersionId"))
        if etag is None and kind == "file":
            # No native version: derive one that changes on every write even within one
            # clock tick (staged writes give a new inode; memory keeps microseconds).
            if self._memory:
                etag = f"{modified.timestamp():.6f}-{info.get('size')}"
            elif "ino" in info:
                etag = f"{info.get('mtime')}-{info.get('size')}-{info['ino']}"
        name = _paths.basename(rel) if rel else (posixpath.basename(self._root) or "")
        stat = FileStat(
            name=name,
            path=rel,
            type=kind,
            size=int(info.get("size") or 0),
            created_at=created or modified,
            modified_at=modified,
            mime_type=get_mime_type(name) if kind == "file" else None,
            etag=str(etag).strip('"') if etag is not None and kind == "file" else None,
        )
        self._known.remember(stat)
        return stat

    def _translate(self, exc: BaseException, display: str, operation: str) -> BaseException:
        """Map a backend exception to the most specific workspace error (one table for
        every backend: :func:`~agentvfs.vfs.translate`)."""
        return translate(exc, display, operation)

    # -- read side ------------------------------------------------------------------------------

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        """Read a whole file; see :meth:`WorkspaceFilesystem.read_file`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if self._memory:
            # The hot path of an in-process store: one dict lookup, no thread, no await.
            item = self._fs.store.get(self._prefix + rel) if rel else None
            data = bytes(item.getbuffer()) if item is not None else self._read_sync(rel, path)
        else:
            data = await self._call(self._read_sync, rel, path)
        return decoded(data, encoding, path)

    def _read_sync(self, rel: str, display: str, start: int | None = None, end: int | None = None) -> bytes:
        if not rel:
            raise IsDirectory(display)
        if start is None and end is None and self._ranged is not None:
            # One plain GET (s3fs sizes the object with a HEAD before its GET).
            whole = self._ranged.read_whole(self._bpath(rel))
            if whole is not None:
                return whole
        try:
            data: bytes = self._fs.cat_file(self._bpath(rel), start=start, end=end)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            info = self._info(rel)
            if info is not None and info.get("type") == "directory":
                raise IsDirectory(display) from None
            raise FileNotFound(display) from None
        except Exception as exc:
            raise self._translate(exc, display, "read_file") from exc
        return data

    async def stat(self, path: str) -> FileStat:
        """Return metadata; see :meth:`WorkspaceFilesystem.stat`."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        return await self._call(self._stat_sync, rel, path)

    def _stat_sync(self, rel: str, display: str) -> FileStat:
        try:
            info = self._info(rel)
        except Exception as exc:
            raise self._translate(exc, display, "stat") from exc
        if info is None:
            if not rel:
                # The root always exists, even as an empty object-store prefix.
                return FileStat(
                    name=posixpath.basename(self._root), path="", type="directory", size=0,
                    created_at=_EPOCH, modified_at=_EPOCH,
                )
            raise FileNotFound(display)
        return self._stat_from_info(rel, info)

    async def exists(self, path: str) -> bool:
        """Tell whether anything is at ``path``; containment violations still raise."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if not rel:
            return True
        return await self._call(self._info, rel) is not None

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
            entries = await self._call_write(self._walk_sync, rel, path, max_depth or _DEFAULT_MAX_DEPTH)
        else:
            entries = await self._call(self._list_sync, rel, path)
        return filter_extension(entries, extension)

    async def list_stats(self, path: str = "") -> list[FileStat]:
        """Metadata of every child of ``path`` from one (paginated) listing request."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        return await self._call(self._list_stats_sync, rel, path)

    def _list_stats_sync(self, rel: str, display: str) -> list[FileStat]:
        started = time.monotonic()
        children = self._listed(rel, display)
        if self._object:
            # A fresh listing: write checks and forced deletes in this directory (a FUSE mount
            # lists before it deletes) need no request of their own for a while.
            kinds = {n: "directory" if i.get("type") == "directory" else "file" for n, i in children.items()}
            self._keep_listing(rel, kinds, time.monotonic() - started)
        return [
            self._stat_from_info(_paths.join(rel, name) if rel else name, info)
            for name, info in sorted(children.items())
        ]

    async def upload_file(self, local_path: str, path: str) -> None:
        """Publish a local file as ``path`` without reading it into memory: a (multipart)
        upload on object stores, a staged copy and rename on local disk."""
        self._check_writable("upload_file")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call_write(self._upload_sync, rel, path, local_path)

    def _upload_sync(self, rel: str, display: str, local_path: str, cancel: threading.Event) -> None:
        if not rel:
            raise IsDirectory(display)
        try:
            if self._object:
                self._prepare_object_parent(rel, display, True)
            else:
                self._prepare_parent(rel, display, True)
            if cancel.is_set():
                raise _Cancelled
            bpath = self._bpath(rel)
            if self._object:
                # One upload that appears whole when it completes: a single PUT up to twice
                # the chunk size (fastest per file on every server measured), else a multipart
                # upload with parts sent in parallel.
                if self.provider == "s3" and os.path.getsize(local_path) < 2 * _UPLOAD_CHUNK:
                    # The open file as the body: streamed from disk, where put_file would first
                    # copy it whole into memory (twice as slow here).
                    bucket, key, _ = self._fs.split_path(bpath)
                    with open(local_path, "rb") as body:
                        self._fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body)
                elif self.provider == "s3":
                    self._fs.put_file(local_path, bpath, chunksize=_UPLOAD_CHUNK, max_concurrency=4)
                else:
                    self._fs.put_file(local_path, bpath)
            elif self._memory:
                if bpath in self._fs.pseudo_dirs:
                    raise IsDirectory(display)
                with open(local_path, "rb") as f:
                    self._fs.pipe_file(bpath, f.read())
            else:
                self._publish(rel, display, lambda tmp: self._fs.put_file(local_path, tmp), True, cancel)
        except _Cancelled:
            return
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._translate(exc, display, "upload_file") from exc
        if self._object:
            self._listings.add(rel, "file")

    async def open_upload(self, path: str, *, part_size: int) -> UploadStream | None:
        """Start a multipart upload of ``path`` on an object store (None elsewhere: a local
        or memory write gains nothing from streaming)."""
        self._check_writable("open_upload")
        if not self._object:
            return None
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        if not rel:
            raise IsDirectory(path)
        handle = await self._call(self._open_upload_sync, rel, path, part_size)
        if not callable(getattr(handle, "discard", None)):
            # Without a way to drop a half-done upload, closing would publish it.
            await self._call(handle.close)
            return None
        return _FileUpload(self, rel, path, handle)

    def _open_upload_sync(self, rel: str, display: str, part_size: int) -> Any:
        try:
            self._prepare_object_parent(rel, display, True)
            return self._fs.open(self._bpath(rel), "wb", block_size=part_size)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._translate(exc, display, "open_upload") from exc

    async def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path`` in a streamed transfer."""
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call(self._download_sync, rel, path, local_path)

    def _download_sync(self, rel: str, display: str, local_path: str) -> None:
        bpath = self._bpath(rel)
        try:
            if self._memory:
                # get_file copies through Python a block at a time; this is one write.
                with open(local_path, "wb") as f:
                    f.write(self._fs.cat_file(bpath))
            else:
                self._fs.get_file(bpath, local_path)
        except FilesystemError:
            raise
        except IsADirectoryError:
            raise IsDirectory(display) from None
        except Exception as exc:
            raise self._translate(exc, display, "download_file") from exc

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        """List a whole tree in one paginated request on object stores.

        Names are relative to ``path``; hidden entries (a segment starting with ``.``) and
        everything below hidden directories are dropped unless ``include_hidden``.
        """
        entries = await self.readdir(path, recursive=True, max_depth=max_depth)
        return entries if include_hidden else drop_hidden(entries)

    def _entry(self, name: str, info: dict[str, Any]) -> FileEntry:
        kind: FileType = "directory" if info.get("type") == "directory" else "file"
        link = bool(info.get("islink"))
        target = info.get("destination") if link else None
        return FileEntry(
            name=name,
            type=kind,
            size=int(info.get("size") or 0) if kind == "file" and not link else None,
            is_symlink=link,
            symlink_target=target,
        )

    def _missing_dir(self, rel: str, display: str) -> FilesystemError:
        info = self._info(rel)
        if info is None:
            return DirectoryNotFound(display)
        return NotDirectory(display)

    def _require_dir(self, rel: str, display: str) -> None:
        """An empty listing: fine for an empty directory, else the listing's error."""
        info = self._info(rel)
        if info is None or info.get("type") != "directory":
            raise NotDirectory(display) if info is not None else DirectoryNotFound(display)

    def _list_raw(self, rel: str, display: str) -> list[dict[str, Any]]:
        bpath = self._bpath(rel)
        try:
            raw: list[dict[str, Any]] = self._fs.ls(bpath, detail=True, **self._ls_kwargs)
        except FileNotFoundError:
            if not rel:
                return []  # the root always exists, even as an empty object-store prefix
            raise self._missing_dir(rel, display) from None
        except NotADirectoryError:
            # The path itself is a file (ENOTDIR), or a file sits above it: then, as on
            # object stores, the directory is simply not there (ENOENT).
            raise self._missing_dir(rel, display) from None
        except Exception as exc:
            raise self._translate(exc, display, "readdir") from exc
        finally:
            if self._object:
                self._fs.invalidate_cache(bpath)
        return raw

    def _children(self, rel: str, raw: list[dict[str, Any]], display: str) -> dict[str, dict[str, Any]]:
        """Name -> info of the entries of ``rel``, without markers, staging files or itself."""
        own = self._bpath(rel).rstrip("/")
        out: dict[str, dict[str, Any]] = {}
        for info in raw:
            full = info["name"].rstrip("/")
            if full == own or not full:
                if info.get("type") == "file" and not info["name"].endswith("/") and full == own and rel:
                    raise NotDirectory(display)
                continue
            name = posixpath.basename(full)
            if _TMP_MARK in name:
                continue
            # Where a key and a prefix share a name, the directory wins (it shadows the file).
            if name in out and out[name].get("type") == "directory":
                continue
            out[name] = info
        return out

    def _list_memory(self, rel: str, display: str) -> list[FileEntry]:
        # MemoryFileSystem.ls builds an info dict per key; one pass over its store and
        # pseudo-directories gives the entries directly.
        bpath = self._bpath(rel)
        store = self._fs.store
        if rel and bpath in store:
            raise NotDirectory(display)
        head = bpath.rstrip("/") + "/"
        cut = len(head)
        files: dict[str, int] = {}
        dirs: set[str] = set()
        for key in list(store):
            if key.startswith(head):
                rest = key[cut:]
                slash = rest.find("/")
                if slash < 0:
                    files[rest] = store[key].size
                else:
                    dirs.add(rest[:slash])
        for pdir in list(self._fs.pseudo_dirs):
            if pdir.startswith(head):
                rest = pdir[cut:]
                slash = rest.find("/")
                dirs.add(rest if slash < 0 else rest[:slash])
        if not files and not dirs and rel and bpath not in self._fs.pseudo_dirs:
            raise DirectoryNotFound(display)
        entries = [FileEntry(n, "directory") for n in dirs if _TMP_MARK not in n]
        # Where a key and a prefix share a name, the directory wins (it shadows the file).
        entries.extend(FileEntry(n, "file", size) for n, size in files.items() if n not in dirs and _TMP_MARK not in n)
        entries.sort(key=lambda e: e.name)
        return entries

    def _list_sync(self, rel: str, display: str) -> list[FileEntry]:
        if self._memory:
            return self._list_memory(rel, display)
        children = self._listed(rel, display)
        return [self._entry(name, children[name]) for name in sorted(children)]

    def _listed(self, rel: str, display: str) -> dict[str, dict[str, Any]]:
        """Name -> info of the children of ``rel`` from one listing (an empty listing must
        come from a directory that exists)."""
        raw = self._list_raw(rel, display)
        if not raw and rel:
            self._require_dir(rel, display)
        return self._children(rel, raw, display)

    def _walk_sync(self, rel: str, display: str, max_depth: int, cancel: threading.Event = _NEVER) -> list[FileEntry]:
        bpath = self._bpath(rel)
        try:
            # No maxdepth: with one, s3fs and gcsfs fall back to one listing per directory;
            # without, the whole tree is one paginated flat listing. Depth is cut below.
            found: dict[str, dict[str, Any]] = self._fs.find(
                bpath, withdirs=True, detail=True, **self._ls_kwargs
            )
        except FileNotFoundError:
            raise self._missing_dir(rel, display) from None
        except Exception as exc:
            raise self._translate(exc, display, "readdir") from exc
        finally:
            if self._object:
                self._fs.invalidate_cache(bpath)
        own = bpath.rstrip("/")
        head = own + "/" if own else ""
        entries: dict[str, FileEntry] = {}
        for key, info in found.items():
            full = key.rstrip("/")
            if full == own:
                # The directory's own marker object ("dir/") is no file in the way.
                marker = key.endswith("/") or str(info.get("name", "")).endswith("/")
                if info.get("type") == "file" and rel and not marker:
                    raise NotDirectory(display)
                continue
            if not full.startswith(head):
                continue
            sub = full[len(head) :]
            if _TMP_MARK in sub or sub.count("/") >= max_depth:
                continue
            if sub in entries and entries[sub].type == "directory":
                continue
            entries[sub] = self._entry(sub, info)
            # Object stores list keys; make sure every implied directory has its entry.
            parent = _paths.dirname(sub)
            while parent and parent not in entries:
                entries[parent] = FileEntry(name=parent, type="directory")
                parent = _paths.dirname(parent)
        if not found and rel:
            self._require_dir(rel, display)
        return order_tree(entries)

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
        self._check_writable("write_file")
        data = as_bytes(content)
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call_write(self._write_sync, rel, path, data, recursive, overwrite, expected_mtime, mime_type)

    def _write_sync(
        self,
        rel: str,
        display: str,
        data: bytes,
        recursive: bool,
        overwrite: bool,
        expected: datetime | FileStat | None,
        mime_type: str | None,
        cancel: threading.Event,
    ) -> None:
        if not rel:
            raise IsDirectory(display)
        extra: dict[str, Any] = {}
        if mime_type and self._object:
            # Object stores keep a content type per object; other backends have nowhere to.
            extra["ContentType" if self.provider == "s3" else "content_type"] = mime_type
        guarded = (
            self.provider == "s3" and isinstance(expected, FileStat) and expected.etag is not None
        )
        if guarded:
            # The ETag the caller saw travels with the PUT (If-Match): one request instead of a
            # HEAD then a PUT, and S3 itself refuses the write if the object changed.
            assert isinstance(expected, FileStat)
            extra["IfMatch"] = f'"{expected.etag}"'
        elif expected is not None:
            guard = self._known.guard(rel, expected)
            info = self._info(rel)
            if info is not None:
                current = self._stat_from_info(rel, info)
                if current.type == "directory":
                    raise IsDirectory(display)
                if not guard.matches(current):
                    raise StaleFileError(display, guard.modified_at, current.modified_at)
                if self._protocol in ("s3", "s3a") and current.etag:
                    # Close the race between our check and the PUT: S3 refuses the write if
                    # the object changed in between.
                    extra["IfMatch"] = f'"{current.etag}"'
        try:
            if self._object:
                self._prepare_object_parent(rel, display, recursive)
            else:
                self._prepare_parent(rel, display, recursive)
            if cancel.is_set():
                raise _Cancelled
            self._commit(rel, display, data, overwrite, cancel, extra)
        except _Cancelled:
            return
        except FilesystemError:
            raise
        except (OSError, FileNotFoundError) as exc:
            if "IfMatch" in extra and (isinstance(exc, FileNotFoundError) or "pre-condition" in str(exc)):
                self._refused_guarded_write(rel, display, data, expected, overwrite, cancel, extra)
                return
            raise self._translate(exc, display, "write_file") from exc
        if self._object:
            self._listings.add(rel, "file")

    def _refused_guarded_write(
        self,
        rel: str,
        display: str,
        data: bytes,
        expected: datetime | FileStat | None,
        overwrite: bool,
        cancel: threading.Event,
        extra: dict[str, Any],
    ) -> None:
        """S3 refused an If-Match PUT: a file that is gone may be written (the contract lets a
        missing file proceed); one that changed is stale, reported with its new time."""
        seen = expected.modified_at if isinstance(expected, FileStat) else expected
        info = self._info(rel)
        if info is None:
            retry = {k: v for k, v in extra.items() if k != "IfMatch"}
            self._commit(rel, display, data, overwrite, cancel, retry)
            self._listings.add(rel, "file")
            return
        if info.get("type") == "directory":
            raise IsDirectory(display)
        raise StaleFileError(display, seen, self._stat_from_info(rel, info).modified_at)

    def _commit(
        self,
        rel: str,
        display: str,
        data: bytes,
        overwrite: bool,
        cancel: threading.Event,
        extra: dict[str, Any],
    ) -> None:
        bpath = self._bpath(rel)
        mode = "overwrite" if overwrite else "create"
        if self._object or self._memory:
            # One PUT (or one dict assignment) replaces the whole object: already atomic.
            if self._memory:
                if bpath in self._fs.pseudo_dirs:
                    raise IsDirectory(display)
                if not overwrite and bpath in self._fs.store:
                    raise FileExists(display)
            try:
                self._fs.pipe_file(bpath, data, mode=mode, **extra)
            except FileExistsError:
                if "IfMatch" in extra:
                    raise
                raise FileExists(display) from None
            return
        self._publish(rel, display, lambda tmp: self._fs.pipe_file(tmp, data), overwrite, cancel)

    def _publish(
        self,
        rel: str,
        display: str,
        stage: Callable[[str], object],
        overwrite: bool,
        cancel: threading.Event,
    ) -> None:
        """Stage new content in a hidden sibling with ``stage(tmp)``, then move it into place
        (backends with real directories but no atomic write; local disk has its own)."""
        bpath = self._bpath(rel)
        tmp = self._tmp_path(bpath)
        try:
            stage(tmp)
            if cancel.is_set():
                raise _Cancelled
            if not overwrite:
                self._link_exclusive(tmp, bpath, display)
            else:
                self._fs.mv(tmp, bpath)
        except BaseException:
            with contextlib.suppress(Exception):
                self._fs.rm_file(tmp)
            raise

    def _link_exclusive(self, tmp: str, bpath: str, display: str) -> None:
        if self._fs.exists(bpath):
            raise FileExists(display)
        self._fs.mv(tmp, bpath)

    @staticmethod
    def _tmp_path(bpath: str) -> str:
        parent, _, name = bpath.rpartition("/")
        return f"{parent}/{staged_name(name)}"

    def _prepare_parent(self, rel: str, display: str, recursive: bool) -> None:
        """Make sure the parent directory exists (real-directory backends)."""
        parent = _paths.dirname(rel)
        if not parent:
            return
        bparent = self._bpath(parent)
        if self._memory and recursive:
            if bparent in self._fs.pseudo_dirs:
                return
            # Walk up with dict lookups: a file anywhere above refuses the write.
            probe = parent
            while probe:
                if self._bpath(probe) in self._fs.store:
                    raise NotDirectory(_display_parent(display))
                probe = _paths.dirname(probe)
        if recursive:
            try:
                self._fs.makedirs(bparent, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise NotDirectory(_display_parent(display)) from None
            return
        info = self._info(parent)
        if info is None:
            raise DirectoryNotFound(_display_parent(display))
        if info.get("type") != "directory":
            raise NotDirectory(_display_parent(display))

    def _prepare_object_parent(self, rel: str, display: str, recursive: bool) -> None:
        """Refuse writes that would put a file where a directory is, or under a file."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        known, names = self._listings.get(parent)
        if not known:
            names = self._load_listing(parent)
        if names is None:
            # Too big to keep: check just our own name (one request).
            info = self._info(rel)
            if info is not None and info.get("type") == "directory":
                raise IsDirectory(display)
            return
        if names.get(name) == "directory":
            raise IsDirectory(display)
        if names or not parent:
            return
        # The parent has no entries: it is missing, an empty marker directory, or a file.
        info = self._info(parent)
        if info is not None and info.get("type") == "directory":
            return
        if info is not None:
            raise NotDirectory(_display_parent(display))
        if not recursive:
            raise DirectoryNotFound(_display_parent(display))
        self._check_ancestors(_paths.dirname(parent), display)

    def _check_ancestors(self, rel: str, display: str) -> None:
        while rel:
            info = self._info(rel)
            if info is not None:
                if info.get("type") != "directory":
                    raise NotDirectory(rel)
                return
            rel = _paths.dirname(rel)

    def _load_listing(self, rel: str) -> dict[str, str] | None:
        started = time.monotonic()
        try:
            raw = self._fs.ls(self._bpath(rel), detail=True, **self._ls_kwargs)
        except (FileNotFoundError, NotADirectoryError):
            raw = []
        finally:
            self._fs.invalidate_cache(self._bpath(rel))
        cost = time.monotonic() - started
        if len(raw) > _LISTING_CACHE_LIMIT:
            return self._keep_listing(rel, None, cost)
        names: dict[str, str] = {}
        own = self._bpath(rel).rstrip("/")
        for info in raw:
            full = info["name"].rstrip("/")
            if full == own or not full:
                continue
            base = posixpath.basename(full)
            if names.get(base) != "directory":
                names[base] = "directory" if info.get("type") == "directory" else "file"
        return self._keep_listing(rel, names, cost)

    def _keep_listing(self, rel: str, names: dict[str, str] | None, cost: float) -> dict[str, str] | None:
        """Keep the names of ``rel`` for write checks; a directory too large to keep (``names``
        None, or more than the limit) is remembered as such (its writes then check their own name)."""
        if names is None or len(names) > _LISTING_CACHE_LIMIT:
            self._listings.put(rel, None, cost)
            return None
        self._listings.put(rel, names, cost)
        return names

    def _keep_parent(self, rel: str) -> None:
        # Object stores drop a prefix with its last key; a marker keeps the directory that
        # the agent saw (deleting a file never deletes its directory on a real disk either).
        parent = _paths.dirname(rel)
        if self._object and parent and not self._listings.has_others(rel):
            self._fs.pipe_file(self._bpath(parent) + "/", b"")

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
        await self._call(self._delete_sync, rel, path, force)

    def _delete_sync(self, rel: str, display: str, force: bool) -> None:
        if self._is_root(rel):
            raise IsDirectory(display)
        # A forced delete of what a fresh listing shows as a file needs no existence check
        # (half the requests when a mount unlinks a directory's files one by one).
        if not (force and self._object and self._listings.kind(rel) == "file"):
            info = self._info(rel)
            if info is None:
                if force:
                    return
                raise FileNotFound(display)
            if info.get("type") == "directory":
                raise IsDirectory(display)
        try:
            self._fs.rm_file(self._bpath(rel))
            self._keep_parent(rel)
        except Exception as exc:
            self._listings.forget(rel)
            raise self._translate(exc, display, "delete_file") from exc
        self._listings.discard(rel)

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        """Create a directory; see :meth:`WorkspaceFilesystem.mkdir`."""
        self._check_writable("mkdir")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call(self._mkdir_sync, rel, path, recursive)

    def _mkdir_sync(self, rel: str, display: str, recursive: bool) -> None:
        if not rel:
            return
        info = self._info(rel)
        if info is not None:
            if info.get("type") == "directory":
                return
            raise FileExists(display)
        parent = _paths.dirname(rel)
        if parent:
            pinfo = self._info(parent)
            if pinfo is not None and pinfo.get("type") != "directory":
                raise NotDirectory(_display_parent(display))
            if pinfo is None:
                if not recursive:
                    raise DirectoryNotFound(_display_parent(display))
                if self._object:
                    self._check_ancestors(_paths.dirname(parent), display)
        try:
            if self._object:
                self._fs.pipe_file(self._bpath(rel) + "/", b"")
            else:
                self._fs.makedirs(self._bpath(rel), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise NotDirectory(_display_parent(display)) from None
        except Exception as exc:
            raise self._translate(exc, display, "mkdir") from exc
        self._listings.add(rel, "directory")

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        """Remove a directory; see :meth:`WorkspaceFilesystem.rmdir`."""
        self._check_writable("rmdir")
        if self.status != "ready":
            await self.ensure_ready()
        rel = self._rel(path)
        await self._call(self._rmdir_sync, rel, path, recursive, force)

    def _check_rmdir(self, rel: str, display: str, force: bool) -> bool:
        """Refuse an rmdir the contract forbids; False when there is nothing to remove."""
        if self._is_root(rel):
            raise PermissionDenied(display or ".", "rmdir (the workspace root cannot be removed)")
        info = self._info(rel)
        if info is None:
            if force:
                return False
            raise DirectoryNotFound(display)
        if info.get("type") != "directory":
            raise NotDirectory(display)
        return True

    def _rmdir_sync(self, rel: str, display: str, recursive: bool, force: bool) -> None:
        if not self._check_rmdir(rel, display, force):
            return
        bpath = self._bpath(rel)
        try:
            if recursive:
                self._fs.rm(bpath, recursive=True)
            else:
                if self._children(rel, self._list_raw(rel, display), display):
                    raise DirectoryNotEmpty(display)
                if self._object:
                    with contextlib.suppress(FileNotFoundError):
                        self._fs.rm_file(bpath + "/")
                else:
                    self._fs.rmdir(bpath)
            self._keep_parent(rel)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._translate(exc, display, "rmdir") from exc
        finally:
            self._listings.forget(rel)
            if self._object:
                self._fs.invalidate_cache(bpath)

    async def copy_file(
        self, src: str, dest: str, *, overwrite: bool = True, recursive: bool = False
    ) -> None:
        """Copy a file (server side where the backend can) or, with ``recursive``, a tree."""
        self._check_writable("copy_file")
        if self.status != "ready":
            await self.ensure_ready()
        src_rel, dest_rel = self._rel(src), self._rel(dest)
        info = await self._call(self._info, src_rel)
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
        await self._call_write(self._copy_sync, src_rel, src, dest_rel, dest, overwrite)

    def _copy_sync(
        self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event
    ) -> None:
        if not dest_rel:
            raise IsDirectory(dest)
        dinfo = self._info(dest_rel)
        if dinfo is not None:
            if dinfo.get("type") == "directory":
                raise IsDirectory(dest)
            if not overwrite:
                raise FileExists(dest)
        try:
            if self._object:
                self._prepare_object_parent(dest_rel, dest, True)
            else:
                self._prepare_parent(dest_rel, dest, True)
            bsrc, bdest = self._bpath(src_rel), self._bpath(dest_rel)
            if self._object or self._memory:
                self._fs.cp_file(bsrc, bdest)
            else:
                self._publish(dest_rel, dest, lambda tmp: self._fs.cp_file(bsrc, tmp), overwrite, cancel)
        except _Cancelled:
            return
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._translate(exc, dest, "copy_file") from exc
        self._listings.add(dest_rel, "file")

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        """Move a file or directory: an atomic rename on local disk and in memory, else copy
        then delete (not atomic: a failure in between leaves both copies, never neither)."""
        self._check_writable("move_file")
        if self.status != "ready":
            await self.ensure_ready()
        src_rel, dest_rel = self._rel(src), self._rel(dest)
        if src_rel == dest_rel:
            # Like rename(2): moving onto itself is a no-op (never copy-then-delete it away).
            if await self._call(self._info, src_rel) is None:
                raise FileNotFound(src)
            if not overwrite:
                raise FileExists(dest)
            return
        if not self.capabilities.atomic_rename:
            await super().move_file(src, dest, overwrite=overwrite)
            return
        await self._call(self._move_sync, src_rel, src, dest_rel, dest, overwrite)

    def _check_move(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> dict[str, Any]:
        """Refuse a move the contract forbids; return the source's info."""
        if self._is_root(src_rel):
            raise PermissionDenied(src or ".", "move_file (the workspace root cannot be moved)")
        info = self._info(src_rel)
        if info is None:
            raise FileNotFound(src)
        if self._is_root(dest_rel):
            raise IsDirectory(dest)
        dinfo = self._info(dest_rel)
        if dinfo is not None:
            if not overwrite:
                raise FileExists(dest)
            if dinfo.get("type") == "directory" and info.get("type") != "directory":
                raise IsDirectory(dest)
        if info.get("type") == "directory" and (dest_rel + "/").startswith(src_rel + "/"):
            raise PermissionDenied(dest, "move_file (cannot move a directory into itself)")
        return info

    def _move_sync(self, src_rel: str, src: str, dest_rel: str, dest: str, overwrite: bool) -> None:
        info = self._check_move(src_rel, src, dest_rel, dest, overwrite)
        try:
            self._prepare_parent(dest_rel, dest, True)
            bsrc, bdest = self._bpath(src_rel), self._bpath(dest_rel)
            self._fs.mv(bsrc, bdest, recursive=info.get("type") == "directory")
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._translate(exc, dest, "move_file") from exc

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
        in concurrent batches, instead of one round trip per directory and file.
        """
        regex = compile_pattern(pattern, case_sensitive=case_sensitive)
        rel = self._rel(path)
        info = await self._call(self._info, rel) if rel else {"type": "directory"}
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
            return await run_sync(match)
        finally:
            regex.cancel()  # an abandoned search stops at its next match call

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
        return await self._call(self._read_range_sync, rel, path, start, end)

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
        return await self._call(self._read_range_into_sync, rel, path, start, buffer)

    def _read_range_into_sync(self, rel: str, display: str, start: int, buffer: memoryview) -> int:
        if self._ranged is not None and rel:
            count = self._ranged.read_into(self._bpath(rel), start, buffer)
            if count is not None:
                return count
        data = self._read_range_fsspec(rel, display, start, start + len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _read_range_sync(self, rel: str, display: str, start: int, end: int) -> bytes:
        if self._ranged is not None and rel:
            data = self._ranged.read(self._bpath(rel), start, end)
            if data is not None:
                return data
        return self._read_range_fsspec(rel, display, start, end)

    def _read_range_fsspec(self, rel: str, display: str, start: int, end: int) -> bytes:
        try:
            return self._read_sync(rel, display, start, end)
        except FilesystemError as exc:
            # Object stores refuse a range that starts past the end (HTTP 416); a file read
            # there has nothing left, as a local file has.
            if type(exc) is not FilesystemError:
                raise
            info = self._info(rel)
            if info is None or info.get("type") != "file" or start < int(info.get("size") or 0):
                raise
            return b""

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

    def _cat_many(self, rels: list[str], max_bytes: int | None = None) -> dict[str, bytes | OSError]:
        if not rels:
            return {}
        if max_bytes is not None:
            return self._cat_many_bounded(rels, max_bytes)
        paths = {self._bpath(r): r for r in rels}
        out: dict[str, bytes | OSError] = {}
        if self._ranged is not None:
            # One GET of each file's URL, several at a time on threads of their own; what that
            # way cannot read (a missing file, an answer it does not take) goes to fsspec.
            with ThreadPoolExecutor(min(_READ_THREADS, len(paths)), thread_name_prefix="agentvfs-read") as pool:
                for bpath, data in zip(paths, pool.map(self._ranged.read_whole, paths), strict=True):
                    if data is not None:
                        out[paths[bpath]] = data
            paths = {bpath: rel for bpath, rel in paths.items() if rel not in out}
            if not paths:
                return out
        # s3fs sizes each object with a HEAD first, to split big ones into parallel ranges;
        # for a batch of files one plain GET each is cheaper.
        extra = {"max_concurrency": 1} if self.provider == "s3" else {}
        got = self._fs.cat(list(paths), on_error="return", **extra)
        if not isinstance(got, dict):
            got = {next(iter(paths)): got}
        out.update({paths[k]: v for k, v in got.items() if k in paths and isinstance(v, bytes)})
        return out

    def _cat_many_bounded(self, rels: list[str], max_bytes: int) -> dict[str, bytes | OSError]:
        """Read each file's first ``max_bytes + 1`` bytes (one ranged GET each on object
        stores): an object larger than the limit, replaced since its listing or not, is known
        without fetching it whole."""

        def one(rel: str) -> bytes | OSError | None:
            bpath = self._bpath(rel)
            data = self._ranged.read(bpath, 0, max_bytes + 1) if self._ranged is not None else None
            if data is None:
                try:
                    data = bytes(self._fs.cat_file(bpath, start=0, end=max_bytes + 1))
                except Exception:
                    # Stores refuse a range of an empty object (HTTP 416); a missing one, a
                    # directory or any other refusal is the caller's "not found".
                    info = self._info(rel)
                    if info is None or info.get("type") == "directory":
                        return None
                    if int(info.get("size") or 0) > max_bytes:
                        return FileTooLarge(self._public_path(rel), max_bytes)
                    try:
                        data = self._read_sync(rel, rel)
                    except OSError:
                        return None
            if len(data) > max_bytes:
                return FileTooLarge(self._public_path(rel), max_bytes)
            return data

        out: dict[str, bytes | OSError] = {}
        with ThreadPoolExecutor(min(_READ_THREADS, len(rels)), thread_name_prefix="agentvfs-read") as pool:
            for rel, got in zip(rels, pool.map(one, rels), strict=True):
                if got is not None:
                    out[rel] = got
        return out

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
