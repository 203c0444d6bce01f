"""The FUSE operations: a :class:`WorkspaceFilesystem` served to the kernel through pyfuse3.

Everything here runs on the mount's trio thread. Storage calls are awaited (the filesystem
sends its blocking work to worker threads), so a slow bucket never stalls other requests;
staged copies live on local disk and are read and written in place.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import functools
import itertools
import logging
import os
import shutil
import stat as stat_module
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import pyfuse3
import trio

from .. import errors as _errors
from ..vfs import (
    FileStat,
    SupportsLocalFiles,
    SupportsStreamingUpload,
    UploadStream,
    WorkspaceFilesystem,
    download_file,
    list_stats,
    normalize_path,
    read_range,
    read_range_into,
    upload_file,
)
from . import _passthrough
from ._nodes import Node, now_ns
from ._options import MountOptions

__all__ = ["MountOperations", "notify_kernel"]

_log = logging.getLogger("agentvfs.mounts")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_S_IFDIR = stat_module.S_IFDIR
_S_IFREG = stat_module.S_IFREG
_S_IFLNK = stat_module.S_IFLNK
_NAME_MAX = 255
_BLKSIZE = 1024 * 1024


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
        except Exception:
            _log.exception("%s failed", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Staging:
    """Where a mount stages: ``path`` to work in, ``shown`` in messages; a directory held by
    descriptor ``fd`` also has the ``parent`` it was made in and its ``name`` there."""

    path: str
    shown: str
    fd: int = -1
    parent: str = ""
    name: str = ""


def _default_staging(filesystem: WorkspaceFilesystem) -> _Staging:
    """Stage beside the files where the filesystem offers a place (local disk: publishing is
    then a link and a rename), else in a private temporary directory.

    A directory beside the files may be within reach of whoever else writes there, so it is
    held by a descriptor and used through ``/proc/self/fd/N``: a rename or a symlink swapped
    in afterwards cannot redirect what the mount stages.
    """
    hint = getattr(filesystem, "local_staging_dir", None)
    where = hint() if callable(hint) else None
    if isinstance(where, str):
        try:
            made = tempfile.mkdtemp(prefix="s", dir=where)
            fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            _release_staging(filesystem)
        else:
            shown = os.readlink(f"/proc/self/fd/{fd}")
            return _Staging(f"/proc/self/fd/{fd}", shown, fd, where, os.path.basename(made))
    made = tempfile.mkdtemp(prefix="agentvfs-staging-")
    return _Staging(made, made)


def notify_kernel(parent: int | None, name: str | None, ino: int | None) -> None:
    """Make the kernel forget the entry ``name`` of directory ``parent`` and the cached
    attributes and pages of inode ``ino`` (either may be None). Blocking: never call it on the
    FUSE thread."""
    with contextlib.suppress(OSError):  # the kernel no longer knows it: nothing to forget
        if parent is not None and name is not None:
            pyfuse3.invalidate_entry(parent, os.fsencode(name))
        if ino is not None:
            pyfuse3.invalidate_inode(ino, attr_only=False)


def _release_staging(filesystem: WorkspaceFilesystem) -> None:
    release = getattr(filesystem, "local_staging_release", None)
    if callable(release):
        release()


def _on_local_disk(filesystem: WorkspaceFilesystem) -> bool:
    return isinstance(filesystem, SupportsLocalFiles)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


def _stream_done(stream: _Stream) -> bool:
    return stream.broken or stream.closing


def _has_stage(node: Node) -> bool:
    return node.stage is not None


def _is_dirty(node: Node) -> bool:
    return node.dirty


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


class _PartLayout:
    """Where the read-ahead parts of a file begin and end.

    The first parts are small and double in size (1, 2, 4, 8 MiB...) up to ``part_size``:
    the first bytes of a file arrive after a small request, while a long read soon moves in
    full-size parts.
    """

    __slots__ = ("_ramp_starts", "part_size", "ramp_end")

    def __init__(self, part_size: int, first: int = 1024 * 1024) -> None:
        self.part_size = part_size
        starts = [0]
        size = min(first, part_size)
        while size < part_size:
            starts.append(starts[-1] + size)
            size *= 2
        self._ramp_starts = starts
        self.ramp_end = starts[-1]

    def index_of(self, offset: int) -> int:
        if offset >= self.ramp_end:
            return len(self._ramp_starts) - 1 + (offset - self.ramp_end) // self.part_size
        return bisect.bisect_right(self._ramp_starts, offset) - 1

    def bounds(self, index: int) -> tuple[int, int]:
        ramp = len(self._ramp_starts) - 1
        if index < ramp:
            return self._ramp_starts[index], self._ramp_starts[index + 1]
        start = self.ramp_end + (index - ramp) * self.part_size
        return start, start + self.part_size


class _Part:
    """One prefetched range of a file."""

    __slots__ = ("buffer", "data", "done", "dropped", "error", "pins", "size")

    def __init__(self, size: int, buffer: bytearray) -> None:
        self.size = size
        #: Where the range lands; ``data`` is the part of it that was read.
        self.buffer = buffer
        self.data: memoryview | None = None
        self.error: BaseException | None = None
        self.done = trio.Event()
        #: Dropped from its handle; the buffer goes back to the pool once the fetch has
        #: finished and no reader holds it.
        self.dropped = False
        self.pins = 0


class _Buffers:
    """Buffers of ``part_size`` bytes kept for the next parts.

    A fresh 16 MiB buffer costs 4,096 page faults (each a zeroed page) as the socket's bytes
    land in it: a fifth of the mount's samples in a perf profile of a sequential read from S3.
    Reused buffers are already mapped. At most ``keep`` wait here, within ``read_cache_bytes``
    together with the parts in use, and none once no read holds parts (see
    ``MountOperations._release_part``).
    """

    __slots__ = ("free", "keep", "size")

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self.free: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        # Only full parts are pooled: the smaller ones of the ramp would hold a full buffer
        # for a few MiB of data.
        if size == self.size and self.free:
            return self.free.pop()
        return bytearray(size)

    def give(self, buffer: bytearray, budget: int) -> None:
        """Keep ``buffer`` if the free ones stay within ``budget`` bytes."""
        if len(buffer) == self.size and len(self.free) < self.keep and (len(self.free) + 1) * self.size <= budget:
            self.free.append(buffer)


class _Stream:
    """A streamed upload of a file being written in order: a pump sends the staged bytes in
    parts while the writer goes on; the staged copy stays the source of truth, so a broken
    stream only means the file is uploaded whole at close instead."""

    __slots__ = ("broken", "closing", "lock", "read_to", "sent", "upload", "wake")

    def __init__(self, upload: UploadStream) -> None:
        self.upload = upload
        self.sent = 0
        #: End of the staged bytes read for sending, sent or still in flight: a write below
        #: it changes bytes the upload already holds.
        self.read_to = 0
        self.broken = False
        self.closing = False
        self.lock = trio.Lock()
        self.wake = trio.Event()


class _Handle:
    """An open file: its node, its access mode and its read-ahead state."""

    __slots__ = (
        "append", "fd", "fd_state", "next_offset", "node", "parts", "passthrough", "path", "sequential", "windows",
        "writable",
    )  # fmt: skip

    def __init__(self, node: Node, *, writable: bool, append: bool) -> None:
        self.node = node
        self.writable = writable
        self.append = append
        self.parts: dict[int, _Part] = {}
        #: Aligned windows fetched for random reads, least recently used first.
        self.windows: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.next_offset = 0
        self.sequential = 0
        self.path = ""
        #: A descriptor of the file itself where storage is local disk (read directly), and
        #: the node's (write_seq, version) it was opened at.
        self.fd = -1
        self.fd_state = (0, 0)
        #: Served by the kernel from the node's backing file (FUSE passthrough).
        self.passthrough = False


class MountOperations(pyfuse3.Operations):
    """pyfuse3 operations over a workspace filesystem; see ``docs/mount-semantics.md``."""

    supports_dot_lookup = False

    def __init__(self, filesystem: WorkspaceFilesystem, options: MountOptions, *, read_only: bool) -> None:
        super().__init__()
        self.fs = filesystem
        self.options = options
        self.read_only = read_only
        self.enable_writeback_cache = options.writeback_cache and not read_only
        self._ttl = options.metadata_ttl
        self._next_ino = pyfuse3.ROOT_INODE + 1
        self._next_fh = 1
        root = Node(
            pyfuse3.ROOT_INODE, _S_IFDIR, options.dir_mode, uid=options.uid, gid=options.gid, stored=True
        )
        self.root = root
        self.started_ns = root.mtime
        self.inodes: dict[int, Node] = {root.ino: root}
        self.handles: dict[int, _Handle] = {}
        self.dir_handles: dict[int, list[tuple[str, Node]]] = {}
        self._own_staging = options.staging_dir is None
        if options.staging_dir is None:
            self._staging = _default_staging(filesystem)
        else:
            self._staging = _Staging(options.staging_dir, options.staging_dir)
            os.makedirs(options.staging_dir, exist_ok=True)
        #: Where staged copies live (a ``/proc/self/fd`` path when held by descriptor).
        self.staging_dir = self._staging.path
        #: The same place as a plain path, for messages.
        self.staging_shown = self._staging.shown
        self._stage_names = itertools.count()
        self.staged_bytes = 0
        self.read_cache_used = 0
        self.nursery: trio.Nursery | None = None
        self.thread_id: int | None = None
        self._fetch_limit = trio.CapacityLimiter(16)
        self._layout = _PartLayout(options.part_size)
        self._buffers = _Buffers(options.part_size, keep=options.prefetch_parts + 2)
        self.failed_uploads: dict[str, str] = {}
        self.atomic_rename = filesystem.capabilities.atomic_rename
        #: FUSE passthrough, asked for at mount time where files are on local disk; used once
        #: the kernel has granted it (see ``passthrough_granted``).
        self.passthrough = (
            _passthrough.LIBRARY
            if options.passthrough
            and not self.enable_writeback_cache
            and _on_local_disk(filesystem)
            else None
        )
        self._passthrough_on = False
        self._backing_lib = self.passthrough

    # -- helpers: paths, nodes, attributes -----------------------------------------------

    def path_of(self, node: Node) -> str:
        """The storage path of a node (its first name), ``""`` for the root."""
        parts: list[str] = []
        current = node
        while current is not self.root:
            if not current.links:
                raise _fail(errno.ENOENT)
            parent, name = current.links[0]
            parts.append(name)
            current = parent
        return "/".join(reversed(parts))

    def _child_path(self, parent: Node, name: str) -> str:
        base = self.path_of(parent)
        return f"{base}/{name}" if base else name

    def _node(self, ino: int) -> Node:
        node = self.inodes.get(ino)
        if node is None:
            raise _fail(errno.ENOENT)
        return node

    def _new_node(self, kind: int, perm: int, **kwargs: Any) -> Node:
        node = Node(self._next_ino, kind, perm, **kwargs)
        self._next_ino += 1
        self.inodes[node.ino] = node
        return node

    def _from_stat(self, st: FileStat, parent: Node, name: str) -> Node:
        is_dir = st.type == "directory"
        kind = _S_IFDIR if is_dir else _S_IFREG
        default = self.options.dir_mode if is_dir else self.options.file_mode
        node = self._new_node(
            kind,
            st.mode if st.mode is not None else default,
            uid=self.options.uid,
            gid=self.options.gid,
            size=0 if is_dir else st.size,
            # Storage without directory times (prefixes, memory) shows the mount's start time.
            mtime=_ns(st.modified_at) or self.started_ns,
            stored=True,
            etag=st.etag,
        )
        node.links.append((parent, name))
        return node

    def attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        if node.pt_writers:
            self._sync_backing(node)  # written by the kernel, unseen here
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
            started = time.monotonic()
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
                        stats.append(await self.fs.stat(self._child_path(directory, name)))
                    except (FileNotFoundError, NotADirectoryError):
                        continue
            self._reconcile(directory, stats)
            directory.listed_at = started
        return directory.children or {}

    def _reconcile(self, directory: Node, stats: list[FileStat]) -> None:
        old: dict[str, Node] = directory.children or {}
        fresh: dict[str, Node] = {}
        for st in stats:
            name = st.name
            node = old.get(name)
            is_dir = st.type == "directory"
            if node is not None and (not node.stored or node.dirty):
                fresh[name] = node  # the mount holds newer state than the listing
            elif node is not None and node.is_dir == is_dir and node.kind in (_S_IFDIR, _S_IFREG):
                fresh[name] = node if is_dir else self._refresh_file(node, st)
            else:
                if node is not None:
                    self._drop_link(node, directory, name)
                fresh[name] = self._from_stat(st, directory, name)
        for name, node in old.items():
            if name in fresh:
                continue
            if node.stored and not node.dirty:
                # Deleted in storage by someone else.
                self._drop_link(node, directory, name)
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
        if node.dirty or node.writers:
            return node
        if node.etag is None and st.size == node.size:
            node.etag = st.etag  # our own upload, now with the version storage gave it
            return node
        if st.etag == node.etag and st.size == node.size:
            return node
        if len(node.links) != 1:
            node.etag, node.size = st.etag, st.size
            node.mtime = node.ctime = _ns(st.modified_at)
            node.version += 1
            self._invalidate_later(None, None, node.ino)
            return node
        parent, name = node.links[0]
        fresh = self._from_stat(st, parent, name)
        fresh.perm, fresh.uid, fresh.gid = node.perm, node.uid, node.gid
        assert parent.children is not None
        parent.children[name] = fresh
        node.links = []
        self._invalidate_later(parent.ino, name, None)
        return fresh

    def _drop_link(self, node: Node, directory: Node, name: str) -> None:
        node.links = [(d, n) for d, n in node.links if not (d is directory and n == name)]
        if node.is_dir and node.children is not None and not node.links:
            node.children = {}

    def _invalidate_later(self, parent: int | None, name: str | None, ino: int | None) -> None:
        """Tell the kernel to forget a name or a file's cached pages, off this thread: the
        notification can block while the kernel waits on requests this thread serves."""
        if self.nursery is None:
            return

        async def run() -> None:
            await trio.to_thread.run_sync(notify_kernel, parent, name, ino)

        self.nursery.start_soon(run)

    # -- staging ----------------------------------------------------------------------------

    def _reserve(self, node: Node, new_size: int) -> None:
        grow = new_size - node.staged_bytes
        if grow <= 0:
            return
        if new_size > self.options.staging_limit:
            # One file larger than the whole staging area can never be written.
            raise _fail(errno.EFBIG)
        if self.staged_bytes + grow > self.options.staging_limit:
            _log.warning(
                "staging area full (%d of %d bytes): write to %s refused with ENOSPC",
                self.staged_bytes, self.options.staging_limit, self._safe_path(node),
            )
            raise _fail(errno.ENOSPC)
        self.staged_bytes += grow
        node.staged_bytes = new_size

    def _safe_path(self, node: Node) -> str:
        try:
            return "/" + self.path_of(node)
        except pyfuse3.FUSEError:
            return f"<unlinked inode {node.ino}>"

    def _new_stage_file(self) -> tuple[int, str]:
        """A new, empty, private file in the staging directory.

        Names come from a counter: ``tempfile.mkstemp`` draws random names and was most of
        the time a ``create`` took.
        """
        while True:
            path = os.path.join(self.staging_dir, f"stage-{os.getpid()}-{next(self._stage_names)}")
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                return os.open(path, flags, 0o600), path
            except FileExistsError:
                continue  # left by an earlier mount that shared this staging directory

    async def _materialize(self, node: Node, *, truncate_to: int | None = None) -> None:
        """Give a file a staged local copy holding its content (or its first
        ``truncate_to`` bytes), so it can be written anywhere."""
        if node.stage is not None:
            return
        async with node.lock:
            if _has_stage(node):
                return  # staged by a concurrent request while this one waited
            fd, path = self._new_stage_file()
            # Publishing may link this very file into place (local disk): give it the file's
            # permission bits rather than 0600.
            os.fchmod(fd, node.perm & 0o777)
            try:
                keep = node.size if truncate_to is None else min(truncate_to, node.size)
                if node.stored and keep > 0:
                    self._reserve(node, node.size)
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
                self._release_stage_bytes(node)
                raise
            node.stage, node.stage_fd = path, fd
            self._release_stage_bytes(node)
            self._reserve(node, node.size)

    def _own_stage(self, node: Node) -> None:
        """Before changing a staged copy: if publishing linked it into storage (local disk),
        copy it first, so storage only ever changes by the next atomic publish."""
        if node.stage is None or os.fstat(node.stage_fd).st_nlink <= 1:
            return
        fd, path = self._new_stage_file()
        os.fchmod(fd, node.perm & 0o777)
        try:
            # O_NOFOLLOW: a staging area beside the files may be within someone else's reach.
            source = os.open(node.stage, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with open(source, "rb") as src, open(fd, "wb", closefd=False) as dest:
                shutil.copyfileobj(src, dest, 1024 * 1024)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(node.stage_fd)
        os.unlink(node.stage)
        node.stage, node.stage_fd = path, fd

    def _release_stage_bytes(self, node: Node) -> None:
        self.staged_bytes -= node.staged_bytes
        node.staged_bytes = 0

    def _drop_stage(self, node: Node) -> None:
        if node.stage is None:
            return
        os.close(node.stage_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(node.stage)
        node.stage, node.stage_fd = None, -1
        self._release_stage_bytes(node)

    async def commit(self, node: Node) -> None:
        """Upload a dirty file to every name it has; ``EIO`` (logged with the path) if storage
        refuses. The staged copy is kept on failure, so nothing is lost and a later
        ``fsync``, ``close`` or unmount tries again."""
        if not node.dirty or node.stage is None:
            return
        async with node.lock:
            if not _is_dirty(node):
                return  # uploaded by a concurrent request while this one waited
            if not node.links:
                node.dirty = False  # unlinked while open: nothing to publish
                return
            seq = node.write_seq
            node.fresh = False
            if node.stream is None or not await self._finish_stream(node):
                for path in [self._child_path(parent, name) for parent, name in node.links]:
                    try:
                        await upload_file(self.fs, node.stage, path)
                    except Exception as exc:
                        self.failed_uploads["/" + path] = str(exc)
                        _log.error("upload of /%s failed, kept staged at %s: %s", path, node.stage, exc)
                        raise _fail(errno.EIO) from None
                    self.failed_uploads.pop("/" + path, None)
            node.stored = True
            node.etag = None
            node.checked_at = time.monotonic()
            if node.write_seq == seq:
                node.dirty = False

    # -- streamed uploads ------------------------------------------------------------------

    async def _maybe_stream(self, node: Node) -> None:
        """Start uploading a file that is being written from empty, in order, once it has
        grown past ``stream_threshold``."""
        if (
            not node.fresh
            or node.size < self.options.stream_threshold
            or len(node.links) != 1
            or not isinstance(self.fs, SupportsStreamingUpload)
            or self.nursery is None
        ):
            return
        node.fresh = False  # one attempt per fresh write
        path = self.path_of(node)
        try:
            upload = await self.fs.open_upload(path, part_size=self.options.stream_part_size)
        except Exception as exc:
            _log.warning("streamed upload of /%s not started (%s); it is uploaded at close", path, exc)
            return
        if upload is None:
            return
        stream = _Stream(upload)
        node.stream = stream
        self.nursery.start_soon(self._pump, node, stream)

    async def _pump(self, node: Node, stream: _Stream) -> None:
        part = self.options.stream_part_size
        try:
            while not stream.broken and not stream.closing:
                if node.size - stream.sent >= part and node.stage is not None:
                    async with stream.lock:
                        if _stream_done(stream):
                            break  # closed or broken while this waited for the lock
                        stream.read_to = stream.sent + part  # before the read: a write may race it
                        data = await trio.to_thread.run_sync(os.pread, node.stage_fd, part, stream.sent)
                        await stream.upload.write(data)
                        stream.sent += len(data)
                else:
                    stream.wake = trio.Event()
                    await stream.wake.wait()
        except Exception as exc:
            stream.broken = True
            _log.warning("streamed upload of %s failed (%s); it is uploaded whole at close", self._safe_path(node), exc)

    async def _finish_stream(self, node: Node) -> bool:
        """Send what is left and complete the streamed upload; False if the file must be
        uploaded whole instead (the stream broke, or completing it failed)."""
        stream = node.stream
        node.stream = None
        assert isinstance(stream, _Stream)
        stream.closing = True
        stream.wake.set()
        part = self.options.stream_part_size
        async with stream.lock:
            if not stream.broken and node.stage is not None:
                try:
                    while stream.sent < node.size:
                        size = min(part, node.size - stream.sent)
                        stream.read_to = stream.sent + size
                        data = await trio.to_thread.run_sync(os.pread, node.stage_fd, size, stream.sent)
                        await stream.upload.write(data)
                        stream.sent += len(data)
                    await stream.upload.commit()
                    return True
                except Exception as exc:
                    _log.warning("streamed upload of %s failed at close (%s); uploading it whole", self._safe_path(node), exc)
            await stream.upload.abort()
        return False

    def _break_stream(self, node: Node) -> None:
        """The file stopped being a plain in-order write (overwrite, truncate, rename...):
        drop the streamed upload; the staged copy is uploaded whole instead."""
        node.fresh = False
        stream = node.stream
        if stream is None:
            return
        node.stream = None
        assert isinstance(stream, _Stream)
        stream.broken = True
        stream.wake.set()

        async def abort() -> None:
            async with stream.lock:
                await stream.upload.abort()

        if self.nursery is not None:
            self.nursery.start_soon(abort)

    async def drain(self) -> dict[str, str]:
        """Upload every dirty file (used before unmounting); returns the failures."""
        for node in list(self.inodes.values()):
            if node.dirty:
                with contextlib.suppress(pyfuse3.FUSEError):
                    await self.commit(node)
        return dict(self.failed_uploads)

    def close_staging(self) -> None:
        """Drop staged copies of clean files; remove the staging area if it is ours and empty."""
        for node in self.inodes.values():
            if node.backing_fd >= 0:
                os.close(node.backing_fd)  # the session is gone, and its backing ids with it
                node.backing_fd, node.backing_id = -1, 0
            if not node.dirty:
                self._drop_stage(node)
        if self._own_staging:
            # Dirty copies remain when an upload failed: never delete data that did not
            # reach storage (rmdir fails on a non-empty directory).
            staging, self._staging = self._staging, _Staging(self._staging.shown, self._staging.shown)
            self._own_staging = False  # once: the descriptor is gone after this
            with contextlib.suppress(OSError):
                if staging.fd >= 0:
                    # By name in the directory it was made in (itself held by descriptor).
                    os.close(staging.fd)
                    try:
                        os.rmdir(os.path.join(staging.parent, staging.name))
                    finally:
                        _release_staging(self.fs)
                else:
                    os.rmdir(staging.path)

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
        directory = self._node(parent_inode)
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
        node = self._node(inode)
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
        try:
            st = await self.fs.stat(self.path_of(node))
        except FileNotFoundError:
            node.checked_at = time.monotonic()
            parent.listed_at = 0.0  # the next lookup lists again and drops it
            return
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
        node = self._node(inode)
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
            await self._materialize(node, truncate_to=size)
            self._own_stage(node)
            if node.stream is not None and size < node.stream.read_to:
                self._break_stream(node)
            elif size == 0:
                self._break_stream(node)
                node.fresh = len(node.links) == 1
            self._reserve(node, size)
            os.ftruncate(node.stage_fd, size)
            # POSIX: a successful truncate marks the file changed even at the same size.
            node.size = size
            node.dirty = True
            node.write_seq += 1
            node.touch()
            if not node.writers:
                # truncate(2) without an open file: it is done when the call returns.
                await self.commit(node)
                if not node.opens:
                    self._drop_stage(node)
        if fields.update_mode:
            node.perm = attr.st_mode & 0o7777
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_atime:
            node.atime = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime = attr.st_mtime_ns
        if (fields.update_atime or fields.update_mtime) and node.backing_fd >= 0 and node.backing_writable:
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
        node = self._node(inode)
        if node.kind != _S_IFLNK or node.target is None:
            raise _fail(errno.EINVAL)
        return node.target

    @_fuse_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
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
                self._drop_stage(node)
                del self.inodes[ino]

    @_fuse_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        out = pyfuse3.StatvfsData()
        local = os.statvfs(self.staging_dir)
        out.f_bsize = 4096
        out.f_frsize = 4096
        # Storage has no fixed size: report the staging budget still free as the free space,
        # since that is what bounds a write through the mount; with passthrough, writes go to
        # the disk holding the files (the staging area sits on it), and its free space does.
        free = local.f_bavail * local.f_frsize
        if not self.passthrough_granted():
            free = min(free, max(0, self.options.staging_limit - self.staged_bytes))
        out.f_blocks = max(free, 1 << 40) // 4096
        out.f_bfree = free // 4096
        out.f_bavail = free // 4096
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
        directory = self._node(parent_inode)
        text = self._name(name)
        node = (await self._children(directory)).get(text)
        if node is None:
            raise _fail(errno.ENOENT)
        return directory, text, node

    async def _new_name(self, parent_inode: int, name: bytes) -> tuple[Node, str]:
        """The directory and checked name for something about to be created there."""
        self._check_writable()
        directory = self._node(parent_inode)
        text = self._name(name)
        await self._free_name(directory, text)
        return directory, text

    def _add_link(self, directory: Node, name: str, node: Node) -> None:
        assert directory.children is not None
        directory.children[name] = node
        node.links.append((directory, name))
        directory.touch()

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        directory, text = await self._new_name(parent_inode, name)
        path = self._child_path(directory, text)
        await self.fs.mkdir(path, recursive=False)
        uid, gid = self._owner(directory, ctx)
        perm = mode & 0o7777
        if directory.perm & stat_module.S_ISGID:
            perm |= stat_module.S_ISGID
        node = self._new_node(_S_IFDIR, perm, uid=uid, gid=gid, stored=True)
        node.listed_at = time.monotonic()  # new and empty: nothing to list
        self._add_link(directory, text, node)
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
            self._drop_stage(node)
            return self._entry(node)
        # FIFOs, sockets and device nodes exist in the mount only (storage has no such thing).
        node = self._new_node(kind, mode, uid=uid, gid=gid, rdev=rdev)
        self._add_link(directory, text, node)
        return self._entry(node)

    @_fuse_errors
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        directory, text = await self._new_name(parent_inode, name)
        uid, gid = self._owner(directory, ctx)
        node = self._new_node(_S_IFLNK, 0o777, uid=uid, gid=gid, size=len(target), target=bytes(target))
        self._add_link(directory, text, node)
        return self._entry(node)

    @_fuse_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self._check_writable()
        node = self._node(inode)
        if node.is_dir:
            raise _fail(errno.EPERM)
        directory = self._node(new_parent_inode)
        text = self._name(new_name)
        await self._free_name(directory, text)
        if node.is_file:
            # Storage keeps a copy under each name; writes through any name update them all.
            self._break_stream(node)
            await self.commit(node)
            target = self._child_path(directory, text)
            if node.stored and node.links:
                await self.fs.copy_file(self.path_of(node), target)
            elif node.stage is not None:
                await upload_file(self.fs, node.stage, target)
        self._add_link(directory, text, node)
        node.touch(content=False)
        return self._entry(node)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        directory, text, node = await self._existing_name(parent_inode, name)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        await self._remove_name(directory, text, node)

    async def _remove_name(self, directory: Node, name: str, node: Node) -> None:
        self._break_stream(node)
        if node.is_file and node.stored:
            if node.opens and node.stage is None and node.backing_fd < 0 and len(node.links) == 1:
                # Open descriptors keep working after the last name goes: keep a copy.
                await self._materialize(node)
            path = self._child_path(directory, name)
            if not self._unlink_on_disk(path):
                await self.fs.delete_file(path, force=True)
        assert directory.children is not None
        directory.children.pop(name, None)
        self._drop_link(node, directory, name)
        directory.touch()
        node.touch(content=False)
        if not node.links:
            node.dirty = False
            if not node.opens:
                self._drop_stage(node)

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
            await self.fs.rmdir(self._child_path(directory, name), force=True)
        assert directory.children is not None
        directory.children.pop(name, None)
        self._drop_link(node, directory, name)
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
        old_dir = self._node(parent_inode_old)
        new_dir = self._node(parent_inode_new)
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
        old_path = self._child_path(old_dir, old_name)
        new_path = self._child_path(new_dir, new_name)
        if node.is_dir:
            await self._rename_dir(node, old_path, new_path, target)
        elif node.is_file:
            await self._rename_file(node, old_path, new_path, target)
        elif target is not None and target.is_file and target.stored:
            # A mount-only node (symlink, FIFO...) replaces a stored file: the file goes.
            await self.fs.delete_file(new_path, force=True)
        if target is not None:
            assert new_dir.children is not None
            new_dir.children.pop(new_name, None)
            self._drop_link(target, new_dir, new_name)
            target.touch(content=False)
            if not target.links:
                target.dirty = False
                if not target.opens:
                    self._drop_stage(target)
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
        self._break_stream(node)
        if target is not None:
            self._break_stream(target)
        if (
            target is not None
            and target.is_file
            and target.opens
            and target.stage is None
            and target.backing_fd < 0
            and len(target.links) == 1
        ):
            await self._materialize(target)  # its open descriptors keep their data
        if node.dirty and node.stage is not None:
            # Publish the staged content under the new name, then drop the old one.
            async with node.lock:
                await upload_file(self.fs, node.stage, new_path)
                if node.stored:
                    await self.fs.delete_file(old_path, force=True)
            node.stored = True
            return
        if node.stored:
            await self.fs.move_file(old_path, new_path, overwrite=True)
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
        node = self._new_node(_S_IFREG, mode, uid=uid, gid=gid)
        self._add_link(directory, name, node)
        await self._materialize(node, truncate_to=0)
        node.dirty = True
        node.fresh = True
        node.write_seq += 1
        return node

    def _open_handle(self, node: Node, flags: int) -> int:
        accmode = flags & os.O_ACCMODE
        writable = accmode in (os.O_WRONLY, os.O_RDWR)
        handle = _Handle(node, writable=writable, append=bool(flags & os.O_APPEND))
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
        directory = self._node(parent_inode)
        text = self._name(name)
        children = await self._children(directory)
        existing = children.get(text)
        if existing is not None:
            if flags & os.O_EXCL:
                raise _fail(errno.EEXIST)
            info = await self._open(existing, flags)
            return info, self._entry(existing)
        uid, gid = self._owner(directory, ctx)
        if self.passthrough_granted():
            created = await self._create_passthrough(directory, text, mode, flags, uid, gid)
            if created is not None:
                return created[0], self._entry(created[1])
        node = await self._create_file(directory, text, mode, uid, gid)
        fh = self._open_handle(node, flags)
        info = pyfuse3.FileInfo(fh=fh, keep_cache=True)
        node.kernel_version = node.version
        return info, self._entry(node)

    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return await self._open(self._node(inode), flags)

    async def _open(self, node: Node, flags: int) -> pyfuse3.FileInfo:
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
        if self._passes_through(node):
            info = self._open_passthrough(node, flags, truncate=truncate)
            if info is not None:
                return info
        if truncate:
            await self._materialize(node, truncate_to=0)
            self._own_stage(node)
            self._break_stream(node)
            if node.size:
                os.ftruncate(node.stage_fd, 0)
                node.size = 0
            node.fresh = len(node.links) == 1
            node.dirty = True
            node.write_seq += 1
            node.touch()
        fh = self._open_handle(node, flags)
        handle = self.handles[fh]
        handle.path = self._safe_path(node)
        if node.stage is None and node.stored and node.links:
            handle.fd = self._open_local(node)
            handle.fd_state = (node.write_seq, node.version)
        # Keep the kernel's cached pages only while the content is the one they came from.
        keep = node.kernel_version == node.version
        node.kernel_version = node.version
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    def _open_local(self, node: Node) -> int:
        """A descriptor of the stored file on local disk, or -1: reads then go straight to
        it (the kernel's own read-ahead streams it) instead of through ranged reads."""
        if not isinstance(self.fs, SupportsLocalFiles):
            return -1
        try:
            return self.fs.local_open(self.path_of(node), os.O_RDONLY)
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

    def _attach_backing(self, node: Node, fd: int = -1) -> bool:
        """Open ``node``'s file on disk (or take ``fd``, opened read-write) and register it
        with the kernel as the backing file of the inode. False, holding nothing, when that
        is not possible: the open is then served through the mount as usual."""
        assert self.passthrough is not None
        writable = True
        if fd < 0:
            writable = not self.read_only
            if not isinstance(self.fs, SupportsLocalFiles):
                return False
            try:
                path = self.path_of(node)
                try:
                    fd = self.fs.local_open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
                except PermissionError:
                    if not writable:
                        raise
                    writable = False  # a file this process may only read: readers pass through
                    fd = self.fs.local_open(path, os.O_RDONLY | os.O_NOFOLLOW)
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
        if not isinstance(self.fs, SupportsLocalFiles):
            return None
        try:
            fd = self.fs.local_open(
                self._child_path(directory, name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
        except (OSError, pyfuse3.FUSEError):
            return None
        with contextlib.suppress(OSError):
            os.fchmod(fd, mode & 0o777)
        node = self._new_node(_S_IFREG, mode, uid=uid, gid=gid, stored=True)
        self._add_link(directory, name, node)
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
        if not self.passthrough_granted() or not isinstance(self.fs, SupportsLocalFiles):
            return False
        try:
            self.fs.local_unlink(path)
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
            await self.fs.copy_file(first, self._child_path(parent, name))

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
        # A memoryview of a prefetched part avoids a copy; pyfuse3 takes any buffer.
        return cast(bytes, await self._read_remote(handle, off, end))

    async def _read_remote(self, handle: _Handle, off: int, end: int) -> Any:
        node = handle.node
        part_size = self.options.part_size
        sequential = off == handle.next_offset
        handle.sequential = handle.sequential + 1 if sequential else 0
        handle.next_offset = end
        # A file replaced in storage while open keeps reading under the name it was opened by.
        path = self.path_of(node) if node.links else handle.path.lstrip("/")
        width = self.options.random_read_size
        if handle.windows and all(i in handle.windows for i in range(off // width, (end - 1) // width + 1)):
            # Within windows a random read fetched: the kernel splits one read into several
            # requests, and the rest of the window is what the next requests ask for.
            return await self._read_windows(handle, path, off, end)
        if not sequential and off != 0 and end - off <= part_size:
            self._drop_parts(handle, keep_from=None)
            if width <= 0:
                return await read_range(self.fs, path, off, end)  # windows off: exact ranges
            return await self._read_windows(handle, path, off, end)
        parts = self._layout
        first, last = parts.index_of(off), parts.index_of(end - 1)
        ahead = min(self.options.prefetch_parts, 1 + handle.sequential)
        for index in range(first, last + 1 + ahead):
            start, stop = parts.bounds(index)
            if start >= node.size:
                break
            if index not in handle.parts:
                if index > last and self.read_cache_used + (stop - start) > self.options.read_cache_bytes:
                    break  # read-ahead waits for memory; the bytes asked for never do
                self._start_part(handle, path, index, start, min(node.size, stop))
        self._drop_parts(handle, keep_from=first)
        wanted = [(index, handle.parts[index]) for index in range(first, last + 1)]
        # Pinned while this read waits and slices: another read of the handle may drop a
        # part meanwhile, and its buffer must not be refilled under this one.
        for _, part in wanted:
            part.pins += 1
        try:
            for index, part in wanted:
                await part.done.wait()
                if part.error is not None:
                    if handle.parts.get(index) is part:
                        self._forget_part(handle, index)
                    raise part.error
            pieces: list[Any] = []
            for index, part in wanted:
                assert part.data is not None
                base = parts.bounds(index)[0]
                lo = max(off, base) - base
                hi = min(end, base + len(part.data)) - base
                pieces.append(part.data[lo:hi])
            # A view is safe to hand out after the pins go: pyfuse3 copies it into the reply
            # before this thread runs any other task, and only tasks refill buffers.
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        finally:
            for _, part in wanted:
                part.pins -= 1
                self._release_part(part)

    async def _read_windows(self, handle: _Handle, path: str, off: int, end: int) -> Any:
        """A random read: the aligned window(s) of ``random_read_size`` around it, kept for
        the handle's next reads (LRU, within ``read_cache_bytes``).

        Exact ranges cost a request each, and a request costs the same for 4 KiB as for
        1 MiB on most servers; a window turns scattered reads of one region (a database,
        an archive's index, fio's randread) into memory hits after the first, while a read
        of a huge file still fetches only one window, not a part.
        """
        size = handle.node.size
        width = self.options.random_read_size
        first, last = off // width, (end - 1) // width
        missing = [i for i in range(first, last + 1) if i not in handle.windows]
        need = sum(min(size, (i + 1) * width) - i * width for i in missing)
        while handle.windows and self.read_cache_used + need > self.options.read_cache_bytes:
            _, old = handle.windows.popitem(last=False)
            self.read_cache_used -= len(old)
        if self.read_cache_used + need > self.options.read_cache_bytes:
            # No memory left for windows (read-ahead of other handles holds it): the bytes
            # asked for, uncached.
            return await read_range(self.fs, path, off, end)
        if missing:
            fetched: dict[int, bytes] = {}

            async def fetch(i: int) -> None:
                async with self._fetch_limit:
                    fetched[i] = await read_range(self.fs, path, i * width, min(size, (i + 1) * width))

            async with trio.open_nursery() as nursery:
                for i in missing:
                    nursery.start_soon(fetch, i)
            for i in missing:
                handle.windows[i] = fetched[i]
                self.read_cache_used += len(fetched[i])
        pieces: list[Any] = []
        for i in range(first, last + 1):
            handle.windows.move_to_end(i)
            data = handle.windows[i]
            base = i * width
            pieces.append(memoryview(data)[max(off, base) - base : min(end, base + len(data)) - base])
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def _start_part(self, handle: _Handle, path: str, index: int, start: int, end: int) -> None:
        part = _Part(end - start, self._buffers.take(end - start))
        handle.parts[index] = part
        self.read_cache_used += part.size
        assert self.nursery is not None

        async def fetch() -> None:
            try:
                async with self._fetch_limit:
                    view = memoryview(part.buffer)[: part.size]
                    part.data = view[: await read_range_into(self.fs, path, start, view)]
            except BaseException as exc:  # handed to the reader that waits for this part
                part.error = exc if isinstance(exc, Exception) else OSError(errno.EIO, "read cancelled")
                if not isinstance(exc, Exception):
                    # Cancelled: the worker thread may still be writing into the buffer, so
                    # it is never reused.
                    part.buffer = bytearray()
                    part.done.set()
                    raise
            finally:
                part.done.set()
                self._release_part(part)

        self.nursery.start_soon(fetch)

    def _forget_part(self, handle: _Handle, index: int) -> None:
        part = handle.parts.pop(index)
        self.read_cache_used -= part.size
        part.dropped = True
        self._release_part(part)

    def _release_part(self, part: _Part) -> None:
        """Give a dropped part's buffer back once its fetch is over and no read holds it."""
        if part.dropped and part.done.is_set() and not part.pins and part.buffer:
            buffer, part.buffer, part.data = part.buffer, bytearray(), None
            self._buffers.give(buffer, self.options.read_cache_bytes - self.read_cache_used)
        if not self.read_cache_used:
            self._buffers.free.clear()  # nothing is being read: the memory goes back

    def _drop_parts(self, handle: _Handle, keep_from: int | None) -> None:
        for index in list(handle.parts):
            if keep_from is None or index < keep_from:
                self._forget_part(handle, index)

    def _drop_windows(self, handle: _Handle) -> None:
        self.read_cache_used -= sum(len(w) for w in handle.windows.values())
        handle.windows.clear()

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        self._check_writable()
        node = handle.node
        if handle.passthrough:
            return os.pwrite(node.backing_fd, buf, node.size if handle.append else off)
        await self._materialize(node)
        self._own_stage(node)
        if handle.append and not self.enable_writeback_cache:
            off = node.size
        end = off + len(buf)
        if end > node.staged_bytes:
            self._reserve(node, end)
        if off != node.size and (node.fresh or node.stream is not None):
            stream = node.stream
            # Below read_to, not sent: a part read for sending but still in flight holds the
            # old bytes, and completing the upload with it would lose this write.
            if stream is None or off < stream.read_to or off > node.size:
                self._break_stream(node)  # no longer a plain in-order write
        written = os.pwrite(node.stage_fd, buf, off)
        if end > node.size:
            node.size = end
        node.dirty = True
        node.write_seq += 1
        node.touch()
        if node.stream is not None:
            node.stream.wake.set()
        elif node.fresh:
            await self._maybe_stream(node)
        return written

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        handle = self.handles.get(fh)
        if handle is None:
            raise _fail(errno.EBADF)
        if handle.passthrough and handle.writable and len(handle.node.links) > 1:
            await self._copy_to_other_names(handle.node)
        if handle.node.dirty:
            await self.commit(handle.node)

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
        if node.stage is not None and os.fstat(node.stage_fd).st_nlink > 1:
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
        self._drop_parts(handle, keep_from=None)
        self._drop_windows(handle)
        if handle.fd >= 0:
            os.close(handle.fd)
        node.opens -= 1
        if handle.writable:
            node.writers -= 1
        if node.dirty and not node.writers:
            try:
                await self.commit(node)
            except pyfuse3.FUSEError:
                return  # logged by commit; the staged copy stays for the next attempt
        if not node.opens and not node.dirty:
            self._drop_stage(node)
            if not node.links and not node.lookups:
                self.inodes.pop(node.ino, None)

    # -- used by the server ----------------------------------------------------------------

    def set_thread(self) -> None:
        self.thread_id = threading.get_ident()
