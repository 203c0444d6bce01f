"""The mount's view of the tree: one node per inode, with the POSIX metadata the storage lacks."""

from __future__ import annotations

import stat as stat_module
import time
from typing import Any

import trio

__all__ = ["Children", "Node", "now_ns"]


class Children(dict[str, "Node"]):
    """A directory's entries that keep count of its subdirectories as they change.

    ``nlink`` of a directory (2 + subdirectories) is asked for on every getattr, and the
    kernel asks for the parent's attributes after each create or unlink in it: counting the
    entries each time made filling a directory quadratic in its size.
    """

    __slots__ = ("subdirs",)

    def __init__(self, entries: dict[str, Node] | None = None) -> None:
        super().__init__(entries or {})
        self.subdirs = sum(1 for node in self.values() if node.is_dir)

    def __setitem__(self, name: str, node: Node) -> None:
        old = self.get(name)
        if old is not None and old.is_dir:
            self.subdirs -= 1
        super().__setitem__(name, node)
        if node.is_dir:
            self.subdirs += 1

    def __delitem__(self, name: str) -> None:
        node = self[name]
        super().__delitem__(name)
        if node.is_dir:
            self.subdirs -= 1

    def pop(self, name: str, *default: Any) -> Any:
        if name not in self:
            if default:
                return default[0]
            raise KeyError(name)
        node = super().pop(name)
        if node.is_dir:
            self.subdirs -= 1
        return node

    def popitem(self) -> tuple[str, Node]:
        name, node = super().popitem()
        if node.is_dir:
            self.subdirs -= 1
        return name, node

    def clear(self) -> None:
        super().clear()
        self.subdirs = 0

    def setdefault(self, name: str, default: Node) -> Node:
        if name not in self:
            self[name] = default
        return self[name]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, node in dict(*args, **kwargs).items():
            self[name] = node


def now_ns() -> int:
    return time.time_ns()


