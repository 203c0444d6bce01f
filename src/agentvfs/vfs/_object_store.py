"""The object-store kinds of fsspec storage: S3, GCS, Azure and their kin.

On an object store directories are key prefixes: a directory persists as a zero-byte ``dir/``
marker object, nothing stops a key ``a`` and a prefix ``a/`` from coexisting (so writes check
the names of their directory, kept briefly), a write is one whole-object PUT, whole and ranged
reads go as one GET of a signed URL where the store signs them (``_ranged``), and uploads of
large files stream in parts. :class:`ObjectStoreBackend` is that; :class:`S3Backend` makes
the version guard the PUT's own ``If-Match``, and it and :class:`GcsBackend` keep object
metadata.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import json
import os
import posixpath
import secrets
import socket
import stat as stat_module
import threading
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from fsspec.asyn import sync

from ..errors import (
    BucketNotFound,
    DirectoryNotFound,
    FileExists,
    FilesystemError,
    IsDirectory,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
    StorageAccessError,
    StorageUnreachableError,
)
from . import _paths
from ._backend import Version
from ._base import UploadStream
from ._fsspec_backends import NEVER, READ_THREADS, FsspecBackend, display_parent
from ._posix import PosixAttributes, metadata_for
from ._ranged import SignedRangeReader, signed_range_reader
from ._records import Capabilities, FileStat

__all__ = ["OBJECT_STORES", "GcsBackend", "ObjectStoreBackend", "S3Backend"]

#: Protocols whose directories are only key prefixes (plus optional "dir/" marker objects).
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2"})

_UPLOAD_CHUNK = 160 * 1024 * 1024
# A directory whose listing is larger than this is not cached for write checks; a write
# into it checks its own name instead (one request) rather than re-listing thousands of keys.
_LISTING_CACHE_LIMIT = 2000
# However slow a listing was, its names are not trusted longer than this.
_LISTING_TTL_CAP = 30.0
#: The header prefix of S3 user metadata.
_S3_META = "x-amz-meta-"
#: Seconds a probe waits for the store's endpoint to accept a connection: a store that is
#: down is reported at once, not after the client's retries (16.7 s for s3fs).
PROBE_CONNECT_TIMEOUT = 5.0

_NO_S3_CREDENTIALS = (
    "no credentials were found",
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), give the storage options key and "
    "secret, or anon=true for a public bucket",
)
#: What an S3 error code says of the credentials, and what to change.
_S3_REFUSALS = {
    "InvalidAccessKeyId": (
        "the server does not know the access key ID (InvalidAccessKeyId)",
        "check AWS_ACCESS_KEY_ID, AWS_PROFILE or the storage option key",
    ),
    "SignatureDoesNotMatch": (
        "the secret key does not match the access key ID (SignatureDoesNotMatch)",
        "check AWS_SECRET_ACCESS_KEY or the storage option secret",
    ),
    "ExpiredToken": (
        "the session token has expired (ExpiredToken)",
        "renew the credentials (AWS_SESSION_TOKEN or the storage option token)",
    ),
    "InvalidToken": (
        "the session token is not valid (InvalidToken)",
        "check AWS_SESSION_TOKEN or the storage option token",
    ),
    "AccessDenied": (
        "the credentials may not list it (AccessDenied)",
        "allow s3:ListBucket on the bucket to these credentials, or use credentials that have it",
    ),
    "AllAccessDisabled": ("all access to the bucket is disabled (AllAccessDisabled)", "use another bucket"),
}


class _Listings:
    """Short-lived knowledge of the names in object-store directories, for write checks.

    On an object store nothing stops a key ``a`` and a prefix ``a/`` from coexisting, so a
    write must check that it does not create a file where a directory is (or under a file).
    Doing that with a request per write would double its cost; instead the names of a
    directory are listed once and kept for ``ttl`` seconds, updated by our own writes. Only
    these checks, and a forced delete of a name they show as a file (which then skips its
    existence check: deleting a missing key succeeds anyway), and the stat of a name a
    listing of at most a second ago shows as a directory (which then asks only for its
    marker: a prefix shadows a key of the same name, and a mount stats every directory it
    has just listed) read it: reads, file stats and listings always go to the backend.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        #: Directory -> (kept until, its names or None when too many, when it was listed).
        self._dirs: OrderedDict[str, tuple[float, dict[str, str] | None, float]] = OrderedDict()

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
            now = time.monotonic()
            self._dirs[rel] = (now + min(max(self.ttl, 25 * cost), _LISTING_TTL_CAP), names, now)
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

    def kind(self, rel: str, *, within: float | None = None) -> str | None:
        """``"file"`` or ``"directory"`` when a kept listing of the parent shows ``rel``
        (with ``within``: a listing made at most that many seconds ago)."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        now = time.monotonic()
        with self._lock:
            item = self._dirs.get(parent)
            if item is None or item[0] < now or item[1] is None:
                return None
            if within is not None and now - item[2] > within:
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


class _ObjectUpload:
    """A streamed upload through an fsspec file object (parts go out as they fill)."""

    def __init__(self, owner: ObjectStoreBackend, rel: str, display: str, handle: Any) -> None:
        self._owner = owner
        self._rel = rel
        self._display = display
        self._handle = handle

    async def write(self, data: bytes) -> None:
        try:
            await self._owner._run(self._handle.write, data)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._owner.translate(exc, self._display, "upload") from exc

    async def commit(self) -> None:
        try:
            await self._owner._run(self._handle.close)
        except FilesystemError:
            raise
        except Exception as exc:
            raise self._owner.translate(exc, self._display, "upload") from exc
        self._owner._written(self._rel, "file")

    async def abort(self) -> None:
        with contextlib.suppress(Exception):
            await self._owner._run(self._handle.discard)

    def ticket(self) -> dict[str, str] | None:
        """What names the upload in storage once its first part is out (S3: bucket, key and
        upload id), so that a process that outlives this one can abort it; None before."""
        mpu = getattr(self._handle, "mpu", None)
        upload_id = mpu.get("UploadId") if isinstance(mpu, dict) else None
        if not upload_id:
            return None
        return {"bucket": str(self._handle.bucket), "key": str(self._handle.key), "upload_id": str(upload_id)}


def check_reachable(url: str, endpoint: str | None) -> None:
    """Raise :class:`StorageUnreachableError` if ``endpoint`` (an http(s) URL) accepts no
    TCP connection within :data:`PROBE_CONNECT_TIMEOUT`. Nothing is checked without an
    endpoint or where a proxy would carry the requests (a direct connection proves nothing
    there)."""
    parts = urllib.parse.urlsplit(endpoint or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    host = parts.hostname
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(host):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    shown = f"{parts.scheme}://{parts.netloc}"
    try:
        socket.create_connection((host, port), timeout=PROBE_CONNECT_TIMEOUT).close()
    except TimeoutError:
        raise StorageUnreachableError(
            url, shown, f"no answer within {PROBE_CONNECT_TIMEOUT:g} s", errno.ETIMEDOUT
        ) from None
    except socket.gaierror as exc:
        raise StorageUnreachableError(
            url, shown, f"the host name does not resolve ({exc.strerror})", errno.EHOSTUNREACH
        ) from None
    except OSError as exc:
        cause = (exc.strerror or str(exc)).lower()
        raise StorageUnreachableError(url, shown, cause, exc.errno or errno.ECONNREFUSED) from None


def _s3_refusal(exc: BaseException, url: str) -> FilesystemError | None:
    """The error to raise for an S3 answer that refuses the credentials (or a client that
    found none, or could not connect), else None."""
    for err in (exc, exc.__cause__):
        if err is None:
            continue
        name = type(err).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return StorageAccessError(url, *_NO_S3_CREDENTIALS)
        if name in ("EndpointConnectionError", "ConnectTimeoutError"):
            return StorageUnreachableError(url, str(getattr(err, "kwargs", {}).get("endpoint_url", "S3")), str(err))
        code = (getattr(err, "response", None) or {}).get("Error", {}).get("Code")
        if code in _S3_REFUSALS:
            return StorageAccessError(url, *_S3_REFUSALS[code])
    return None


class ObjectStoreBackend(FsspecBackend):
    """An object store (S3, GCS, Azure...) under ``root``, a ``bucket/prefix`` path.

    Directories are key prefixes: making one writes a zero-byte ``dir/`` marker so that an
    empty directory persists, removing the last entry of a directory keeps it (a marker is
    written), and a non-empty prefix is not removed without ``recursive``. A write is one
    whole-object PUT. Versions are the store's ETag or generation.

    Parameters
    ----------
    listing_ttl : float
        Seconds a directory listing is trusted for write checks (0: never).
    """

    capabilities = Capabilities(empty_dirs=False, atomic_rename=False, symlinks=False, versions=True, blocking=True)

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, *, listing_ttl: float = 2.0) -> None:
        super().__init__(fs, root)
        self._ls_kwargs = {"refresh": True}
        self._listings = _Listings(listing_ttl)
        #: Ranged reads through signed URLs where the store signs them (``_ranged``).
        self.ranged: SignedRangeReader | None = signed_range_reader(fs)

    def _forget_cached(self, bpath: str) -> None:
        self._fs.invalidate_cache(bpath)

    def _written(self, rel: str, kind: str) -> None:
        self._listings.add(rel, kind)

    def _removed(self, rel: str) -> None:
        self._listings.discard(rel)

    def _unsure(self, rel: str) -> None:
        self._listings.forget(rel)

    @property
    def bucket(self) -> str:
        """The bucket (or container) of the root."""
        return self.root_path.strip("/").split("/", 1)[0]

    def probe_sync(self, rel: str = "", display: str = "") -> None:
        """Check that the store answers, takes the credentials and has the bucket (a missing
        bucket otherwise looks like an empty root).

        Raises
        ------
        StorageUnreachableError
            The endpoint accepts no connection within ``PROBE_CONNECT_TIMEOUT`` seconds.
        StorageAccessError
            The store refused the credentials, or none were found.
        BucketNotFound
            The bucket does not exist.
        """
        bucket = self.bucket
        if not bucket:
            return
        url = f"{self.protocol}://{self.root_path}"
        check_reachable(url, self.endpoint_url())
        if not self._bucket_exists(bucket, url):
            raise BucketNotFound(f"{self.protocol}://{bucket}")

    def endpoint_url(self) -> str | None:
        """The store's endpoint as a URL, where the client names one (checked by a probe)."""
        return None

    def _bucket_exists(self, bucket: str, url: str) -> bool:
        try:
            return bool(self._fs.exists(bucket))
        except FileNotFoundError:
            return False
        except Exception:
            return True  # cannot tell (no permission to look at the bucket): let requests decide
        finally:
            self._fs.invalidate_cache(bucket)

    def setup_sync(self) -> None:
        """Nothing to create: a prefix exists once something is below it."""

    # -- reads ----------------------------------------------------------------------------------

    def read_sync(self, rel: str, display: str, start: int | None = None, end: int | None = None) -> bytes:
        if rel and start is None and end is None and self.ranged is not None:
            # One plain GET (s3fs sizes the object with a HEAD before its GET).
            whole = self.ranged.read_whole(self.bpath(rel))
            if whole is not None:
                return whole
        return super().read_sync(rel, display, start, end)

    def read_range_sync(self, rel: str, display: str, start: int, end: int) -> bytes:
        if self.ranged is not None and rel:
            data = self.ranged.read(self.bpath(rel), start, end)
            if data is not None:
                return data
        return super().read_range_sync(rel, display, start, end)

    def read_version_into_sync(self, rel: str, display: str, start: int, buffer: memoryview, version: str) -> int:
        # A GET that only that version answers (If-Match on S3, the generation on GCS);
        # where the URL way cannot read it, fsspec reads what is there.
        if self.ranged is not None and rel:
            try:
                count = self.ranged.read_into(self.bpath(rel), start, buffer, version=version)
            except StaleFileError:
                raise StaleFileError(display, None, None) from None
            if count is not None:
                return count
        return super().read_into_sync(rel, display, start, buffer)

    def read_exact_version_sync(self, rel: str, display: str, start: int, buffer: memoryview, version: str) -> int | None:
        if self.ranged is None or not rel:
            return None
        try:
            return self.ranged.read_into(self.bpath(rel), start, buffer, version=version)
        except StaleFileError:
            raise StaleFileError(display, None, None) from None

    def read_into_sync(self, rel: str, display: str, start: int, buffer: memoryview) -> int:
        # The response lands in the buffer straight from the socket: a reader that reuses its
        # buffers touches no fresh memory per range.
        if self.ranged is not None and rel:
            count = self.ranged.read_into(self.bpath(rel), start, buffer)
            if count is not None:
                return count
        return super().read_into_sync(rel, display, start, buffer)

    def _read_head(self, rel: str, count: int) -> bytes | None:
        return self.ranged.read(self.bpath(rel), 0, count) if self.ranged is not None else None

    def _cat(self, rels: list[str], **extra: Any) -> dict[str, bytes | OSError]:
        out: dict[str, bytes | OSError] = {}
        if self.ranged is not None:
            # One GET of each file's URL, several at a time on threads of their own; what that
            # way cannot read (a missing file, an answer it does not take) goes to fsspec.
            paths = {self.bpath(r): r for r in rels}
            with ThreadPoolExecutor(min(READ_THREADS, len(paths)), thread_name_prefix="agentvfs-read") as pool:
                for bpath, data in zip(paths, pool.map(self.ranged.read_whole, paths), strict=True):
                    if data is not None:
                        out[paths[bpath]] = data
            rels = [r for r in rels if r not in out]
            if not rels:
                return out
        out.update(super()._cat(rels, **extra))
        return out

    # -- listings -------------------------------------------------------------------------------

    def list_stats_sync(self, rel: str, display: str) -> list[FileStat]:
        started = time.monotonic()
        children = self.listed(rel, display)
        # A fresh listing: write checks and forced deletes in this directory (a FUSE mount
        # lists before it deletes) need no request of their own for a while.
        kinds = {n: "directory" if i.get("type") == "directory" else "file" for n, i in children.items()}
        self._keep_listing(rel, kinds, time.monotonic() - started)
        return [
            self.stat_of(_paths.join(rel, name) if rel else name, info)
            for name, info in sorted(children.items())
        ]

    def _load_listing(self, rel: str) -> dict[str, str] | None:
        started = time.monotonic()
        try:
            raw = self._fs.ls(self.bpath(rel), detail=True, **self._ls_kwargs)
        except (FileNotFoundError, NotADirectoryError):
            raw = []
        finally:
            self._fs.invalidate_cache(self.bpath(rel))
        cost = time.monotonic() - started
        if len(raw) > _LISTING_CACHE_LIMIT:
            return self._keep_listing(rel, None, cost)
        names: dict[str, str] = {}
        own = self.bpath(rel).rstrip("/")
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

    # -- writes ---------------------------------------------------------------------------------

    def _write_options(self, mime_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, Any]:
        # Object stores keep a content type per object; other kinds have nowhere to.
        return {"content_type": mime_type} if mime_type else {}

    def prepare_parent(self, rel: str, display: str, recursive: bool) -> None:
        """Refuse writes that would put a file where a directory is, or under a file."""
        parent, name = _paths.dirname(rel), _paths.basename(rel)
        known, names = self._listings.get(parent)
        if not known:
            names = self._load_listing(parent)
        if names is None:
            # Too big to keep: check just our own name (one request).
            info = self.info(rel)
            if info is not None and info.get("type") == "directory":
                raise IsDirectory(display)
            return
        if names.get(name) == "directory":
            raise IsDirectory(display)
        if names or not parent:
            return
        # The parent has no entries: it is missing, an empty marker directory, or a file.
        info = self.info(parent)
        if info is not None and info.get("type") == "directory":
            return
        if info is not None:
            raise NotDirectory(display_parent(display))
        if not recursive:
            raise DirectoryNotFound(display_parent(display))
        self._check_ancestors(_paths.dirname(parent))

    def _check_ancestors(self, rel: str) -> None:
        while rel:
            info = self.info(rel)
            if info is not None:
                if info.get("type") != "directory":
                    raise NotDirectory(rel)
                return
            rel = _paths.dirname(rel)

    def commit(
        self, rel: str, display: str, data: bytes, overwrite: bool, cancel: threading.Event, extra: dict[str, Any]
    ) -> None:
        # One PUT replaces the whole object: already atomic.
        try:
            self._fs.pipe_file(self.bpath(rel), data, mode="overwrite" if overwrite else "create", **extra)
        except FileExistsError:
            if self._conditional(extra):
                raise
            raise FileExists(display) from None

    def put_new_sync(self, rel: str, display: str, data: bytes, cancel: threading.Event = NEVER) -> None:
        """One create-only PUT of ``rel``: no listing or HEAD of its parents (directories
        are key prefixes here, made by the key itself)."""
        if not rel:
            raise IsDirectory(display)
        if cancel.is_set():
            return
        try:
            self.commit(rel, display, data, False, cancel, self._write_options(None, None))
        except FilesystemError:
            raise
        except OSError as exc:
            raise self.translate(exc, display, "write_file") from exc
        self._written(rel, "file")

    def _conditional(self, extra: dict[str, Any]) -> bool:
        """Whether the PUT options make the write conditional on a version."""
        return False

    def _put_local(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event,
        guard: Version | None,
        create: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        self._fs.put_file(local_path, self.bpath(rel), **self._write_options(None, metadata))
        return None

    def open_upload_sync(
        self, rel: str, display: str, part_size: int, metadata: Mapping[str, str] | None = None
    ) -> Any:
        try:
            self.prepare_parent(rel, display, True)
            return self._fs.open(self.bpath(rel), "wb", block_size=part_size, **self._write_options(None, metadata))
        except FilesystemError:
            raise
        except Exception as exc:
            raise self.translate(exc, display, "open_upload") from exc

    async def open_upload(self, path: str, *, part_size: int) -> UploadStream | None:
        """Start a multipart upload of ``path``: invisible until committed (None where the
        store's files cannot drop a half-done upload)."""
        return await self.open_upload_as(path, path, part_size=part_size)

    async def open_upload_as(
        self, rel: str, display: str, *, part_size: int, metadata: Mapping[str, str] | None = None
    ) -> UploadStream | None:
        """:meth:`open_upload` of ``rel``, its errors naming ``display``, the object to carry
        ``metadata``."""
        if not rel:
            raise IsDirectory(display)
        handle = await self._run(self.open_upload_sync, rel, display, part_size, metadata)
        if not callable(getattr(handle, "discard", None)):
            # Without a way to drop a half-done upload, closing would publish it.
            await self._run(handle.close)
            return None
        return _ObjectUpload(self, rel, display, handle)

    def _known_file(self, rel: str) -> bool:
        return self._listings.kind(rel) == "file"

    def _keep_parent(self, rel: str) -> None:
        # Object stores drop a prefix with its last key; a marker keeps the directory that
        # the agent saw (deleting a file never deletes its directory on a real disk either).
        parent = _paths.dirname(rel)
        if parent and not self._listings.has_others(rel):
            # Only where no marker is: one there holds the directory's attributes.
            with contextlib.suppress(FileExistsError):
                self._fs.pipe_file(self.bpath(parent) + "/", b"", mode="create")

    def _make_dir(self, rel: str) -> None:
        self._fs.pipe_file(self.bpath(rel) + "/", b"")

    def _remove_empty_dir(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(self.bpath(rel) + "/")

    def _copy_file(self, src_rel: str, dest_rel: str, dest: str, overwrite: bool, cancel: threading.Event) -> None:
        self._fs.cp_file(self.bpath(src_rel), self.bpath(dest_rel))  # server side

    def copy_marker_sync(self, src_rel: str, dest_rel: str) -> None:
        """Copy the marker object of directory ``src_rel`` (its attributes) to ``dest_rel``'s,
        where it has one."""
        if not src_rel or not dest_rel:
            return
        bucket, src_key, _ = self._fs.split_path(self.bpath(src_rel))
        _, dest_key, _ = self._fs.split_path(self.bpath(dest_rel))
        with contextlib.suppress(FileNotFoundError):
            self._copy_object(bucket, src_key + "/", dest_key + "/")

    def _copy_object(self, bucket: str, src_key: str, dest_key: str) -> None:
        """A server-side copy of one object, its metadata included (keys as given: a
        marker's trailing slash is kept)."""
        self._fs.cp_file(f"{bucket}/{src_key}", f"{bucket}/{dest_key}")

    # -- POSIX attributes as object metadata --------------------------------------------------

    def make_special_sync(self, rel: str, display: str, attrs: PosixAttributes) -> None:
        """Create a symbolic link, FIFO, socket or device node ``rel`` as an object (only
        where nothing is): a link's content is its target, the others are empty; ``mode``
        in the metadata says which (see :mod:`agentvfs.vfs._posix`)."""
        if self.metadata_style is None:
            raise PermissionDenied(display, f"create a special file (the {self.protocol} store keeps none)")
        if not rel:
            raise FileExists(display)
        body = b""
        if attrs.kind == stat_module.S_IFLNK:
            body = (attrs.target or "").encode("utf-8", "surrogateescape")
        metadata = metadata_for(attrs, self.metadata_style)
        try:
            self.prepare_parent(rel, display, False)
            if self.info(rel) is not None:
                raise FileExists(display)
            self._fs.pipe_file(self.bpath(rel), body, mode="create", **self._write_options(None, metadata))
        except FilesystemError:
            raise
        except FileExistsError:
            raise FileExists(display) from None
        except Exception as exc:
            raise self.translate(exc, display, "mknod") from exc
        self._written(rel, "file")

    def set_attributes_sync(self, rel: str, display: str, attrs: PosixAttributes, guard: Version | None) -> str | None:
        """Keep ``attrs`` in the metadata of the object ``rel`` without sending its data
        again, only while it is ``guard``'s version; every metadata key not about POSIX
        attributes stays. Returns the object's version afterwards (None: unknown)."""
        raise PermissionDenied(display, f"set attributes (the {self.protocol} store keeps none)")


#: A directory a listing showed at most this many seconds ago is statted by its marker alone
#: (another client may remove a prefix at any time: the shortcut is for a mount's stat right
#: after it listed the parent).
_LISTED_DIR_AGE = 1.0
#: Pages of a listing read through signed URLs before s3fs is left to list a directory.
_SIGNED_LIST_PAGES = 100


def _parse_list_page(body: bytes, bucket: str) -> tuple[list[dict[str, Any]], str | None] | None:
    """The info records s3fs makes of one ``ListObjectsV2`` page (directories first, as
    s3fs's ``_iterdir`` yields them), and the continuation token; None for anything but a
    well-formed page."""
    import datetime
    import xml.etree.ElementTree as ElementTree

    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    # The namespace as the server spells it (s3rver's differs from S3's): botocore ignores it.
    ns, _, tag = root.tag.rpartition("}")
    if tag != "ListBucketResult":
        return None
    ns = f"{ns}}}" if ns else ""
    encoded = (root.findtext(f"{ns}EncodingType") or "") == "url"

    def text(value: str) -> str:
        # botocore decodes what a listing asked to be URL-encoded the same way.
        return urllib.parse.unquote_plus(value) if encoded else value

    records: list[dict[str, Any]] = []
    try:
        for common in root.iterfind(f"{ns}CommonPrefixes"):
            name = text(common.findtext(f"{ns}Prefix") or "")
            if not name.endswith("/"):
                return None
            records.append({
                "Key": f"{bucket}/{name[:-1]}", "Size": 0, "StorageClass": "DIRECTORY", "type": "directory",
                "size": 0, "name": f"{bucket}/{name[:-1]}",
            })  # fmt: skip
        for item in root.iterfind(f"{ns}Contents"):
            key = text(item.findtext(f"{ns}Key") or "")
            stamp = item.findtext(f"{ns}LastModified") or ""
            modified = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            if modified.tzinfo is None:
                return None
            size = int(item.findtext(f"{ns}Size") or "")
            record: dict[str, Any] = {
                "Key": f"{bucket}/{key}", "LastModified": modified, "Size": size, "type": "file", "size": size,
                "name": f"{bucket}/{key}",
            }  # fmt: skip
            # As botocore: what the answer leaves out is left out (an empty ETag is no version).
            for field in ("ETag", "StorageClass"):
                value = item.findtext(f"{ns}{field}")
                if value:
                    record[field] = value
            records.append(record)
    except ValueError:
        return None
    truncated = (root.findtext(f"{ns}IsTruncated") or "false").strip().lower() == "true"
    token = root.findtext(f"{ns}NextContinuationToken") if truncated else None
    if truncated and not token:
        return None
    return records, token


class S3Backend(ObjectStoreBackend):
    """Amazon S3 and servers that speak its API, through s3fs.

    A guarded write is one conditional PUT (``If-Match``: S3 itself refuses it if the object
    changed), not a HEAD then a PUT; a local file is uploaded as the open file (streamed from
    disk) up to twice the part size, else in parallel parts. Object metadata is the object's
    user metadata (``x-amz-meta-*``): ``stat`` has it, listings do not (S3 lists no metadata).
    """

    capabilities = Capabilities(
        empty_dirs=False, atomic_rename=False, symlinks=False, versions=True, blocking=True, metadata=True,
        digest_etags=True,
    )  # fmt: skip
    _store_checks_versions = True
    metadata_style = "s3"
    #: Set once a signed listing was refused or not understood: s3fs lists from then on.
    _signed_listing_off = False

    def endpoint_url(self) -> str | None:
        fs: Any = self._fs
        return fs.endpoint_url or (fs.client_kwargs or {}).get("endpoint_url")

    def _bucket_exists(self, bucket: str, url: str) -> bool:
        # A listing of the root's prefix (one key at most), not a HEAD: its error has a body
        # that says why (a HEAD's 403 does not tell a bad key from a missing permission).
        prefix = self.root_path.strip("/").partition("/")[2]
        try:
            self._fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1)
        except Exception as exc:
            refused = _s3_refusal(exc, url)
            if refused is not None:
                raise refused from exc
            # NoSuchBucket; any other answer lets the requests decide.
            return not isinstance(exc, FileNotFoundError)
        return True

    def set_attributes_sync(self, rel: str, display: str, attrs: PosixAttributes, guard: Version | None) -> str | None:
        # A copy of the object onto itself with the metadata replaced: the data stays on the
        # server. The copy replaces the whole metadata and content type, so both are read
        # first, and it is conditional on the version read (the HEAD and the copy are two
        # requests: another writer's PUT between them fails the copy, not is overwritten).
        info = self.info(rel)
        if info is None:
            raise StaleFileError(display, guard.modified_at if guard else None, None)
        current = self.stat_of(rel, info)
        if current.type == "directory":
            self._set_directory_attributes(rel, attrs, current.metadata)
            return None
        if guard is not None and not guard.matches(current):
            raise StaleFileError(display, guard.modified_at, current.modified_at)
        bucket, key, _ = self._fs.split_path(self.bpath(rel))
        extra: dict[str, Any] = {"ContentType": info["ContentType"]} if info.get("ContentType") else {}
        if current.etag:
            extra["CopySourceIfMatch"] = f'"{current.etag}"'
        try:
            out = self._s3(
                "copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
                MetadataDirective="REPLACE", Metadata=metadata_for(attrs, "s3", current.metadata), **extra,
            )  # fmt: skip
        except FilesystemError:
            raise
        except Exception as exc:
            if "pre-condition" in str(exc) or "PreconditionFailed" in str(exc) or isinstance(exc, FileNotFoundError):
                raise StaleFileError(display, current.modified_at, None) from exc
            raise self.translate(exc, display, "setattr") from exc
        etag = (out.get("CopyObjectResult") or {}).get("ETag")
        return str(etag).strip('"') if etag else None

    def info(self, rel: str) -> dict[str, Any] | None:
        # The HEAD s3fs sends, read whole: its info record leaves the user metadata out. A
        # missing key is a directory if anything is listed below it (what s3fs asks next).
        bpath = self.bpath(rel)
        bucket, key, _ = self._fs.split_path(bpath)
        if not key:
            return super().info(rel)
        listed_dir = self._listings.kind(rel, within=_LISTED_DIR_AGE) == "directory"
        try:
            if listed_dir:
                # A listing moments ago showed a prefix here, which shadows a key of the same
                # name: only its marker can add to what that listing said.
                raise FileNotFoundError(bpath)
            out = self._head_object(bucket, key)
        except FileNotFoundError:
            try:
                # A directory's marker object holds its attributes (s3fs-fuse's form too).
                marker = self._head_object(bucket, key + "/")
            except FileNotFoundError:
                if listed_dir:
                    return {"name": bpath, "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}
            else:
                return {
                    "name": bpath, "type": "directory", "size": 0, "StorageClass": "DIRECTORY",
                    "LastModified": marker.get("LastModified", ""), "Metadata": marker.get("Metadata") or {},
                }  # fmt: skip
            try:
                below = self._s3("list_objects_v2", Bucket=bucket, Prefix=key + "/", Delimiter="/", MaxKeys=1)
            except FileNotFoundError:
                return None  # no bucket: nothing is there
            if below.get("KeyCount", 0) > 0 or below.get("Contents") or below.get("CommonPrefixes"):
                return {"name": bpath, "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}
            return None
        return {
            "name": bpath,
            "type": "file",
            "size": out["ContentLength"],
            "ETag": out.get("ETag", ""),
            "LastModified": out.get("LastModified", ""),
            "VersionId": out.get("VersionId"),
            "ContentType": out.get("ContentType"),
            "Metadata": out.get("Metadata") or {},
        }

    def read_with_stat_sync(self, rel: str, display: str, version: str) -> tuple[bytes, FileStat] | None:
        """The whole of ``version`` of the file ``rel`` and its stat, from one GET (whose
        answer carries what a HEAD's does); None where this way cannot tell.

        Raises
        ------
        StaleFileError
            The file is at another version now, or gone.
        """
        if self.ranged is None or not rel:
            return None
        try:
            got = self.ranged.read_whole_with_headers(self.bpath(rel), version=version)
        except StaleFileError:
            raise StaleFileError(display, None, None) from None
        if got is None:
            return None
        data, headers = got
        found = self._from_headers(headers)
        if found is None or found["ContentLength"] != len(data):
            return None
        info = {
            "name": self.bpath(rel), "type": "file", "size": len(data), "ETag": found["ETag"],
            "LastModified": found["LastModified"], "VersionId": found["VersionId"],
            "ContentType": found["ContentType"], "Metadata": found["Metadata"],
        }  # fmt: skip
        return data, self.stat_of(rel, info)

    def _head_object(self, bucket: str, key: str) -> dict[str, Any]:
        """The object's HEAD, in the form boto3 gives it: through a signed URL where the
        store signs them (a fifth of the CPU), else through s3fs.

        Raises
        ------
        FileNotFoundError
            No object has that key.
        """
        # A marker's key ends in "/", which s3fs strips from a path it signs.
        if self.ranged is not None and not key.endswith("/"):
            headers = self.ranged.head(f"{bucket}/{key}")
            found = self._from_headers(headers) if headers is not None else None
            if found is not None:
                return found
        out: dict[str, Any] = self._s3("head_object", Bucket=bucket, Key=key)
        return out

    @staticmethod
    def _from_headers(headers: Mapping[str, str]) -> dict[str, Any] | None:
        """boto3's ``head_object`` answer from the response headers; None if they are not an
        S3 server's."""
        try:
            size = int(headers["content-length"])
            modified = email.utils.parsedate_to_datetime(headers["last-modified"])
        except (KeyError, ValueError, TypeError):
            return None  # not the answer of an S3 server: let s3fs read it
        return {
            "ContentLength": size,
            "ETag": headers.get("etag", ""),
            "LastModified": modified,
            "VersionId": headers.get("x-amz-version-id"),
            "ContentType": headers.get("content-type"),
            "Metadata": {
                name[len(_S3_META) :]: value for name, value in headers.items() if name.startswith(_S3_META)
            },
        }

    def abort_upload_sync(self, ticket: Mapping[str, str]) -> bool:
        """Abort the multipart upload ``ticket`` names (see ``ticket()`` of a streamed upload);
        False when storage no longer knows it (completed or aborted before)."""
        try:
            self._s3(
                "abort_multipart_upload", Bucket=ticket["bucket"], Key=ticket["key"], UploadId=ticket["upload_id"]
            )
        except FileNotFoundError:
            return False
        except Exception as exc:
            if "NoSuchUpload" in repr(exc):
                return False
            raise
        return True

    # -- listings through signed URLs -----------------------------------------------------------

    def list_raw(self, rel: str, display: str) -> list[dict[str, Any]]:
        fast = self._list_signed(rel) if self.ranged is not None else None
        return fast if fast is not None else super().list_raw(rel, display)

    def _list_signed(self, rel: str) -> list[dict[str, Any]] | None:
        """The listing s3fs's ``ls`` makes of ``rel`` (the same info records), through
        presigned ``ListObjectsV2`` URLs on the reader's connections and parsed here: s3fs
        spends about 20 ms of CPU on a page of 50 keys (botocore's XML parser and dateutil),
        and a mount lists every directory it enters. None where this way cannot tell (an
        empty listing, which s3fs tells from a missing directory; an answer it does not
        expect; options a presigned URL does not carry): the caller asks s3fs."""
        fs: Any = self._fs
        if self._signed_listing_off or fs.version_aware or fs.req_kw or fs.s3_additional_kwargs:
            return None
        assert self.ranged is not None
        bucket, key, _ = fs.split_path(self.bpath(rel))
        prefix = key.lstrip("/") + "/" if key else ""
        sign_list = self.ranged.sign_list
        if sign_list is None:
            return None
        params = {"list-type": "2", "prefix": prefix, "delimiter": "/", "encoding-type": "url"}
        out: list[dict[str, Any]] = []
        for _page in range(_SIGNED_LIST_PAGES):
            url = sign_list(bucket, params)
            if url is None:
                return None
            answer = self.ranged.get_document(url)
            page = _parse_list_page(answer[1], bucket) if answer is not None and answer[0] == 200 else None
            if page is None:
                if answer is not None and answer[0] != 404:
                    self._signed_listing_off = True  # refused or not understood: not again
                return None
            records, token = page
            out.extend(records)
            if token is None:
                break
            params["continuation-token"] = token
        else:
            return None  # a directory this large: s3fs pages through it
        if not out:
            return None
        out.sort(key=lambda info: info["name"])
        return out

    def _s3(self, method: str, **kwargs: Any) -> Any:
        """One S3 request through s3fs (its retries, its error translation, its options)."""
        return sync(self._fs.loop, self._fs._call_s3, method, self._fs.kwargs, **kwargs)

    def _metadata_of(self, info: dict[str, Any]) -> dict[str, str] | None:
        # None: not known (a listing, which has no metadata), not "none".
        if "Metadata" not in info:
            return None
        return {str(k): str(v) for k, v in (info.get("Metadata") or {}).items()}

    def _write_options(self, mime_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, Any]:
        extra: dict[str, Any] = {"ContentType": mime_type} if mime_type else {}
        if metadata:
            extra["Metadata"] = dict(metadata)
        return extra

    def _guarded(self, rel: str, display: str, guard: Version, extra: dict[str, Any]) -> dict[str, Any]:
        if guard.etag is not None:
            # The ETag the caller saw travels with the PUT: one request instead of two.
            return {**extra, "IfMatch": f'"{guard.etag}"'}
        current = self._check_guard(rel, display, guard)
        if current.etag:
            # Close the race between the check and the PUT.
            return {**extra, "IfMatch": f'"{current.etag}"'}
        return extra

    def _conditional(self, extra: dict[str, Any]) -> bool:
        return "IfMatch" in extra

    def _refused(self, exc: OSError, extra: dict[str, Any]) -> bool:
        return "IfMatch" in extra and (isinstance(exc, FileNotFoundError) or "pre-condition" in str(exc))

    def _cat(self, rels: list[str], **extra: Any) -> dict[str, bytes | OSError]:
        # s3fs sizes each object with a HEAD first, to split big ones into parallel ranges;
        # for a batch of files one plain GET each is cheaper.
        return super()._cat(rels, max_concurrency=1, **extra)

    def _put_local(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event,
        guard: Version | None,
        create: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        # One upload that appears whole when it completes: a single PUT up to twice the chunk
        # size (fastest per file on every server measured), else a multipart upload with
        # parts sent in parallel. A guard or a create is S3's own precondition on the PUT
        # (or on the completion of the multipart upload).
        bpath = self.bpath(rel)
        condition: dict[str, Any] = {"IfNoneMatch": "*"} if create else {}
        if guard is not None:
            condition = self._guarded(rel, display, guard, {})
        extra = {"Metadata": dict(metadata)} if metadata else {}
        if os.path.getsize(local_path) < 2 * _UPLOAD_CHUNK:
            # The open file as the body: streamed from disk, where put_file would first copy
            # it whole into memory (twice as slow here).
            bucket, key, _ = self._fs.split_path(bpath)
            with open(local_path, "rb") as body:
                out = self._fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **condition, **extra)
            etag = out.get("ETag")
            return str(etag).strip('"') if etag else None
        if guard is not None:
            # s3fs completes its multipart uploads with no If-Match: the version is checked
            # just before (a narrow race, where the single PUT has none).
            self._check_guard(rel, display, guard)
        mode = "create" if create else "overwrite"
        self._fs.put_file(local_path, bpath, chunksize=_UPLOAD_CHUNK, max_concurrency=4, mode=mode, **extra)
        return None

    def _copy_object(self, bucket: str, src_key: str, dest_key: str) -> None:
        self._s3("copy_object", Bucket=bucket, Key=dest_key, CopySource={"Bucket": bucket, "Key": src_key})

    def _set_directory_attributes(self, rel: str, attrs: PosixAttributes, seen: Mapping[str, str] | None) -> None:
        # The marker is empty: writing it again with the new metadata loses nothing.
        bucket, key, _ = self._fs.split_path(self.bpath(rel))
        self._s3(
            "put_object", Bucket=bucket, Key=key + "/", Body=b"", Metadata=metadata_for(attrs, "s3", seen)
        )
        self._written(rel, "directory")

    def _refused_upload(self, exc: Exception, guard: Version | None, create: bool) -> bool:
        if guard is None and not create:
            return False
        text = str(exc)
        return "pre-condition" in text or "PreconditionFailed" in text or (guard is not None and isinstance(exc, FileNotFoundError))


#: Largest file a guarded GCS upload sends in one conditional request (read into memory).
_GCS_GUARDED_MAX = 64 * 1024 * 1024


class GcsBackend(ObjectStoreBackend):
    """Google Cloud Storage through gcsfs: versions are generations, object metadata the
    object's custom metadata (in ``stat`` and in listings alike)."""

    capabilities = Capabilities(
        empty_dirs=False, atomic_rename=False, symlinks=False, versions=True, blocking=True, metadata=True
    )
    metadata_style = "gcs"

    def endpoint_url(self) -> str | None:
        location = getattr(self._fs, "_location", None)
        return location if isinstance(location, str) else None

    def _metadata_of(self, info: dict[str, Any]) -> dict[str, str] | None:
        if "metadata" not in info and info.get("type") == "directory":
            return None  # a listed prefix: its marker object's metadata is not known
        return {str(k): str(v) for k, v in (info.get("metadata") or {}).items()}

    def _copy_object(self, bucket: str, src_key: str, dest_key: str) -> None:
        sync(
            self._fs.loop, self._fs._call, "POST", "b/{}/o/{}/rewriteTo/b/{}/o/{}", bucket, src_key, bucket, dest_key,
            json_out=True,
        )  # fmt: skip

    def info(self, rel: str) -> dict[str, Any] | None:
        if rel and self._listings.kind(rel, within=_LISTED_DIR_AGE) == "directory":
            # A listing moments ago showed a prefix here (which shadows a key of the same
            # name): only its marker can add to what that listing said.
            found: dict[str, Any] | None = {"name": self.bpath(rel), "type": "directory", "size": 0}
        else:
            found = super().info(rel)
        if found is not None and found.get("type") == "directory" and rel:
            # The attributes of a directory are its marker object's (gcsfs leaves them out).
            bucket, key, _ = self._fs.split_path(self.bpath(rel))
            try:
                marker = sync(self._fs.loop, self._fs._call, "GET", "b/{}/o/{}", bucket, key + "/", json_out=True)
            except (FileNotFoundError, OSError):
                marker = None
            except Exception:
                marker = None  # no marker (a prefix only), or the store cannot tell
            if isinstance(marker, dict):
                found = {**found, "metadata": marker.get("metadata") or {}}
        return found

    def set_attributes_sync(self, rel: str, display: str, attrs: PosixAttributes, guard: Version | None) -> str | None:
        # A PATCH of the object's metadata (its generation stays; keys it does not name stay
        # too), conditional on the generation seen; a directory's is its marker's.
        bucket, key, _ = self._fs.split_path(self.bpath(rel))
        there = self.info(rel)
        if there is not None and there.get("type") == "directory":
            if "metadata" not in there:
                self._upload_object(bucket, key + "/", b"", metadata_for(attrs, "gcs"))
                self._written(rel, "directory")
                return None
            key += "/"
            guard = None
        condition = {"ifGenerationMatch": guard.etag} if guard is not None and guard.etag and guard.etag.isdigit() else {}
        if guard is not None and not condition:
            self._check_guard(rel, display, guard)
        try:
            out = sync(
                self._fs.loop, self._fs._call, "PATCH", "b/{}/o/{}", bucket, key,
                json={"metadata": metadata_for(attrs, "gcs")}, json_out=True, **condition,
            )  # fmt: skip
        except FilesystemError:
            raise
        except Exception as exc:
            text = f"{exc} {getattr(exc, 'code', '')}"
            if isinstance(exc, FileNotFoundError) or "412" in text or "conditionNotMet" in text:
                raise StaleFileError(display, guard.modified_at if guard else None, None) from exc
            raise self.translate(exc, display, "setattr") from exc
        finally:
            self._fs.invalidate_cache(self.bpath(rel))
        generation = out.get("generation") if isinstance(out, dict) else None
        return str(generation) if generation else None

    def _write_options(self, mime_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, Any]:
        extra = super()._write_options(mime_type, metadata)
        if metadata:
            extra["metadata"] = dict(metadata)
        return extra

    def _put_local(
        self,
        rel: str,
        display: str,
        local_path: str,
        cancel: threading.Event,
        guard: Version | None,
        create: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        # The upload's own precondition: a create only where no generation is
        # (ifGenerationMatch=0, as gcsfs sends it), and a replace of a file up to
        # _GCS_GUARDED_MAX only over the generation seen (checked before as well, by the
        # caller: a server that ignores the precondition still gets that check).
        bpath = self.bpath(rel)
        if create:
            self._fs.put_file(local_path, bpath, mode="create", **self._write_options(None, metadata))
            return None
        if guard is None or guard.etag is None or not guard.etag.isdigit():
            return super()._put_local(rel, display, local_path, cancel, guard, create, metadata)
        if os.path.getsize(local_path) > _GCS_GUARDED_MAX:
            return super()._put_local(rel, display, local_path, cancel, guard, create, metadata)
        bucket, key, _ = self._fs.split_path(bpath)
        with open(local_path, "rb") as f:
            data = f.read()
        out = self._upload_object(bucket, key, data, metadata, ifGenerationMatch=guard.etag)
        generation = out.get("generation") if isinstance(out, dict) else None
        return str(generation) if generation else None

    def _upload_object(
        self, bucket: str, key: str, data: bytes, metadata: Mapping[str, str] | None, **condition: str
    ) -> Any:
        """One upload request of a whole object: the data alone, or (with ``metadata``) a
        multipart body of the object resource and the data, as GCS's JSON API takes it."""
        url = f"{self._fs._location}/upload/storage/v1/b/{bucket}/o"
        if not metadata:
            return sync(
                self._fs.loop, self._fs._call, "POST", url, uploadType="media", name=key, data=data,
                headers={"Content-Type": "application/octet-stream"}, json_out=True, **condition,
            )  # fmt: skip
        boundary = "agentvfs" + secrets.token_hex(12)
        resource = json.dumps({"name": key, "metadata": dict(metadata)}).encode()
        body = b"".join((
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(), resource,
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(), data,
            f"\r\n--{boundary}--\r\n".encode(),
        ))  # fmt: skip
        return sync(
            self._fs.loop, self._fs._call, "POST", url, uploadType="multipart", data=body,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'}, json_out=True, **condition,
        )  # fmt: skip

    def _refused_upload(self, exc: Exception, guard: Version | None, create: bool) -> bool:
        if guard is None and not create:
            return False
        text = f"{exc} {getattr(exc, 'code', '')}"
        return "412" in text or "conditionNotMet" in text or "Precondition" in text
