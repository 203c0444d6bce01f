"""The FUSE operations: a :class:`WorkspaceFilesystem` served to the kernel through pyfuse3.

Everything here runs on the mount's trio thread. Storage calls are awaited (the filesystem
sends its blocking work to worker threads), so a slow bucket never stalls other requests;
staged copies live on local disk and are read and written in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import stat as stat_module
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

from .. import errors as _errors
from ..errors import MountError, StaleFileError
from ..vfs import (
    FileStat,
    PosixAttributes,
    SupportsContentCache,
    SupportsLocalAttributes,
    SupportsLocalFiles,
    SupportsUploadRecovery,
    Version,
    WorkspaceFilesystem,
    attribute_storage,
    check_version,
    download_file,
    foreign_metadata,
    list_stats,
    make_hard_link,
    make_special,
    normalize_path,
    publish_file,
    read_range,
    rewrite_file,
    set_attributes,
    upload_file,
)
from . import _helper
from ._inodes import InodeTable, ns
from ._nodes import Node, now_ns
from ._options import MountOptions
from ._readahead import ReadAhead, ReadState
from ._recovery import RecoveredFile, RecoveryArea, Session, default_state_dir, recover_sessions
from ._staging import StagingStore
from ._uploads import Uploads

__all__ = ["MountOperations", "notify_kernel"]

_log = logging.getLogger("agentvfs.mounts")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_S_IFDIR = stat_module.S_IFDIR
_S_IFREG = stat_module.S_IFREG
_S_IFLNK = stat_module.S_IFLNK
_NAME_MAX = 255
_PATH_MAX = 4096
_BLKSIZE = 1024 * 1024
#: Concurrent ``stat`` requests for the metadata of files a listing did not carry it for.
_METADATA_HEADS = 32
#: With a content cache: a file up to this size is fetched whole into the cache when it is
#: opened (the next files of its directory too, in the background), a larger one as it is read.
_CACHE_WHOLE_BYTES = 8 * 1024 * 1024
#: Files of a directory fetched ahead into the cache when one of them is opened uncached.
_PREFETCH_FILES = 32


def _use_cache(fs: WorkspaceFilesystem, options: MountOptions) -> SupportsContentCache | None:
    """The filesystem, with its content cache on, where ``-o cache``/``cache_dir`` ask for one
    and it can keep one (remote storage); None otherwise."""
    if not (options.cache or options.cache_dir) or not isinstance(fs, SupportsContentCache):
        return None
    if fs.cache is None:
        fs.use_cache(options.cache_dir or True, cache_bytes=options.cache_bytes, metadata_ttl=options.metadata_ttl)
    return fs if fs.cache is not None else None


def _fuse_errors(fn: F) -> F:
    """Turn every failure into ``FUSEError``: pyfuse3 accepts nothing else from a handler.

    Storage errors carry their errno (the error tree is made of ``OSError`` subclasses);
    anything unexpected is logged with its traceback and reported as ``EIO``.
    """

    @functools.wraps(fn)
    async def wrapper(self: MountOperations, *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except _errors.DirectoryNotEmpty:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY) from None
        except OSError as exc:
            code = exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else errno.EIO
            if code == errno.EIO:
                _log.error("%s failed: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(code) from None
        except TimeoutError:
            _log.error("%s timed out", fn.__name__)
            raise pyfuse3.FUSEError(errno.ETIMEDOUT) from None
        except ExceptionGroup as group:
            # Concurrent fetches (a read of several windows) fail together: the first
            # storage error says what happened.
            found = group.subgroup(lambda exc: isinstance(exc, OSError) and isinstance(exc.errno, int))
            first = found.exceptions[0] if found is not None else None
            while isinstance(first, ExceptionGroup):
                first = first.exceptions[0]
            if not isinstance(first, OSError) or not isinstance(first.errno, int) or first.errno <= 0:
                _log.exception("%s failed", fn.__name__)
                raise pyfuse3.FUSEError(errno.EIO) from None
            if first.errno == errno.EIO:
                _log.error("%s failed: %s", fn.__name__, first)
            raise pyfuse3.FUSEError(first.errno) from None
        except Exception:
            _log.exception("%s failed", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def notify_kernel(parent: int | None, name: str | None, ino: int | None) -> None:
    """Make the kernel forget the entry ``name`` of directory ``parent`` and the cached
    attributes and pages of inode ``ino`` (either may be None). Blocking: never call it on the
    FUSE thread."""
    with contextlib.suppress(OSError):  # the kernel no longer knows it: nothing to forget
        if parent is not None and name is not None:
            pyfuse3.invalidate_entry(parent, os.fsencode(name))
        if ino is not None:
            pyfuse3.invalidate_inode(ino, attr_only=False)


def _on_local_disk(filesystem: WorkspaceFilesystem) -> bool:
    return isinstance(filesystem, SupportsLocalFiles)


def _has_stage(node: Node) -> bool:
    return node.stage is not None


def _is_dirty(node: Node) -> bool:
    return node.dirty


def _seconds(st: FileStat) -> int:
    """When storage last changed what ``st`` describes, in whole seconds (S3 lists it to the
    millisecond and a HEAD gives it to the second)."""
    return int(st.modified_at.timestamp())


def _ino(node: Node) -> int:
    return node.ino


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


def _known_version(etag: str | None) -> bool:
    """A version tag the mount can publish over (not unknown, not a marker of its own)."""
    return bool(etag) and not str(etag).startswith("\0")


def storage_url(filesystem: WorkspaceFilesystem) -> str:
    """The storage a filesystem is, as a URL (``s3://bucket/prefix``, ``local:///dir``): what
    its mounts' journals and recovered files are filed under."""
    where = filesystem.location
    return f"{filesystem.provider}://{where}" if where else f"{filesystem.provider}:{filesystem.id}"


def _process_of(tid: int) -> int:
    """The process (thread group) of thread ``tid``; 0 once it is gone."""
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _Handle:
    """An open file: its node, its access mode and its read-ahead state."""

    __slots__ = (
        "append", "fd", "fd_state", "node", "opener", "opener_process", "passthrough", "path", "reading", "served",
        "writable",
    )  # fmt: skip

    def __init__(self, node: Node, *, writable: bool, append: bool, opener: int = 0) -> None:
        self.node = node
        self.writable = writable
        self.append = append
        #: The thread that opened the file (0: unknown), and its process once asked for.
        self.opener = opener
        self.opener_process = 0
        self.reading = ReadState()
        self.path = ""
        #: A descriptor of the file itself where storage is local disk (read directly), and
        #: the node's (write_seq, version) it was opened at.
        self.fd = -1
        self.fd_state = (0, 0)
        #: Served by the kernel from the node's backing file (FUSE passthrough).
        self.passthrough = False
        #: Reads answered from ``fd`` by the passthrough library, not by :meth:`read`.
        self.served = False


class MountOperations(pyfuse3.Operations):
    """pyfuse3 operations over a workspace filesystem; see ``docs/mount-semantics.md``."""

    supports_dot_lookup = False

    def __init__(
        self,
        filesystem: WorkspaceFilesystem,
        options: MountOptions,
        *,
        read_only: bool,
        mountpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.fs = filesystem
        #: ``fs`` where it keeps its files on local disk (``SupportsLocalFiles``), asked once:
        #: a runtime protocol check costs more than the rest of an open.
        self._local: SupportsLocalFiles | None = filesystem if isinstance(filesystem, SupportsLocalFiles) else None
        self.options = options
        self.read_only = read_only
        #: Where storage keeps modes, owners, times and special files: ``native`` (local
        #: disk), ``metadata`` (object metadata, unless ``-o metadata=off``), or None (the
        #: mount keeps them for its own life).
        store = attribute_storage(filesystem)
        self.attr_store = store if store == "native" or options.metadata else None
        self.enable_writeback_cache = options.writeback_cache and not read_only
        self._ttl = options.metadata_ttl
        #: Files of remote storage are read from a persistent local cache (``-o cache``).
        had_cache = isinstance(filesystem, SupportsContentCache) and filesystem.cache is not None
        self.cached = _use_cache(filesystem, options)
        #: The cache was turned on for this mount: it is turned off when the mount ends, so
        #: the caller's filesystem object is left as it was given.
        self.owns_cache = self.cached is not None and not had_cache
        self._next_fh = 1
        self.table = InodeTable(options)
        self.root = self.table.root
        self.started_ns = self.table.started_ns
        self.inodes = self.table.inodes
        self.path_of = self.table.path_of
        self.handles: dict[int, _Handle] = {}
        self.dir_handles: dict[int, list[tuple[str, Node]]] = {}
        #: The journal of staged copies (None: a read-only mount, or operations served
        #: without a mount point, which journal nothing), and where unpublished files go.
        self.session: Session | None = None
        self.recovery: RecoveryArea | None = None
        #: Files a mount of this storage that ended without publishing them left, found
        #: when this one started (now in the recovery area), and the multipart uploads it
        #: left open (aborted once the storage answers).
        self.recovered: list[RecoveredFile] = []
        self.pending_aborts: list[dict[str, Any]] = []
        #: Files this mount put into the recovery area.
        self.kept: list[RecoveredFile] = []
        #: Set when a writer closes while an unmount waits for the writers (``drain``).
        self._writer_closed: trio.Event | None = None
        if mountpoint is not None and not read_only:
            url = storage_url(filesystem)
            root = options.state_dir or default_state_dir()
            try:
                self.session = Session(root, url, mountpoint)
            except OSError as exc:
                if options.state_dir or os.environ.get("AGENTVFS_STATE_DIR"):
                    # Asked for: a mount without it would keep nothing there.
                    raise MountError(
                        f"Cannot use the state directory {root} ({exc.strerror}); give mount option "
                        "state_dir (or AGENTVFS_STATE_DIR) a directory this user can write"
                    ) from exc
                # The default place cannot be written (a read-only home in a container): the
                # temporary directory still survives the mount's process.
                fallback = os.path.join(tempfile.gettempdir(), f"agentvfs-state-{os.getuid()}")
                _log.warning("state directory %s unusable (%s); using %s", root, exc.strerror, fallback)
                root = fallback
                self.session = Session(root, url, mountpoint)
            self.recovered, self.pending_aborts = recover_sessions(root, url, mountpoint, skip=self.session.path)
            self.recovery = RecoveryArea(root, url, mountpoint)
        self.staging = StagingStore(filesystem, options, self._safe_path, self.session)
        #: Where staged copies live (a ``/proc/self/fd`` path when held by descriptor).
        self.staging_dir = self.staging.path
        #: The same place as a plain path, for messages.
        self.staging_shown = self.staging.shown_path
        self.nursery: trio.Nursery | None = None
        self.readahead = ReadAhead(filesystem, options, lambda: self.nursery)
        self.uploads = Uploads(
            filesystem, options, lambda: self.nursery, self.path_of, self._safe_path, self.staging.mark_upload,
            attributes=self._attributes if self.attr_store == "metadata" else None,
        )  # fmt: skip
        self.thread_id: int | None = None
        self.failed_uploads: dict[str, str] = {}
        self.atomic_rename = filesystem.capabilities.atomic_rename
        #: FUSE passthrough, asked for at mount time where files are on local disk (or, on
        #: a read-only mount, in the content cache); used once the kernel has granted it
        #: (see ``passthrough_granted``).
        helper = _helper.HELPER
        self.passthrough = (
            helper
            if helper is not None
            and _helper.passthrough_unavailable_reason() is None
            and options.passthrough
            and not self.enable_writeback_cache
            and (_on_local_disk(filesystem) or (read_only and self.cached is not None))
            else None
        )
        self._passthrough_on = False
        self._backing_lib = self.passthrough

    @property
    def read_cache_used(self) -> int:
        """Bytes the read-ahead of all open files holds."""
        return self.readahead.used

    # -- helpers: paths, nodes, attributes -----------------------------------------------

    def attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        if node.pt_writers:
            self._sync_backing(node)  # written by the kernel, unseen here
        if node.times_stale and self.attr_store == "native":
            self._disk_times(node)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = node.ino
        entry.generation = 0
        entry.entry_timeout = self._ttl
        entry.attr_timeout = self._ttl
        entry.st_mode = node.kind | node.perm
        entry.st_nlink = node.nlink
        entry.st_uid = node.uid
        entry.st_gid = node.gid
        entry.st_rdev = node.rdev
        entry.st_size = node.size
        entry.st_blksize = _BLKSIZE
        entry.st_blocks = (node.size + 511) // 512
        entry.st_atime_ns = node.atime
        entry.st_mtime_ns = node.mtime
        entry.st_ctime_ns = node.ctime
        return entry

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        """Attributes for a reply that hands the kernel a reference (lookup, create...)."""
        node.lookups += 1
        self.inodes[node.ino] = node
        return self.attrs(node)

    @staticmethod
    def _name(raw: bytes) -> str:
        if len(raw) > _NAME_MAX:
            raise _fail(errno.ENAMETOOLONG)
        if raw in (b".", b"..") or b"/" in raw or not raw:
            raise _fail(errno.EINVAL)
        return os.fsdecode(raw)

    def _check_writable(self) -> None:
        if self.read_only:
            raise _fail(errno.EROFS)

    def _owner(self, parent: Node, ctx: pyfuse3.RequestContext) -> tuple[int, int]:
        # BSD and Linux directories with the set-group-ID bit pass their group on.
        gid = parent.gid if parent.perm & stat_module.S_ISGID else ctx.gid
        return ctx.uid, gid

    # -- listings --------------------------------------------------------------------------

    async def _children(self, directory: Node) -> dict[str, Node]:
        """Entries of a directory, from one storage listing at most every ``metadata_ttl``."""
        if not directory.is_dir:
            raise _fail(errno.ENOTDIR)
        children = directory.children
        assert children is not None
        if not directory.stored:
            return children
        if time.monotonic() - directory.listed_at < self._ttl:
            return children
        async with directory.lock:
            if time.monotonic() - directory.listed_at < self._ttl:
                return directory.children or {}
            started = read_at = time.monotonic()
            try:
                stats = await list_stats(self.fs, self.path_of(directory))
            except FileNotFoundError:
                # Gone from storage: what is left here is what the mount itself holds.
                stats = []
            listed = {st.name for st in stats}
            for name, node in (directory.children or {}).items():
                if name not in listed and node.stored and not node.dirty:
                    # Absent from the listing: make sure before forgetting it (listings may
                    # hide names, such as the backend's own staging names, or lag behind).
                    try:
                        stats.append(await self.fs.stat(self.table.child_path(directory, name)))
                    except (FileNotFoundError, NotADirectoryError):
                        continue
            if self.attr_store == "metadata":
                # The HEADs that follow add metadata to what the listing saw: the time they
                # take (a second per few hundred new files) is not taken from the TTL.
                heads = time.monotonic()
                stats = await self._with_metadata(directory, stats)
                started += time.monotonic() - heads
            self._reconcile(directory, stats, read_at)
            directory.listed_at = started
        return directory.children or {}

    async def _with_metadata(self, directory: Node, stats: list[FileStat]) -> list[FileStat]:
        """Listings of some stores (S3) carry no object metadata, where modes, owners, times
        and special files are kept: one ``stat`` (a HEAD) of each file that is new to the
        mount or changed since it looked, and of each directory new to it (its marker),
        ``_METADATA_HEADS`` at a time."""
        old: dict[str, Node] = directory.children or {}
        wanted = []
        for index, st in enumerate(stats):
            if st.metadata is not None:
                continue
            node = old.get(st.name)
            if st.type == "directory" and node is not None and node.is_dir:
                continue  # a directory's attributes change only through a mount
            if node is not None and node.stored and node.etag is not None and node.etag == st.etag and (
                node.stamp == _seconds(st)
            ):  # fmt: skip
                continue  # the version the mount has the attributes of
            wanted.append(index)
        if not wanted:
            return stats
        out = list(stats)
        limit = trio.CapacityLimiter(_METADATA_HEADS)

        async def one(index: int) -> None:
            async with limit:
                try:
                    out[index] = await self.fs.stat(self.table.child_path(directory, stats[index].name))
                except Exception as exc:
                    # Gone or unreadable since the listing: the listing's record stands.
                    _log.debug("metadata of %s not read: %s", stats[index].path, exc)

        async with trio.open_nursery() as nursery:
            for index in wanted:
                nursery.start_soon(one, index)
        return out

    def _reconcile(self, directory: Node, stats: list[FileStat], read_at: float) -> None:
        """Make ``directory``'s entries what storage listed (``stats``, read from
        ``read_at``), but for what the mount knows to be newer.

        A listing shows storage as it was when it was read. A file the mount published, or
        whose attributes it set, since then (its ``checked_at`` is later) keeps what the
        mount has: applied, the listing would show it as it was before the mount wrote it
        (its old size: reads cut short) until the next listing, or drop a file whose first
        publish landed after it was read. (Names do not change meanwhile: making, removing
        and renaming them looks the directory up first, under its lock; publishes and
        attribute changes do not.)
        """
        old: dict[str, Node] = directory.children or {}
        fresh: dict[str, Node] = {}
        for st in stats:
            name = st.name
            node = old.get(name)
            kind = self.table.kind_of(st)
            if node is not None and (not node.stored or node.dirty or node.checked_at >= read_at):
                fresh[name] = node  # the mount holds newer state than the listing
            elif (
                node is not None and st.metadata is None and self.attr_store == "metadata"
                and node.etag is not None and node.etag == st.etag
            ):  # fmt: skip
                # A listing without metadata (S3) of the version the mount knows: its kind,
                # mode and owner are the node's (a symlink's listing reads as a plain file).
                fresh[name] = node
            elif node is not None and node.kind == kind and kind == _S_IFDIR:
                fresh[name] = node
            elif node is not None and node.kind == kind and kind == _S_IFREG:
                fresh[name] = self._refresh_file(node, st)
            elif node is not None and node.kind == kind and (st.etag in (None, node.etag) or node.etag is None):
                # A symbolic link or FIFO, unchanged (or made through this mount, which did
                # not know its version yet: now it does).
                node.etag = node.etag or st.etag
                fresh[name] = node
                self._take_attributes(node, st)
            else:
                if node is not None:
                    # Something else is there now: the kernel's entry goes with the old node.
                    self.table.drop_link(node, directory, name)
                    self._invalidate_later(directory.ino, name, node.ino)
                fresh[name] = self.table.from_stat(st, directory, name)
        for st in stats:
            if st.metadata is not None and st.name in fresh:
                fresh[st.name].stamp = _seconds(st)
        for name, node in old.items():
            if name in fresh:
                continue
            if node.stored and not node.dirty and node.checked_at < read_at:
                # Deleted in storage by someone else.
                self.table.drop_link(node, directory, name)
                self._invalidate_later(directory.ino, name, node.ino)
            else:
                fresh[name] = node
        directory.children = fresh

    def _refresh_file(self, node: Node, st: FileStat) -> Node:
        """Compare a clean file with what storage holds now; returns the node that holds the
        name afterwards.

        A file replaced in storage gets a new inode: with the writeback cache the kernel
        trusts its own size and times of an inode it knows, so only a new inode makes it
        take the new ones (the old inode lives on for descriptors already open).
        """
        node.checked_at = time.monotonic()
        if self.attr_store == "native":
            self.table.note_links(node, st)
        if node.dirty or node.writers:
            return node
        if node.etag is None and st.size == node.size:
            node.etag = st.etag  # our own upload, now with the version storage gave it
            return node
        if st.etag == node.etag and st.size == node.size:
            self._take_attributes(node, st)  # a chmod elsewhere keeps the version (S3)
            return node
        if len(node.links) != 1:
            node.etag, node.size = st.etag, st.size
            node.mtime = node.ctime = ns(st.modified_at)
            node.version += 1
            self._invalidate_later(None, None, node.ino)
            return node
        parent, name = node.links[0]
        fresh = self.table.from_stat(st, parent, name)
        # What storage does not keep, the mount does (for the life of the mount).
        if st.mode is None:
            fresh.perm = node.perm
        if st.uid is None:
            fresh.uid, fresh.gid = node.uid, node.gid
        assert parent.children is not None
        parent.children[name] = fresh
        self.table.drop_link(node, parent, name)
        self._invalidate_later(parent.ino, name, None)
        return fresh

    def _take_attributes(self, node: Node, st: FileStat) -> None:
        """A clean file's mode, owner and times as storage keeps them now (where it keeps
        them and the mount reads them)."""
        if self.attr_store is None or st.mode is None or node.dirty or node.writers:
            return
        if self.attr_store == "metadata" and st.metadata is None:
            return
        changed = (st.mode, st.uid, st.gid) != (node.perm, node.uid, node.gid)
        node.perm = st.mode
        node.uid = node.uid if st.uid is None else st.uid
        node.gid = node.gid if st.gid is None else st.gid
        if st.mtime_ns is not None and st.mtime_ns != node.mtime:
            node.mtime = st.mtime_ns
            changed = True
        if st.metadata:
            node.keep = foreign_metadata(st.metadata) or None
        if changed:
            self._invalidate_later(None, None, node.ino)

    def _invalidate_later(self, parent: int | None, name: str | None, ino: int | None) -> None:
        """Tell the kernel to forget a name or a file's cached pages, off this thread: the
        notification can block while the kernel waits on requests this thread serves."""
        if self.nursery is None:
            return

        async def run() -> None:
            await trio.to_thread.run_sync(notify_kernel, parent, name, ino)

        self.nursery.start_soon(run)

    # -- staging ----------------------------------------------------------------------------

    def _safe_path(self, node: Node) -> str:
        try:
            return "/" + self.path_of(node)
        except pyfuse3.FUSEError:
            return f"<unlinked inode {node.ino}>"

    async def _materialize(self, node: Node, *, truncate_to: int | None = None) -> None:
        """Give a file a staged local copy holding its content (or its first
        ``truncate_to`` bytes), so it can be written anywhere."""
        if node.stage is not None:
            return
        async with node.lock:
            if _has_stage(node):
                return  # staged by a concurrent request while this one waited
            fd, path = self.staging.new_file()
            # Publishing may link this very file into place (local disk): give it the file's
            # permission bits rather than 0600.
            os.fchmod(fd, node.perm & 0o777)
            try:
                keep = node.size if truncate_to is None else min(truncate_to, node.size)
                if node.stored and not _known_version(node.etag):
                    # The version the written file will be published over: asked before the
                    # content is read, so it is never newer than what the writes start from.
                    with contextlib.suppress(FileNotFoundError):
                        node.etag = (await self.fs.stat(self.path_of(node))).etag
                if node.stored and keep > 0:
                    self.staging.reserve(node, node.size)
                    await download_file(self.fs, self.path_of(node), path)
                    if keep < node.size:
                        os.ftruncate(fd, keep)  # the descriptor: the name may not be ours now
                    got = os.fstat(fd).st_size
                    node.size = got
                else:
                    os.ftruncate(fd, 0)
                    node.size = 0 if node.stored or truncate_to is not None else node.size
            except BaseException:
                os.close(fd)
                os.unlink(path)
                self.staging.release_bytes(node)
                raise
            node.stage, node.stage_fd = path, fd
            self.staging.release_bytes(node)
            self.staging.reserve(node, node.size)

    async def _own_stage(self, node: Node, *, truncate_to: int | None = None) -> None:
        """Before changing ``node``'s staged copy: make it hold the file's content (see
        :meth:`_materialize`) and be this change's own to write.

        A request holding the node's lock reads the copy as it is: a publish links it into
        storage (local disk) or uploads it, a rename publishes it, ``keep`` moves it to the
        recovery area. On local disk that request is often the last close's publish, which
        the kernel sends after ``close(2)`` returned, so the writer's next ``open`` or
        ``write`` comes in during it: changed now, the copy would change under the publish
        (storage would get a mix of the two versions, or the file in storage changed in
        place, which then no longer matches the version the publish recorded). So the
        change waits for it, then starts from a copy of its own if the one it had is in
        storage now (``StagingStore.own``). No ``await`` follows before the caller writes:
        no other request can take the lock in between.
        """
        await self._materialize(node, truncate_to=truncate_to)
        while node.lock.locked():
            async with node.lock:
                pass
            # Kept or dropped meanwhile: staged again from what storage holds now.
            await self._materialize(node, truncate_to=truncate_to)
        self.staging.own(node)

    @staticmethod
    @contextlib.asynccontextmanager
    async def _names_of(*nodes: Node | None) -> AsyncIterator[None]:
        """Hold the locks of the files among ``nodes`` (in inode order, so that two holders
        never wait for each other) while their names change in storage.

        A publish takes the names of its file when it starts and holds the lock to its end.
        An unlink or a rename that changed names in storage while one ran would have it
        publish under the names as they were: put the file back where the change took it
        away (over the file renamed there), take the change for another writer's (an error,
        its data in the recovery area), or lose its staged copy when the change drops it.
        The kernel holds the file's inode lock through an unlink or rename, so no write or
        truncate of it comes in meanwhile; its last close's publish does (the release, sent
        after close(2) returned). Held, the change waits for a publish in flight, and one
        that starts meanwhile waits and sees the names as they are after it.
        """
        files = sorted({id(node): node for node in nodes if node is not None and node.is_file}.values(), key=_ino)
        async with contextlib.AsyncExitStack() as held:
            for node in files:
                await held.enter_async_context(node.lock)
            yield

    def _dirty(self, node: Node, *, written: bool) -> None:
        """``node``'s staged copy changed: it holds what storage does not (journaled)."""
        if not node.dirty:
            self.staging.mark_dirty(node, self._safe_path(node).lstrip("/"), node.etag if node.stored else None)
        node.dirty = True
        node.written = node.written or written
        node.write_seq += 1

    def _disk_times(self, node: Node) -> None:
        """A changed node's times as the disk has them (what the next mount shows), unless
        the mount holds data the disk does not have yet (a staged write: its times are the
        mount's until the publish)."""
        node.times_stale = False
        fs = self.fs
        if not isinstance(fs, SupportsLocalAttributes) or not node.stored or node.dirty:
            return
        try:
            st = fs.local_lstat(self.path_of(node))
        except (OSError, pyfuse3.FUSEError):
            return
        if stat_module.S_IFMT(st.st_mode) != node.kind:
            return  # replaced on disk meanwhile: a listing shows what is there now
        node.atime, node.mtime, node.ctime = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns

    def _attributes(self, node: Node) -> PosixAttributes:
        """What storage keeps of ``node`` beyond its data."""
        return PosixAttributes(
            mode=node.kind | node.perm, uid=node.uid, gid=node.gid, atime_ns=node.atime, mtime_ns=node.mtime,
            ctime_ns=node.ctime, target=None if node.target is None else os.fsdecode(node.target), rdev=node.rdev,
        )  # fmt: skip

    def _kept_in_metadata(self, node: Node) -> bool:
        """Whether storage holds ``node`` with its attributes now: a stored file, special file
        or directory (its marker object) with no unpublished data (a publish carries its
        attributes)."""
        return node.stored and not node.dirty and bool(node.links)

    def _store_attributes(
        self,
        node: Node,
        mode: int | None,
        owner: tuple[int, int] | None,
        times_ns: tuple[int, int] | None,
        path: str | None = None,
    ) -> None:
        """Set mode bits, owner or times of ``node`` (at ``path``, by default its first name)
        in storage where storage keeps them (local disk); elsewhere the mount keeps them."""
        fs = self.fs
        if (mode is None and owner is None and times_ns is None) or not isinstance(fs, SupportsLocalAttributes):
            return
        if not node.stored or (node is not self.root and not node.links):
            return  # nothing of it on disk (yet): a publish or mkdir sets them there
        if times_ns is not None and node.is_file and node.dirty:
            # Written and not published yet: its publish sets the times on the new file (see
            # _carried). Set on the old file now, they would make a version of it the mount
            # never saw, and the publish would have nothing to check it against: it would go
            # over whatever another writer put there meanwhile, unseen (``cp -p`` sets the
            # times through the descriptor before it closes).
            times_ns = None
            if mode is None and owner is None:
                return
        # The disk's version of a file holds its modification time: new times make a new
        # version, taken only while the file is the one the mount last saw (else the mount
        # would adopt another writer's version for data it does not have).
        guarded = times_ns is not None and node.is_file and _known_version(node.etag)
        try:
            version = fs.local_set_attributes(
                self.path_of(node) if path is None else path, mode=mode, owner=owner, times_ns=times_ns,
                expected=Version(node.etag) if guarded else None,
            )  # fmt: skip
        except StaleFileError:
            # Replaced on disk since the mount saw it: the next lookup shows what is there
            # (the kernel, told ESTALE, looks the path up again and retries once).
            node.checked_at = 0.0
            for parent, _name in node.links:
                parent.listed_at = 0.0
            raise
        if times_ns is not None:
            if node.is_file:
                # Unguarded (the mount knew no version of it): asked before a write.
                node.etag = version if guarded else None
                node.checked_at = time.monotonic()  # newer than a listing read before
            if node.backing_fd >= 0:
                node.backing_mtime = times_ns[1]

    def _restore_attributes(self, node: Node, path: str | None = None, *, times: bool = True) -> None:
        """After a publish or a mkdir on local disk: the new file takes the node's mode, owner
        and, with ``times``, its times (a publish has set those already); a chown the mount's
        user may not make is left undone."""
        if not isinstance(self.fs, SupportsLocalAttributes):
            return
        # The times the mount showed while the file was written (the last write's, or what
        # utime set) rather than the moment of the publish: what the next mount shows.
        when = (node.atime, node.mtime) if times else None
        owner = None if (node.uid, node.gid) == (os.geteuid(), os.getegid()) else (node.uid, node.gid)
        try:
            # One call: the owner first, then the mode (a chown clears set-ID bits).
            self._store_attributes(node, node.perm, owner, when, path)
        except PermissionError as exc:
            if owner is None:
                _log.debug("attributes of %s not kept on disk: %s", self._safe_path(node), exc)
                return
            # The mount's user may not give files away: the file is its own, and the mount
            # shows the owner the disk has; a set-ID bit would make the file run as the
            # mount's user for whoever asked for it, so it goes.
            node.uid, node.gid = os.geteuid(), os.getegid()
            node.perm &= ~(stat_module.S_ISUID | stat_module.S_ISGID)
            self._invalidate_later(None, None, node.ino)
            with contextlib.suppress(OSError):
                self._store_attributes(node, node.perm, None, when, path)  # all but the owner
        except OSError as exc:
            _log.debug("attributes of %s not kept on disk: %s", self._safe_path(node), exc)

    async def commit(self, node: Node) -> None:
        """Publish a dirty file to every name it has.

        The publish is conditional on the version the mount last saw (``If-Match`` on S3, a
        create only where nothing is, the stale check elsewhere). When storage changed
        meanwhile, the other writer's version stays: this one goes to the recovery area and
        its writer gets ``EIO`` (logged with the path and both versions). Any other failure is
        ``EIO`` too; the staged copy is kept and the file marked failed: only its writer's
        next ``fsync`` or ``close`` tries again, else it goes to the recovery area at its last
        close (see :meth:`keep`), never uploaded later behind the writer's back.
        """
        if not node.dirty or node.stage is None:
            return
        conflict: str | None = None
        async with node.lock:
            if not _is_dirty(node):
                return  # uploaded by a concurrent request while this one waited
            if not node.links:
                node.dirty = False  # unlinked while open: nothing to publish
                return
            seq = node.write_seq
            node.fresh = False
            paths = [self.table.child_path(parent, name) for parent, name in node.links]
            base = node.etag if node.stored else None
            try:
                version = await self._publish(node, paths, base)
            except (StaleFileError, FileExistsError) as exc:
                conflict = self._conflict(paths[0], base, exc)
            except Exception as exc:
                node.failed = str(exc) or type(exc).__name__
                self.failed_uploads["/" + paths[0]] = node.failed
                self.staging.mark_failed(node, node.failed)
                _log.error("upload of /%s failed, kept staged at %s: %s", paths[0], node.stage, exc)
                raise _fail(errno.EIO) from None
            else:
                for path in paths:
                    self.failed_uploads.pop("/" + path, None)
                self._published(node, version, seq)
        if conflict is not None:
            await self.keep(node, conflict)
            raise _fail(errno.EIO)

    def _published(self, node: Node, version: str | None, seq: int, path: str | None = None) -> None:
        """``node``'s staged copy is in storage now, as ``version`` (at ``path``, by default
        its first name): the node says so, its open handles read that version, and the copy
        is clean unless written meanwhile (``seq`` is its write count when the publish began)."""
        node.stored = True
        node.failed = None
        node.etag = version
        # The publish set the times (part of the disk's version); owner and mode, which are
        # not, again here where a chown may be refused.
        self._restore_attributes(node, path, times=False)
        node.times_stale = True
        self._repin(node)
        node.checked_at = time.monotonic()
        if node.write_seq == seq:
            node.dirty = node.written = False
            self.staging.mark_clean(node)
            self.staging.published(node)

    def _repin(self, node: Node) -> None:
        """This mount changed ``node`` in storage: its open handles read the new version
        (a reader sees the writes of its own mount, as on a local filesystem)."""
        version = node.etag if _known_version(node.etag) else None
        for handle in self.handles.values():
            if handle.node is node:
                handle.reading.version = version

    async def _publish(self, node: Node, paths: list[str], base: str | None) -> str | None:
        """Upload ``node``'s staged copy under ``paths`` (its first name conditionally on
        ``base``, or as a create for a file storage has not had); the version now there."""
        assert node.stage is not None
        expected = Version(base) if node.stored and _known_version(base) else None
        create = not node.stored
        attrs = self._carried(node)
        if node.stream is not None:
            # A streamed upload completes with no condition of its own: the version is
            # checked just before (a narrow race).
            await check_version(self.fs, paths[0], expected=expected, create=create)
            started = node.stream_attrs
            if await self.uploads.finish(node):
                if attrs is not None and started is not None and (attrs.mode, attrs.uid, attrs.gid) != (
                    started.mode, started.uid, started.gid,
                ):  # fmt: skip
                    # Changed while the upload ran: the object takes the attributes now.
                    await set_attributes(self.fs, paths[0], attrs)
                return None
        if self._linked_on_disk(node):
            # Names of one file on disk (hard links): written in place, so they stay one.
            return await rewrite_file(self.fs, node.stage, paths[0], expected=expected, attributes=attrs)
        version = await publish_file(
            self.fs, node.stage, paths[0], expected=expected, create=create, attributes=attrs, keep=node.keep
        )
        for path in paths[1:]:
            # Only local disk has hard links, and there they are made once storage has the
            # file; a node with names beyond its first has them there (kept for safety).
            await upload_file(self.fs, node.stage, path)
        return version

    def _carried(self, node: Node) -> PosixAttributes | None:
        """The attributes a publish of ``node`` gives the new file where storage keeps them
        (object metadata, or set on the file on disk before it takes its name)."""
        return self._attributes(node) if self.attr_store is not None else None

    def _linked_on_disk(self, node: Node) -> bool:
        """A stored file with several names on local disk (the mount may know only one of
        them): it is written in place, so that every name stays the one file."""
        return self.attr_store == "native" and node.stored and (len(node.links) > 1 or node.disk_ino is not None)

    def _conflict(self, path: str, base: str | None, exc: OSError) -> str:
        """Log a publish refused because storage changed; the reason kept with the data."""
        if isinstance(exc, FileExistsError):
            why = "another writer created it since this mount did"
        elif getattr(exc, "actual_mtime", None) is None:
            why = "it was deleted or renamed in storage since this mount saw it"
        else:
            why = f"another writer replaced it in storage since this mount saw version {base}"
        _log.error("/%s not published: %s (the other version stays)", path, why)
        return f"conflict: {why}"

    async def keep(self, node: Node, reason: str) -> None:
        """Put ``node``'s unpublished data into the recovery area instead of storage; the
        mount then shows what storage holds (the old file, or no file)."""
        if node.stage is None or not node.dirty:
            return
        path = self._safe_path(node).lstrip("/")
        async with node.lock:
            if not _has_stage(node) or not _is_dirty(node):
                return  # published or let go by a concurrent request while this one waited
            if self.recovery is None:
                # Operations without a mount point: nowhere durable to put it; keep it staged.
                _log.error("/%s was not published (%s); it stays staged at %s", path, reason, node.stage)
                return
            base = node.etag if node.stored else None
            kept = await trio.to_thread.run_sync(
                functools.partial(self.recovery.keep, node.stage, path=path, base=base, reason=reason)
            )
            self.kept.append(kept)
            for name in [self.table.child_path(parent, name) for parent, name in node.links]:
                self.failed_uploads.pop("/" + name, None)
            node.dirty = node.written = False
            node.failed = None
            self.uploads.drop(node)
            self.staging.drop(node)
        await self._show_storage(node)

    async def _show_storage(self, node: Node) -> None:
        """After ``keep``: make the mount show what storage holds under ``node``'s names."""
        node.version += 1
        node.kernel_version = -1
        if not node.stored:
            # Never published: storage has no such file.
            for parent, name in list(node.links):
                assert parent.children is not None
                parent.children.pop(name, None)
                self.table.drop_link(node, parent, name)
                self._invalidate_later(parent.ino, name, node.ino)
            return
        for parent, name in node.links:
            parent.listed_at = 0.0
            self._invalidate_later(parent.ino, name, node.ino)
        try:
            st = await self.fs.stat(self.path_of(node))
        except (OSError, pyfuse3.FUSEError):
            node.checked_at = 0.0
            return
        node.size, node.etag = st.size, st.etag
        node.mtime = node.ctime = ns(st.modified_at)
        node.checked_at = time.monotonic()

    def _writers_staged(self) -> list[Node]:
        return [n for n in self.inodes.values() if n.dirty and n.stage is not None and n.writers]

    async def drain(self, wait: float | None = None) -> dict[str, str]:
        """Before unmounting: wait up to ``wait`` seconds (default ``stop_timeout``) for files
        open for writing to be closed, publish every dirty file nobody writes any more, and
        keep the rest in the recovery area: files still open (half written, perhaps) and
        files whose upload failed before. Returns what was not published, by path."""
        deadline = trio.current_time() + (self.options.stop_timeout if wait is None else wait)
        while self._writers_staged() and trio.current_time() < deadline:
            self._writer_closed = trio.Event()
            with trio.move_on_at(deadline):
                await self._writer_closed.wait()
        self._writer_closed = None
        unpublished: dict[str, str] = {}
        for node in list(self.inodes.values()):
            if not node.dirty or node.stage is None:
                continue
            path = self._safe_path(node)
            if node.writers:
                reason = "still open for writing when the mount stopped"
            elif node.failed is not None:
                reason = f"its upload failed: {node.failed}"
            else:
                kept_before = len(self.kept)
                try:
                    await self.commit(node)
                    continue
                except pyfuse3.FUSEError:
                    if len(self.kept) > kept_before:
                        # A conflict: commit kept it already, with its reason.
                        unpublished[path] = self.kept[-1].reason
                        continue
                    reason = f"its upload failed: {node.failed}"
            unpublished[path] = reason
            await self.keep(node, reason)
        return unpublished

    async def abort_left_uploads(self) -> None:
        """Abort the multipart uploads a mount that ended left open (named in its journal)."""
        tickets, self.pending_aborts = self.pending_aborts, []
        for ticket in tickets:
            try:
                if isinstance(self.fs, SupportsUploadRecovery) and await self.fs.abort_upload(ticket):
                    _log.warning("aborted an incomplete upload left by an earlier mount: %s", ticket.get("key"))
            except Exception as exc:
                _log.error("could not abort an incomplete upload left by an earlier mount (%s): %s", ticket, exc)

    async def release_cache(self) -> None:
        """Turn off a cache this mount turned on, once what it was filling is written."""
        if not self.owns_cache or self.cached is None:
            return
        self.owns_cache = False
        await trio.to_thread.run_sync(self.cached.flush_cache)
        close = getattr(self.cached, "close_cache", None)
        if close is not None:
            await close()

    def close_staging(self) -> None:
        """Drop staged copies of clean files; remove the staging area if it is ours and empty,
        and the session with its journal if nothing in it is left unpublished."""
        if self.cached is not None:
            self.cached.flush_cache()  # files read to their end are committed to the cache
        for node in self.inodes.values():
            if node.backing_fd >= 0:
                os.close(node.backing_fd)  # the session is gone, and its backing ids with it
                node.backing_fd, node.backing_id = -1, 0
            if not node.dirty:
                self.staging.drop(node)
        self.staging.close()
        if self.session is not None:
            self.session.close()

    # -- change feed from the same filesystem object ----------------------------------------

    def forget_paths(self, paths: tuple[str, ...]) -> list[tuple[int | None, str | None, int | None]]:
        """Drop what the mount cached about ``paths`` (changed through the filesystem API) and
        return the kernel notifications to send."""
        notes: list[tuple[int | None, str | None, int | None]] = []
        for raw in paths:
            try:
                rel = normalize_path(raw).strip("/")
            except Exception:
                continue
            parts = [p for p in rel.split("/") if p]
            parent: Node = self.root
            node: Node | None = self.root
            missing = ""
            for part in parts:
                assert node is not None
                parent = node
                node = node.children.get(part) if node.is_dir and node.children is not None else None
                if node is None:
                    missing = part
                    break
            # The directory holding the change lists again at the next lookup.
            parent.listed_at = 0.0
            if node is not None and node is not self.root:
                node.checked_at = 0.0
                if node.stored:
                    node.listed_at = 0.0
                if node.is_file and not node.dirty and not node.writers:
                    node.version += 1
                    node.etag = "\0changed"
                notes.append((parent.ino, parts[-1], node.ino))
            elif missing:
                notes.append((parent.ino, missing, None))
            notes.append((None, None, parent.ino))
        return notes

    # -- metadata operations -------------------------------------------------------------

    @_fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if len(name) > _NAME_MAX:
            raise _fail(errno.ENAMETOOLONG)
        directory = self.table.node(parent_inode)
        if name == b".":
            return self._entry(directory)
        if name == b"..":
            return self._entry(directory.links[0][0] if directory.links else self.root)
        children = await self._children(directory)
        node = children.get(os.fsdecode(name))
        if node is None:
            # A negative entry: the kernel remembers the absence for the same time.
            entry = pyfuse3.EntryAttributes()
            entry.st_ino = 0
            entry.entry_timeout = self._ttl
            return entry
        return self._entry(node)

    @_fuse_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self.table.node(inode)
        if node.is_file and self._stale(node):
            await self._check_file(node)
        return self.attrs(node)

    def _stale(self, node: Node) -> bool:
        """A clean stored file whose attributes are older than the TTL: storage may hold
        another version now."""
        return (
            node.stored
            and not node.dirty
            and not node.writers
            and bool(node.links)
            and time.monotonic() - node.checked_at >= self._ttl
        )

    async def _check_file(self, node: Node) -> None:
        """One ``stat`` when a file's attributes are older than the TTL: another writer may
        have replaced it in storage."""
        parent, _name = node.links[0]
        if time.monotonic() - parent.listed_at < self._ttl:
            node.checked_at = time.monotonic()
            return
        asked = time.monotonic()
        try:
            st = await self.fs.stat(self.path_of(node))
        except FileNotFoundError:
            node.checked_at = time.monotonic()
            parent.listed_at = 0.0  # the next lookup lists again and drops it
            return
        if node.checked_at >= asked:
            return  # published or checked by the mount since the stat was read: newer
        if st.type == "file":
            self._refresh_file(node, st)

    @_fuse_errors
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        node = self.table.node(inode)
        resize = fields.update_size
        if (resize or fields.update_mode or fields.update_uid or fields.update_gid) and self.read_only:
            raise _fail(errno.EROFS)
        if node.backing_fd >= 0:
            self._sync_backing(node)  # writes before this call are older than what it sets
        if resize:
            if node.is_dir:
                raise _fail(errno.EISDIR)
            if not node.is_file:
                raise _fail(errno.EINVAL)
            size = attr.st_size
            held = node.backing_fd >= 0
            if held or (self._passes_through(node) and self._attach_backing(node)):
                # Passed through (open, or a truncate(2) of a file nobody has open): the
                # file on disk is the file.
                try:
                    if not node.backing_writable:
                        raise _fail(errno.EACCES)
                    os.ftruncate(node.backing_fd, size)
                    self._sync_backing(node)
                    node.touch()
                    node.pt_wrote = True
                finally:
                    if not held:
                        self._release_backing(node)
                resize = False
        if resize:
            size = attr.st_size
            await self._own_stage(node, truncate_to=size)
            if node.stream is not None and size < node.stream.read_to:
                self.uploads.drop(node)
            elif size == 0:
                self.uploads.drop(node)
                node.fresh = len(node.links) == 1
            self.staging.reserve(node, size)
            os.ftruncate(node.stage_fd, size)
            # POSIX: a successful truncate marks the file changed even at the same size.
            node.size = size
            self._dirty(node, written=True)
            node.touch()
            if not node.writers:
                # truncate(2) without an open file: it is done when the call returns.
                try:
                    await self.commit(node)
                except pyfuse3.FUSEError:
                    if not node.opens:
                        await self.keep(node, f"its upload failed: {node.failed}")
                    raise
                if not node.opens:
                    self.staging.drop(node)
        perm = attr.st_mode & 0o7777 if fields.update_mode else node.perm
        uid = attr.st_uid if fields.update_uid else node.uid
        gid = attr.st_gid if fields.update_gid else node.gid
        atime = attr.st_atime_ns if fields.update_atime else node.atime
        mtime = attr.st_mtime_ns if fields.update_mtime else node.mtime
        times = fields.update_atime or fields.update_mtime
        # Where storage keeps them (local disk), they go there first: a refusal (EPERM for a
        # chown the mount's user may not make) is the caller's, and nothing changes.
        self._store_attributes(
            node, perm if fields.update_mode else None,
            (uid, gid) if fields.update_uid or fields.update_gid else None,
            (atime, mtime) if times else None,
        )  # fmt: skip
        changes = fields.update_mode or fields.update_uid or fields.update_gid or times
        if changes and self.attr_store == "metadata" and node.lock.locked():
            # A publish in flight (a close's, sent after close(2) returned) carries the
            # attributes it started with: it lands first, then these go to the object.
            async with node.lock:
                pass
        if changes and self.attr_store == "metadata" and self._kept_in_metadata(node):
            # A copy of the object onto itself with the new metadata (S3), or a metadata
            # update (GCS): the data is not sent again. A refusal is the caller's.
            attrs = dataclasses.replace(
                self._attributes(node), mode=node.kind | perm, uid=uid, gid=gid, atime_ns=atime, mtime_ns=mtime,
                ctime_ns=now_ns(),
            )  # fmt: skip
            try:
                version = await set_attributes(self.fs, self.path_of(node), attrs)
            except StaleFileError:
                # Gone from storage meanwhile: the next lookup shows it.
                for parent, _name in node.links:
                    parent.listed_at = 0.0
                raise _fail(errno.ENOENT) from None
            if version is not None:
                node.etag = version
                node.checked_at = time.monotonic()  # newer than a listing read before
        node.perm, node.uid, node.gid, node.atime, node.mtime = perm, uid, gid, atime, mtime
        if times and node.backing_fd >= 0 and node.backing_writable and not isinstance(self.fs, SupportsLocalAttributes):
            # The file on disk takes the times too, so later reads of them agree.
            os.utime(node.backing_fd, ns=(node.atime, node.mtime))
            node.backing_mtime = node.mtime
        if fields.update_mode or fields.update_uid or fields.update_gid or fields.update_atime or fields.update_mtime:
            node.ctime = now_ns()
        if fields.update_ctime:
            node.ctime = attr.st_ctime_ns
        return self.attrs(node)

    @_fuse_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = self.table.node(inode)
        if node.kind != _S_IFLNK:
            raise _fail(errno.EINVAL)
        if node.target is None and node.stored and node.links:
            # s3fs-fuse's form: the object's content is the target, which no system lets be
            # longer than PATH_MAX (an object claiming to be a link can be anything).
            if node.size >= _PATH_MAX:
                raise _fail(errno.ENAMETOOLONG)
            node.target = await read_range(self.fs, self.path_of(node), 0, _PATH_MAX)
        if node.target is None:
            raise _fail(errno.EINVAL)
        return node.target

    @_fuse_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self.table.node(inode)
        children = await self._children(node)
        # A snapshot per handle: entries that change during a long listing are neither
        # skipped nor repeated.
        fh = self._next_fh
        self._next_fh += 1
        self.dir_handles[fh] = sorted(children.items())
        return fh

    @_fuse_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self.dir_handles.get(fh)
        if entries is None:
            raise _fail(errno.EBADF)
        for index in range(start_id, len(entries)):
            name, node = entries[index]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self.attrs(node), index + 1):
                break
            # Each accepted entry is a reference the kernel will forget like a lookup's.
            node.lookups += 1
            self.inodes[node.ino] = node

    @_fuse_errors
    async def releasedir(self, fh: int) -> None:
        self.dir_handles.pop(fh, None)

    @_fuse_errors
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            node = self.inodes.get(ino)
            if node is None or node is self.root:
                continue
            node.lookups = max(0, node.lookups - count)
            if node.lookups == 0 and not node.links and not node.opens:
                self.staging.drop(node)
                del self.inodes[ino]

    @_fuse_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        out = pyfuse3.StatvfsData()
        local = os.statvfs(self.staging_dir)
        out.f_bsize = 4096
        out.f_frsize = 4096
        if self.passthrough_granted():
            # Writes go to the disk holding the files (the staging area sits on it): its own
            # size and free space are the mount's.
            scale = local.f_frsize
            out.f_blocks = local.f_blocks * scale // 4096
            out.f_bfree = local.f_bfree * scale // 4096
            out.f_bavail = local.f_bavail * scale // 4096
        else:
            # Storage has no fixed size: what bounds a write through the mount is the staging
            # budget still free (and the disk under it). Reported as a disk of that budget,
            # used only by what is staged now, so `df` shows room, never a full disk.
            free = min(local.f_bavail * local.f_frsize, max(0, self.options.staging_limit - self.staging.used))
            out.f_bfree = out.f_bavail = max(1, free // 4096)
            out.f_blocks = out.f_bfree + self.staging.used // 4096
        out.f_files = 1 << 32
        out.f_ffree = (1 << 32) - len(self.inodes)
        out.f_favail = out.f_ffree
        out.f_namemax = _NAME_MAX
        return out

    # -- xattrs: refused loudly, never accepted and lost ----------------------------------

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        raise _fail(errno.ENOTSUP)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise _fail(errno.ENOTSUP)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        raise _fail(errno.ENOTSUP)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise _fail(errno.ENOTSUP)

    # -- creating and removing names ------------------------------------------------------

    async def _free_name(self, directory: Node, name: str) -> None:
        children = await self._children(directory)
        if name in children:
            raise _fail(errno.EEXIST)

    async def _existing_name(self, parent_inode: int, name: bytes) -> tuple[Node, str, Node]:
        """The directory, checked name and node of something about to be removed."""
        self._check_writable()
        directory = self.table.node(parent_inode)
        text = self._name(name)
        node = (await self._children(directory)).get(text)
        if node is None:
            raise _fail(errno.ENOENT)
        return directory, text, node

    async def _new_name(self, parent_inode: int, name: bytes) -> tuple[Node, str]:
        """The directory and checked name for something about to be created there."""
        self._check_writable()
        directory = self.table.node(parent_inode)
        text = self._name(name)
        await self._free_name(directory, text)
        return directory, text

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        directory, text = await self._new_name(parent_inode, name)
        path = self.table.child_path(directory, text)
        await self.fs.mkdir(path, recursive=False)
        uid, gid = self._owner(directory, ctx)
        perm = mode & 0o7777
        if directory.perm & stat_module.S_ISGID:
            perm |= stat_module.S_ISGID
        node = self.table.new_node(_S_IFDIR, perm, uid=uid, gid=gid, stored=True)
        node.listed_at = time.monotonic()  # new and empty: nothing to list
        if self.attr_store == "metadata" and (perm, uid, gid) != (
            self.options.dir_mode, self.options.uid, self.options.gid,
        ):  # fmt: skip
            # The marker object keeps what a remount would not show by itself.
            await set_attributes(self.fs, path, self._attributes(node))
        self.table.add_link(directory, text, node)
        self._restore_attributes(node)
        return self._entry(node)

    @_fuse_errors
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        directory, text = await self._new_name(parent_inode, name)
        kind = stat_module.S_IFMT(mode) or _S_IFREG
        uid, gid = self._owner(directory, ctx)
        if kind == _S_IFREG:
            node = await self._create_file(directory, text, mode, uid, gid)
            await self.commit(node)
            self.staging.drop(node)
            return self._entry(node)
        node = self.table.new_node(kind, mode, uid=uid, gid=gid, rdev=rdev)
        await self._store_special(node, self.table.child_path(directory, text))
        self.table.add_link(directory, text, node)
        return self._entry(node)

    async def _store_special(self, node: Node, path: str) -> None:
        """Create a new symbolic link, FIFO, socket or device node in storage where storage
        keeps them; elsewhere it lives in the mount (for the mount's life)."""
        if self.attr_store is None:
            return
        attrs = self._attributes(node)
        if self.attr_store == "native":
            attrs = dataclasses.replace(attrs, atime_ns=None, mtime_ns=None, ctime_ns=None)  # the disk's own
        try:
            await make_special(self.fs, path, attrs)
        except BaseException:
            self.inodes.pop(node.ino, None)
            raise
        node.stored = True

    @_fuse_errors
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        directory, text = await self._new_name(parent_inode, name)
        uid, gid = self._owner(directory, ctx)
        node = self.table.new_node(_S_IFLNK, 0o777, uid=uid, gid=gid, size=len(target), target=bytes(target))
        await self._store_special(node, self.table.child_path(directory, text))
        self.table.add_link(directory, text, node)
        return self._entry(node)

    @_fuse_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self._check_writable()
        node = self.table.node(inode)
        if node.is_dir:
            raise _fail(errno.EPERM)
        directory = self.table.node(new_parent_inode)
        text = self._name(new_name)
        await self._free_name(directory, text)
        if self.attr_store != "native" or not node.links:
            # Storage without hard links: two copies would drift apart after a remount
            # (s3fs-fuse refuses the same way).
            raise _fail(errno.EPERM)
        if node.is_file:
            self.uploads.drop(node)
            await self.commit(node)  # the disk has the file as written so far
        if not node.stored:
            raise _fail(errno.EPERM)
        await make_hard_link(self.fs, self.path_of(node), self.table.child_path(directory, text))
        self.table.add_link(directory, text, node)
        node.touch(content=False)
        return self._entry(node)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        directory, text, node = await self._existing_name(parent_inode, name)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        await self._remove_name(directory, text, node)

    async def _remove_name(self, directory: Node, name: str, node: Node) -> None:
        self.uploads.drop(node)
        await self._keep_for_descriptors(node)
        # A publish in flight (the last close's, which the kernel sends after close(2)
        # returned) lands first: the removal then takes it away. One that would start
        # meanwhile finds the name gone (nothing to publish), rather than putting the file
        # back, or taking the removal for another writer's.
        async with self._names_of(node):
            if node.is_file and node.stored:
                path = self.table.child_path(directory, name)
                if not self._unlink_on_disk(path):
                    await self.fs.delete_file(path, force=True)
            elif node.stored and not node.is_dir:
                await self._remove_special(self.table.child_path(directory, name))
            assert directory.children is not None
            directory.children.pop(name, None)
            self.table.drop_link(node, directory, name)
            directory.touch()
            node.touch(content=False)
            if not node.links:
                node.dirty = False
                if not node.opens:
                    self.staging.drop(node)

    async def _keep_for_descriptors(self, node: Node) -> None:
        """Before ``node``'s last name goes from storage (unlinked, or replaced by a rename):
        open descriptors keep working on a staged copy of it (a file staged already, or
        opened in place, has one)."""
        if (
            node.is_file and node.stored and node.opens and node.stage is None and node.backing_fd < 0
            and len(node.links) == 1
        ):  # fmt: skip
            await self._materialize(node)

    @_fuse_errors
    async def _remove_special(self, path: str) -> None:
        """Remove a stored symbolic link, FIFO, socket or device node: on disk the name
        itself (what a link points to is never looked at), elsewhere the object."""
        if self.attr_store == "native" and self._local is not None:
            with contextlib.suppress(FileNotFoundError):
                await trio.to_thread.run_sync(self._local.local_unlink, path)
            return
        await self.fs.delete_file(path, force=True)

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        directory, text, node = await self._existing_name(parent_inode, name)
        if not node.is_dir:
            raise _fail(errno.ENOTDIR)
        if await self._children(node):
            raise _fail(errno.ENOTEMPTY)
        await self._remove_dir(directory, text, node)

    async def _remove_dir(self, directory: Node, name: str, node: Node) -> None:
        if node.stored:
            await self.fs.rmdir(self.table.child_path(directory, name), force=True)
        assert directory.children is not None
        directory.children.pop(name, None)
        self.table.drop_link(node, directory, name)
        directory.touch()
        node.touch(content=False)

    @_fuse_errors
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self._check_writable()
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise _fail(errno.EINVAL)
        old_dir = self.table.node(parent_inode_old)
        new_dir = self.table.node(parent_inode_new)
        old_name = self._name(name_old)
        new_name = self._name(name_new)
        node = (await self._children(old_dir)).get(old_name)
        if node is None:
            raise _fail(errno.ENOENT)
        target = (await self._children(new_dir)).get(new_name)
        if old_dir is new_dir and old_name == new_name:
            return
        if target is node:
            return  # two names of one file: rename(2) does nothing
        if target is not None and flags & pyfuse3.RENAME_NOREPLACE:
            raise _fail(errno.EEXIST)
        if node.is_dir:
            ancestor: Node | None = new_dir
            while ancestor is not None and ancestor is not self.root:
                if ancestor is node:
                    raise _fail(errno.EINVAL)
                ancestor = ancestor.links[0][0] if ancestor.links else None
            if target is not None:
                if not target.is_dir:
                    raise _fail(errno.ENOTDIR)
                if await self._children(target):
                    raise _fail(errno.ENOTEMPTY)
        elif target is not None and target.is_dir:
            raise _fail(errno.EISDIR)
        old_path = self.table.child_path(old_dir, old_name)
        new_path = self.table.child_path(new_dir, new_name)
        if target is not None:
            await self._keep_for_descriptors(target)
        # The file moved and the file replaced keep their names in storage and in the mount
        # in step: a publish of either in flight (its last close's, sent after close(2)
        # returned) lands first, and one that would start meanwhile waits for the new names
        # (see _names_of).
        async with self._names_of(node, target):
            if node.is_dir:
                await self._rename_dir(node, old_path, new_path, target)
            elif node.is_file:
                await self._rename_file(node, old_path, new_path, target)
            elif node.stored:
                # A stored symbolic link, FIFO...: moved in storage (an object copy keeps its
                # metadata), over whatever the new name held.
                await self.fs.move_file(old_path, new_path, overwrite=True)
            elif target is not None and not target.is_dir and target.stored:
                # A mount-only node (symlink, FIFO...) replaces a stored file: the file goes.
                if target.is_file:
                    await self.fs.delete_file(new_path, force=True)
                else:
                    await self._remove_special(new_path)
            if target is not None:
                assert new_dir.children is not None
                new_dir.children.pop(new_name, None)
                self.table.drop_link(target, new_dir, new_name)
                target.touch(content=False)
                if not target.links:
                    target.dirty = False
                    if not target.opens:
                        self.staging.drop(target)
            assert old_dir.children is not None
            assert new_dir.children is not None
            old_dir.children.pop(old_name, None)
            node.links = [
                (new_dir, new_name) if (d is old_dir and n == old_name) else (d, n) for d, n in node.links
            ]
            new_dir.children[new_name] = node
        old_dir.touch()
        new_dir.touch()
        node.touch(content=False)

    async def _rename_file(self, node: Node, old_path: str, new_path: str, target: Node | None) -> None:
        """Move the file ``node`` in storage (over ``target``), holding the locks of both."""
        self.uploads.drop(node)
        if target is not None:
            self.uploads.drop(target)
        if node.dirty and node.stage is not None and not self._linked_on_disk(node):
            # Publish the staged content under the new name, then drop the old one (a file
            # with other names on disk is renamed instead, and written in place at its close).
            seq = node.write_seq
            version = await publish_file(self.fs, node.stage, new_path, attributes=self._carried(node), keep=node.keep)
            if node.stored:
                await self.fs.delete_file(old_path, force=True)
            # Under its new name already (rename(2) moves the node after this).
            self._published(node, version, seq, new_path)
            return
        if node.stored:
            await self.fs.move_file(old_path, new_path, overwrite=True)
            node.etag = None  # a copy may have a version of its own: asked before a write
            self._repin(node)
        elif target is not None and target.stored:
            await self.fs.delete_file(new_path, force=True)

    async def _rename_dir(self, node: Node, old_path: str, new_path: str, target: Node | None) -> None:
        if not node.stored:
            return
        if not self.atomic_rename:
            count = await self._count_tree(node, self.options.rename_dir_limit + 1)
            if count > self.options.rename_dir_limit:
                _log.warning(
                    "rename of /%s refused with EXDEV: more than %d entries (rename_dir_limit)",
                    old_path, self.options.rename_dir_limit,
                )
                raise _fail(errno.EXDEV)
        # Dirty files below keep their staged copies and publish under the new path later;
        # what storage holds moves now.
        await self.commit_tree(node)
        if target is not None and target.stored:
            await self.fs.rmdir(new_path, force=True)
        await self.fs.move_file(old_path, new_path, overwrite=False)
        self._forget_versions(node)

    def _forget_versions(self, node: Node) -> None:
        """Files below ``node`` were moved in storage (copies may have versions of their own):
        each is asked for its version before its next write."""
        for child in (node.children or {}).values():
            if child.is_dir:
                self._forget_versions(child)
            elif child.is_file and not child.dirty:
                child.etag = None
                self._repin(child)

    async def commit_tree(self, node: Node) -> None:
        for child in list((node.children or {}).values()):
            if child.is_dir:
                await self.commit_tree(child)
            elif child.dirty:
                await self.commit(child)

    async def _count_tree(self, node: Node, limit: int) -> int:
        total = 0
        for child in (await self._children(node)).values():
            total += 1
            if child.is_dir:
                total += await self._count_tree(child, limit - total)
            if total >= limit:
                break
        return total

    # -- files ----------------------------------------------------------------------------------

    async def _create_file(self, directory: Node, name: str, mode: int, uid: int, gid: int) -> Node:
        node = self.table.new_node(_S_IFREG, mode, uid=uid, gid=gid)
        self.table.add_link(directory, name, node)
        await self._materialize(node, truncate_to=0)
        self._dirty(node, written=False)
        node.fresh = True
        return node

    def _open_handle(self, node: Node, flags: int, pid: int = 0) -> int:
        accmode = flags & os.O_ACCMODE
        writable = accmode in (os.O_WRONLY, os.O_RDWR)
        handle = _Handle(node, writable=writable, append=bool(flags & os.O_APPEND), opener=pid)
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = handle
        node.opens += 1
        if writable:
            node.writers += 1
        return fh

    @_fuse_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._check_writable()
        directory = self.table.node(parent_inode)
        text = self._name(name)
        children = await self._children(directory)
        existing = children.get(text)
        if existing is not None:
            if flags & os.O_EXCL:
                raise _fail(errno.EEXIST)
            info = await self._open(existing, flags, ctx.pid)
            return info, self._entry(existing)
        uid, gid = self._owner(directory, ctx)
        if self.passthrough_granted():
            created = await self._create_passthrough(directory, text, mode, flags, uid, gid)
            if created is not None:
                return created[0], self._entry(created[1])
        node = await self._create_file(directory, text, mode, uid, gid)
        fh = self._open_handle(node, flags, ctx.pid)
        info = pyfuse3.FileInfo(fh=fh, keep_cache=True)
        node.kernel_version = node.version
        return info, self._entry(node)

    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return await self._open(self.table.node(inode), flags, ctx.pid)

    async def _open(self, node: Node, flags: int, pid: int = 0) -> pyfuse3.FileInfo:
        if node.is_dir:
            raise _fail(errno.EISDIR)
        accmode = flags & os.O_ACCMODE
        if accmode != os.O_RDONLY or flags & os.O_TRUNC:
            self._check_writable()
        if not node.is_file:
            raise _fail(errno.ENXIO if node.kind in (stat_module.S_IFIFO, stat_module.S_IFSOCK) else errno.ENODEV)
        truncate = bool(flags & os.O_TRUNC) and accmode != os.O_RDONLY
        if not truncate and self._stale(node):
            # Close-to-open: a file opened again is checked against storage (one stat when
            # its attributes are older than the TTL).
            await self._check_file(node)
        if self.read_only and self.cached is not None and node.backing_fd < 0 and self._passes_through(node):
            # A read-only mount serves a cached file from the cache's copy through the
            # kernel: nobody can open it for writing, which passthrough would also route there.
            version = node.etag if _known_version(node.etag) else None
            fd = await self._open_cached(node, self.path_of(node), version) if version is not None else -1
            if fd >= 0:
                self._attach_backing(node, fd, writable=False)
        if self._passes_through(node):
            info = self._open_passthrough(node, flags, truncate=truncate)
            if info is not None:
                return info
        if truncate:
            await self._own_stage(node, truncate_to=0)
            self.uploads.drop(node)
            if node.size:
                os.ftruncate(node.stage_fd, 0)
                node.size = 0
            node.fresh = len(node.links) == 1
            self._dirty(node, written=False)
            node.touch()
        fh = self._open_handle(node, flags, pid)
        handle = self.handles[fh]
        handle.path = self._safe_path(node)
        # Reads from storage serve this version only: a file replaced or renamed elsewhere
        # meanwhile is ESTALE to this handle, never the new bytes in the old one's place.
        handle.reading.version = node.etag if node.stored and _known_version(node.etag) else None
        if node.stage is None and node.stored and node.links:
            # The state the descriptor is of, taken before the await that opens it: a change
            # meanwhile then makes the first read look again (never serve the old bytes).
            state = (node.write_seq, node.version)
            handle.fd = self._open_local(node)
            if handle.fd < 0 and self.cached is not None and handle.reading.version is not None:
                handle.fd = await self._open_cached(node, self.path_of(node), handle.reading.version)
            handle.fd_state = state
            if handle.fd >= 0 and node.stage is None and not node.dirty and state == (node.write_seq, node.version):
                self._serve(fh, handle)
        # Keep the kernel's cached pages only while the content is the one they came from.
        keep = node.kernel_version == node.version
        node.kernel_version = node.version
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    async def _open_cached(self, node: Node, path: str, version: str) -> int:
        """A descriptor of ``version`` of the file in the content cache, or -1 (then reads
        go to storage, and a sequential read of the whole file fills the cache)."""
        assert self.cached is not None
        fs = self.cached
        try:
            fd = await fs.open_cached(path, version, node.size)
            if fd is None and 0 < node.size <= _CACHE_WHOLE_BYTES:
                self._prefetch_after(node)
                fd = await fs.open_cached(path, version, node.size, fetch_below=_CACHE_WHOLE_BYTES + 1)
        except OSError:
            return -1  # changed or gone since it was looked at: storage will tell the reader
        return -1 if fd is None else fd

    def _serve(self, fh: int, handle: _Handle) -> None:
        """Have the passthrough library read ``handle``'s clean descriptor itself: a read then
        costs no trip through Python. Any change of the file (``write_seq``, ``version``)
        takes it back first (``Node.stop_serving``), so :meth:`read` decides again."""
        lib = _helper.HELPER
        if lib is None or not lib.serve(fh, handle.fd):
            return
        handle.served = True
        node = handle.node
        if node.served is None:
            node.served = []
        node.served.append(fh)

    def _prefetch_after(self, node: Node) -> None:
        """Fetch the next small files of ``node``'s directory into the cache in the background:
        a reader going through a directory (``grep -r``) then finds them there."""
        assert self.cached is not None
        parent, name = node.links[0]
        children = parent._children
        if children is None:
            return
        ahead: list[tuple[str, str, int]] = []
        after = False
        for child_name, child in children.items():
            if not after:
                after = child_name == name
                continue
            if (
                child.is_file and child.stored and not child.dirty and child.stage is None
                and 0 < child.size <= _CACHE_WHOLE_BYTES and _known_version(child.etag) and child.links
            ):  # fmt: skip
                assert child.etag is not None
                ahead.append((self.path_of(child), child.etag, child.size))
                if len(ahead) >= _PREFETCH_FILES:
                    break
        if ahead:
            self.cached.prefetch(ahead)

    def _open_local(self, node: Node) -> int:
        """A descriptor of the stored file on local disk, or -1: reads then go straight to
        it (the kernel's own read-ahead streams it) instead of through ranged reads."""
        if self._local is None:
            return -1
        try:
            return self._local.local_open(self.path_of(node), os.O_RDONLY)
        except (OSError, pyfuse3.FUSEError):
            return -1

    # -- passthrough ------------------------------------------------------------------------

    def passthrough_granted(self) -> bool:
        """The kernel serves files of this mount from their backing files (asked for at mount
        time, granted at the kernel's first request)."""
        if not self._passthrough_on and self.passthrough is not None:
            self._passthrough_on = self.passthrough.granted()
        return self._passthrough_on and self.passthrough is not None

    def _passes_through(self, node: Node) -> bool:
        """Whether the next open of ``node`` is served from its file on disk."""
        if node.pt_opens:
            return True  # the kernel requires every open of an inode to pass through while one does
        if node.opens or not node.is_file or not self.passthrough_granted():
            return False  # ... and refuses passthrough while it caches other opens of it
        # One name (storage keeps a copy per hard link) and nothing staged or uploading.
        return (
            node.stored
            and len(node.links) == 1
            and node.stage is None
            and not node.dirty
            and node.stream is None
        )

    def _attach_backing(self, node: Node, fd: int = -1, *, writable: bool = True) -> bool:
        """Open ``node``'s file on disk (or take ``fd``, opened read-write unless not
        ``writable``) and register it with the kernel as the backing file of the inode.
        False, holding nothing, when that is not possible: the open is then served through
        the mount as usual."""
        assert self.passthrough is not None
        if fd < 0:
            writable = not self.read_only
            if self._local is None:
                return False
            try:
                path = self.path_of(node)
                try:
                    fd = self._local.local_open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
                except PermissionError:
                    if not writable:
                        raise
                    writable = False  # a file this process may only read: readers pass through
                    fd = self._local.local_open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except (OSError, pyfuse3.FUSEError):
                return False
        try:
            st = os.fstat(fd)
            if not stat_module.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            backing_id = self.passthrough.open_backing(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTTY):
                # Registering backing files needs CAP_SYS_ADMIN: no use trying again.
                _log.warning("FUSE passthrough off for this mount: %s", exc.strerror)
                self.passthrough = None
            return False
        node.backing_fd, node.backing_id = fd, backing_id
        node.backing_mtime = st.st_mtime_ns
        node.backing_writable = writable
        node.size = st.st_size
        return True

    def _sync_backing(self, node: Node) -> None:
        """Take size and times from the backing file, which the kernel writes unseen."""
        try:
            st = os.fstat(node.backing_fd)
        except OSError:
            return
        node.size = st.st_size
        if st.st_mtime_ns != node.backing_mtime:
            node.backing_mtime = st.st_mtime_ns
            node.mtime = st.st_mtime_ns
            node.ctime = max(node.ctime, st.st_ctime_ns)

    def _open_passthrough(
        self, node: Node, flags: int, *, truncate: bool
    ) -> pyfuse3.FileInfo | None:
        """Open ``node`` in passthrough; None when it cannot be (served the usual way)."""
        if node.backing_fd < 0 and not self._attach_backing(node):
            return None
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        if writable and not node.backing_writable:
            raise _fail(errno.EACCES)
        if truncate:
            os.ftruncate(node.backing_fd, 0)
            self._sync_backing(node)
            node.touch()
        assert self._backing_lib is not None
        fh = self._open_handle(node, flags)
        try:
            self._backing_lib.attach(fh, node.backing_id)
        except OSError:
            # Thousands of opens waiting for their replies: refuse this one.
            self.handles.pop(fh)
            node.opens -= 1
            node.writers -= writable
            if not node.pt_opens:
                node.pt_wrote = node.pt_wrote or truncate
                self._release_backing(node)
            raise _fail(errno.EMFILE) from None
        handle = self.handles[fh]
        handle.passthrough = True
        handle.path = self._safe_path(node)
        node.pt_opens += 1
        if writable:
            node.pt_writers += 1
            node.pt_wrote = True
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)

    async def _create_passthrough(
        self, directory: Node, name: str, mode: int, flags: int, uid: int, gid: int
    ) -> tuple[pyfuse3.FileInfo, Node] | None:
        """Create a file directly on disk and open it in passthrough; None when the usual
        staged create must serve it."""
        if self._local is None:
            return None
        try:
            fd = self._local.local_open(
                self.table.child_path(directory, name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
        except (OSError, pyfuse3.FUSEError):
            return None
        if (uid, gid) != (os.geteuid(), os.getegid()):
            try:
                os.fchown(fd, uid, gid)  # the creator's, as on any filesystem
            except OSError:
                # The mount's user may not give files away: the file stays its own, and the
                # mount shows the owner the disk has. No set-ID bit on a file its creator
                # does not own (it would run as the mount's user).
                uid, gid = os.geteuid(), os.getegid()
                mode &= ~(stat_module.S_ISUID | stat_module.S_ISGID)
        with contextlib.suppress(OSError):
            os.fchmod(fd, mode & 0o7777)
        node = self.table.new_node(_S_IFREG, mode, uid=uid, gid=gid, stored=True)
        self.table.add_link(directory, name, node)
        directory.touch()
        info = (
            self._open_passthrough(node, flags, truncate=False)
            if self._attach_backing(node, fd)
            else None
        )
        if info is None:
            info = await self._open(node, flags & ~os.O_TRUNC)  # on disk, empty: opened as usual
        return info, node

    def _release_backing(self, node: Node) -> None:
        """The last passthrough handle of ``node`` closed: give its backing file back."""
        wrote = node.pt_wrote
        if wrote:
            self._sync_backing(node)
        if self._backing_lib is not None:
            self._backing_lib.close_backing(node.backing_id)
        os.close(node.backing_fd)
        node.backing_fd, node.backing_id, node.pt_wrote = -1, 0, False
        if not wrote:
            return
        # Storage changed in place: the next look at it adopts its new version tag, and pages
        # the kernel still holds from opens before are dropped at the next open.
        node.etag = None
        node.checked_at = time.monotonic()
        node.kernel_version = -1

    def _unlink_on_disk(self, path: str) -> bool:
        """With passthrough, remove a file's name on disk right here, as ``create`` makes it:
        a call through the filesystem object costs a hop to a worker thread, most of what an
        unlink took. False when the filesystem object must do it (errors are its to tell)."""
        if not self.passthrough_granted() or self._local is None:
            return False
        try:
            self._local.local_unlink(path)
        except FileNotFoundError:
            return True  # gone already: a forced delete succeeds
        except (OSError, pyfuse3.FUSEError):
            return False
        return True

    async def _copy_to_other_names(self, node: Node) -> None:
        """A file linked while open for writing: storage keeps a copy under each name, so
        the others follow what the kernel wrote into the first (at each close)."""
        first = self.path_of(node)
        for parent, name in node.links[1:]:
            await self.fs.copy_file(first, self.table.child_path(parent, name))

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        node = handle.node
        if handle.passthrough:
            # The kernel reads the backing file itself; a request here is served from it too.
            through: bytes = os.pread(node.backing_fd, size, off)
            return through
        if node.stage is not None:
            data: bytes = os.pread(node.stage_fd, size, off)
            return data
        if handle.fd >= 0:
            if handle.fd_state != (node.write_seq, node.version):
                # Written through the mount or replaced in storage since: publishing put a new
                # file in place, so read that one.
                os.close(handle.fd)
                handle.fd = self._open_local(node) if node.links else -1
                handle.fd_state = (node.write_seq, node.version)
            if handle.fd >= 0:
                direct: bytes = os.pread(handle.fd, size, off)
                return direct
        if off >= node.size or size <= 0:
            return b""
        end = min(node.size, off + size)
        # A file replaced in storage while open keeps reading under the name it was opened by.
        path = self.path_of(node) if node.links else handle.path.lstrip("/")
        try:
            # A memoryview of a prefetched part avoids a copy; pyfuse3 takes any buffer.
            data = await self.readahead.read(handle.reading, path, node.size, off, end)
        except OSError as exc:
            if exc.errno != errno.ESTALE or handle.reading.served:
                raise
            # The version the mount knew at open was replaced before this handle served a
            # byte of it (a change elsewhere, within metadata_ttl). Of the same size, the new
            # one is what the reader gets, all of it; of another size it is ESTALE (the
            # kernel holds the old size), and the next open sees the new file.
            data = await self._read_replaced(node, handle, path, off, end)
        handle.reading.served = True
        return data

    async def _read_replaced(self, node: Node, handle: _Handle, path: str, off: int, end: int) -> Any:
        try:
            st = await self.fs.stat(path)
        except FileNotFoundError:
            st = None
        if st is None or st.size != node.size or not _known_version(st.etag) or not node.links:
            node.checked_at = 0.0
            for parent, name in node.links:
                parent.listed_at = 0.0
                self._invalidate_later(parent.ino, name, node.ino)
            raise _fail(errno.ESTALE)
        if not node.dirty and not node.writers:
            node.etag = st.etag
            node.version += 1
            node.checked_at = time.monotonic()
        handle.reading.version = st.etag
        self.readahead.release(handle.reading)  # nothing of the old version is kept
        return await self.readahead.read(handle.reading, path, node.size, off, end)

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        self._check_writable()
        node = handle.node
        if handle.passthrough:
            return os.pwrite(node.backing_fd, buf, node.size if handle.append else off)
        await self._own_stage(node)
        if handle.append and not self.enable_writeback_cache:
            off = node.size
        end = off + len(buf)
        if end > node.staged_bytes:
            self.staging.reserve(node, end)
        if off != node.size and (node.fresh or node.stream is not None):
            stream = node.stream
            # Below read_to, not sent: a part read for sending but still in flight holds the
            # old bytes, and completing the upload with it would lose this write.
            if stream is None or off < stream.read_to or off > node.size:
                self.uploads.drop(node)  # no longer a plain in-order write
        written = os.pwrite(node.stage_fd, buf, off)
        if end > node.size:
            node.size = end
        self._dirty(node, written=True)
        node.touch()
        if node.stream is not None:
            node.stream.wake.set()  # the pump may send the next part
        elif node.fresh:
            await self.uploads.maybe_start(node)
        return written

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        # First, before any await: which thread closed a descriptor of this handle.
        closer = _helper.HELPER.flush_pid(fh) if _helper.HELPER is not None else 0
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        if handle.passthrough and handle.writable and len(handle.node.links) > 1:
            await self._copy_to_other_names(handle.node)
        # A flush publishes only data (not a bare O_TRUNC: the shell's `cmd > f` closes a
        # duplicate before the first write), and only when the process that opened the file
        # closes it: the children of `{ a; b; } > f` each close a copy of the descriptor
        # while the file is half written. Their closes leave it to the opener's, or to
        # the last close (release).
        node = handle.node
        if node.dirty and node.written and self._closed_by_opener(handle, closer):
            await self.commit(node)

    @staticmethod
    def _closed_by_opener(handle: _Handle, closer: int) -> bool:
        if not closer or not handle.opener:
            # Unknown (no helper library, or a process the kernel could not name): any
            # process sharing the descriptor may be closing it mid-write, so the last close
            # (release) publishes, never one that may be a child's.
            return False
        if closer == handle.opener:
            return True  # the very thread
        if not handle.opener_process:
            handle.opener_process = _process_of(handle.opener) or -1
        return _process_of(closer) == handle.opener_process

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        node = handle.node
        if node.backing_fd >= 0:
            fd = os.dup(node.backing_fd)  # the file itself, written by the kernel
            try:
                await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, fd)
            finally:
                os.close(fd)
            return
        if node.dirty:
            await self.commit(node)
        if node.stage is not None and (node.stage_published or os.fstat(node.stage_fd).st_nlink > 1):
            # On local disk the staged copy was published by a link: it is the file itself,
            # and fsync(2) promises its bytes are on the disk, not only in the page cache.
            fd = os.dup(node.stage_fd)  # the node may drop its copy meanwhile
            try:
                await trio.to_thread.run_sync(os.fsync, fd)
            finally:
                os.close(fd)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is None:
            return
        node = handle.node
        if handle.passthrough:
            if self._backing_lib is not None:
                self._backing_lib.detach(fh)  # when the open was never answered
            node.opens -= 1
            node.pt_opens -= 1
            if handle.writable:
                node.writers -= 1
                node.pt_writers -= 1
            if not node.pt_opens:
                self._release_backing(node)
            if not node.opens and not node.links and not node.lookups:
                self.inodes.pop(node.ino, None)
            return
        self.readahead.release(handle.reading)
        if handle.served and node.served is not None and fh in node.served:
            node.served.remove(fh)
            assert _helper.HELPER is not None
            _helper.HELPER.unserve(fh)  # before its descriptor is closed
        if handle.fd >= 0:
            os.close(handle.fd)
        node.opens -= 1
        if handle.writable:
            node.writers -= 1
            if self._writer_closed is not None:
                self._writer_closed.set()  # an unmount waiting for writers looks again
        if node.dirty and not node.writers:
            # The last close. A file whose upload failed (its writer was told) is not tried
            # again behind the writer's back; one that fails now has nobody left to tell.
            if node.failed is None:
                with contextlib.suppress(pyfuse3.FUSEError):
                    await self.commit(node)
            if node.dirty and node.failed is not None:
                await self.keep(node, f"its upload failed: {node.failed}")
        if not node.opens and not node.dirty:
            self.staging.drop(node)
            if not node.links and not node.lookups:
                self.inodes.pop(node.ino, None)

    # -- used by the server ----------------------------------------------------------------

    def set_thread(self) -> None:
        self.thread_id = threading.get_ident()