class Node:
    """One inode of the mount.

    Regular files and directories mirror storage (``stored``). Where storage keeps them
    (local disk natively, object stores as object metadata), symlinks, FIFOs, sockets and
    device nodes are stored too, and so are the mode, owner and times of files; elsewhere
    they live here for the life of the mount. A file may have several names (hard links,
    on local disk only): ``links`` lists them as ``(directory node, name)`` pairs.
    """

    __slots__ = (
        "_children",
        "_version",
        "_write_seq",
        "atime",
        "backing_fd",
        "backing_id",
        "backing_mtime",
        "backing_writable",
        "checked_at",
        "ctime",
        "dirty",
        "disk_ino",
        "etag",
        "failed",
        "fresh",
        "gid",
        "ino",
        "keep",
        "kernel_version",
        "kind",
        "links",
        "listed_at",
        "lock",
        "lookups",
        "mtime",
        "opens",
        "perm",
        "pt_opens",
        "pt_writers",
        "pt_wrote",
        "rdev",
        "served",
        "size",
        "stage",
        "stage_fd",
        "stage_published",
        "staged_bytes",
        "stamp",
        "stored",
        "stream",
        "stream_attrs",
        "target",
        "times_stale",
        "uid",
        "writers",
        "written",
    )

    def __init__(
        self,
        ino: int,
        kind: int,
        perm: int,
        *,
        uid: int,
        gid: int,
        size: int = 0,
        mtime: int | None = None,
        stored: bool = False,
        etag: str | None = None,
        rdev: int = 0,
        target: bytes | None = None,
    ) -> None:
        t = mtime if mtime is not None else now_ns()
        self.ino = ino
        self.kind = kind
        self.perm = perm & 0o7777
        self.uid = uid
        self.gid = gid
        self.size = size
        self.atime = t
        self.mtime = t
        self.ctime = t
        self.rdev = rdev
        self.target = target
        self.stored = stored
        self.etag = etag
        #: ``(directory, name)`` of every name this node has; empty once unlinked.
        self.links: list[tuple[Node, str]] = []
        self._children: Children | None = Children() if kind == stat_module.S_IFDIR else None
        self.listed_at = 0.0 if stored else float("inf")
        self.checked_at = time.monotonic()
        self.lookups = 0
        self.opens = 0
        self.writers = 0
        #: Staged local copy (path and open descriptor) while written, or while open after
        #: its last name went away.
        self.stage: str | None = None
        self.stage_fd = -1
        #: The staged copy is the published file itself (local disk publishes it by a link):
        #: its name in the staging area is gone, so the file shows one link; the next change
        #: starts from a copy (see ``StagingStore.own``).
        self.stage_published = False
        self.staged_bytes = 0
        self.dirty = False
        #: Handles of this file whose reads the passthrough library answers from their
        #: descriptor (``Passthrough.serve``); a change of ``write_seq`` or ``version`` takes
        #: them all back, before anything reads the changed file.
        self.served: list[int] | None = None
        self._write_seq = 0
        #: Bytes were written (or the size set) since the last publish. A file only
        #: truncated by ``O_TRUNC`` is dirty but not written: a ``flush`` then publishes
        #: nothing (``cmd > f`` flushes once before its first write), the last close does.
        self.written = False
        #: Why the last upload of this file failed (reported to its writer as ``EIO``);
        #: None once one succeeds. A failed file is never uploaded again but at its writer's
        #: own request (``fsync``, ``close``): otherwise it goes to the recovery area.
        self.failed: str | None = None
        #: Changed since its times were last read: where storage has times of its own (local
        #: disk), the next reply of attributes takes them from there.
        self.times_stale = False
        #: Written from empty in this mount (created or truncated to zero), in order so far:
        #: a candidate for a streamed upload.
        self.fresh = False
        #: The streamed upload in progress, if any (owned by the mount's operations), and
        #: the attributes it was started with (object metadata stores).
        self.stream: Any = None
        self.stream_attrs: Any = None
        #: The object metadata of other tools (s3fs-fuse's, rclone's keys) last seen with
        #: this file: every rewrite carries it over.
        self.keep: dict[str, str] | None = None
        #: The inode number on local disk of a file with several names there (hard links
        #: found by a listing share one node).
        self.disk_ino: int | None = None
        #: When storage last changed the object whose attributes the mount holds (whole
        #: seconds; S3 lists no metadata: a listing that shows the same version and time needs
        #: no HEAD, a chmod elsewhere changes the time but not the version).
        self.stamp = 0
        #: Bumped when the storage content changes under the mount; the kernel's page cache
        #: is kept across opens only while it equals ``kernel_version``.
        self._version = 0
        self.kernel_version = -1
        #: FUSE passthrough: the file on disk the kernel reads and writes directly while
        #: ``pt_opens`` handles are open (one per inode, as the kernel requires), its backing
        #: id, its mtime when last looked at, and whether it was opened for writing.
        self.backing_fd = -1
        self.backing_id = 0
        self.backing_mtime = 0
        self.backing_writable = False
        self.pt_opens = 0
        self.pt_writers = 0
        #: A passthrough writer was open since the backing file was attached.
        self.pt_wrote = False
        self.lock = trio.Lock()

    @property
    def write_seq(self) -> int:
        """Bumped by every write or size change through the mount."""
        return self._write_seq

    @write_seq.setter
    def write_seq(self, value: int) -> None:
        self._write_seq = value
        if self.served:
            self.stop_serving()

    @property
    def version(self) -> int:
        """Bumped when the storage content changes under the mount."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._version = value
        if self.served:
            self.stop_serving()

    def stop_serving(self) -> None:
        """Reads of every handle of this file go through the mount's handlers again."""
        from ._helper import HELPER

        served, self.served = self.served, None
        if HELPER is not None:
            for fh in served or ():
                HELPER.unserve(fh)

    @property
    def children(self) -> Children | None:
        """Entries of a directory by name (None for other nodes)."""
        return self._children

    @children.setter
    def children(self, entries: dict[str, Node] | None) -> None:
        self._children = None if entries is None else entries if isinstance(entries, Children) else Children(entries)

    @property
    def is_dir(self) -> bool:
        return self.kind == stat_module.S_IFDIR

    @property
    def is_file(self) -> bool:
        return self.kind == stat_module.S_IFREG

    @property
    def nlink(self) -> int:
        if self.is_dir:
            if not self.links and self.ino != 1:
                return 0
            return 2 + (self._children.subdirs if self._children is not None else 0)
        return len(self.links)

    def touch(self, *, content: bool = True) -> None:
        """A change: ``ctime`` always, ``mtime`` too when the content (or entries) changed."""
        t = now_ns()
        self.ctime = t
        if content:
            self.mtime = t
        self.times_stale = True

    def __repr__(self) -> str:
        kind = stat_module.filemode(self.kind | self.perm)
        names = [name for _, name in self.links]
        return f"<Node {self.ino} {kind} {names} size={self.size}>"
