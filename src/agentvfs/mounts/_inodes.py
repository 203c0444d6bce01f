"""The inode table of a mount: the nodes the kernel knows, by inode number and by name."""

from __future__ import annotations

import errno
import os
import stat as stat_module
from datetime import datetime
from typing import Any

import pyfuse3

from ..vfs import FileStat, foreign_metadata
from ._nodes import Node
from ._options import MountOptions

__all__ = ["InodeTable", "ns", "stat_kind"]

_S_IFDIR = stat_module.S_IFDIR
_S_IFREG = stat_module.S_IFREG
_S_IFLNK = stat_module.S_IFLNK


def stat_kind(st: FileStat) -> int:
    """The file-type bits of what ``st`` describes (a symlink, FIFO... where storage keeps
    one; else a directory or a regular file)."""
    if st.file_kind is not None:
        return st.file_kind
    return _S_IFDIR if st.type == "directory" else _S_IFREG


def ns(moment: datetime) -> int:
    """A timestamp as nanoseconds since the epoch."""
    return int(moment.timestamp() * 1_000_000_000)


class InodeTable:
    """Every node of one mount: ``inodes`` by number, and the tree from ``root`` by name.

    A node may have several names (hard links) or none (unlinked while open); its storage
    path is its first name's.

    Parameters
    ----------
    options : MountOptions
        The modes and owner that nodes listed from storage get.
    """

    def __init__(self, options: MountOptions) -> None:
        self.options = options
        self.root = Node(
            pyfuse3.ROOT_INODE, _S_IFDIR, options.dir_mode, uid=options.uid, gid=options.gid, stored=True
        )
        #: What storage without directory times shows as their time: the mount's start.
        self.started_ns = self.root.mtime
        self.inodes: dict[int, Node] = {self.root.ino: self.root}
        self._next = pyfuse3.ROOT_INODE + 1
        #: Files with several names on local disk, by their inode number there.
        self.by_disk_ino: dict[int, Node] = {}

    def path_of(self, node: Node) -> str:
        """The storage path of a node (its first name), ``""`` for the root."""
        parts: list[str] = []
        current = node
        while current is not self.root:
            if not current.links:
                raise pyfuse3.FUSEError(errno.ENOENT)
            parent, name = current.links[0]
            parts.append(name)
            current = parent
        return "/".join(reversed(parts))

    def child_path(self, parent: Node, name: str) -> str:
        """The storage path of the entry ``name`` of directory ``parent``."""
        base = self.path_of(parent)
        return f"{base}/{name}" if base else name

    def node(self, ino: int) -> Node:
        """The node of inode ``ino``; ``ENOENT`` if the mount does not know it."""
        node = self.inodes.get(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def new_node(self, kind: int, perm: int, **kwargs: Any) -> Node:
        """A new node with the next inode number."""
        node = Node(self._next, kind, perm, **kwargs)
        self._next += 1
        self.inodes[node.ino] = node
        return node

    def kind_of(self, st: FileStat) -> int:
        """The file type the mount shows for ``st``: a regular file for a special file
        kept as object metadata when the mount reads none (``-o metadata=off``)."""
        if self.options.metadata or not st.metadata:
            return stat_kind(st)
        return _S_IFDIR if st.type == "directory" else _S_IFREG

    def from_stat(self, st: FileStat, parent: Node, name: str) -> Node:
        """A node for what storage listed as ``name`` in ``parent`` (another name of a file
        already known, where storage has hard links)."""
        if st.inode is not None and (st.nlink or 0) > 1:
            known = self.by_disk_ino.get(st.inode)
            if known is not None and known.links and known.is_file and (parent, name) not in known.links:
                # Another name of a file known by one of its names. (Asked for a name the
                # node already has, the caller replaces the node: the file there changed.)
                known.links.append((parent, name))
                return known
        posix = self.options.metadata or not st.metadata
        is_dir = st.type == "directory"
        kind = self.kind_of(st)
        default = self.options.dir_mode if is_dir else self.options.file_mode
        if kind == _S_IFLNK:
            default = 0o777
        target = os.fsencode(st.link_target) if st.link_target is not None else None
        node = self.new_node(
            kind,
            st.mode if st.mode is not None and posix else default,
            uid=self.options.uid if st.uid is None or not posix else st.uid,
            gid=self.options.gid if st.gid is None or not posix else st.gid,
            # A link's size is its target path's length (storage may report the size of the
            # file it points to).
            size=0 if kind == _S_IFDIR else len(target) if target is not None and kind == _S_IFLNK else st.size,
            # Storage without directory times (prefixes, memory) shows the mount's start time.
            mtime=st.mtime_ns if st.mtime_ns is not None and posix else ns(st.modified_at) or self.started_ns,
            stored=True,
            etag=st.etag,
            rdev=st.rdev or 0,
            target=target,
        )
        # Where storage keeps them, the other times are its own too.
        if st.atime_ns is not None and posix:
            node.atime = st.atime_ns
        if st.ctime_ns is not None and posix:
            node.ctime = st.ctime_ns
        if st.metadata:
            node.keep = foreign_metadata(st.metadata) or None
        self.note_links(node, st)
        node.links.append((parent, name))
        return node

    def note_links(self, node: Node, st: FileStat) -> None:
        """Where storage has hard links: whether the file ``node`` (listed as ``st``) has
        other names on disk than the mount knows, so that writes keep them one file. A file
        that had a second name only for a moment (another mount's staged copy, as it
        publishes) is a plain file again at the next listing."""
        if st.inode is None:
            return
        if (st.nlink or 0) > 1:
            node.disk_ino = st.inode
            self.by_disk_ino[st.inode] = node
        elif node.disk_ino is not None:
            if self.by_disk_ino.get(node.disk_ino) is node:
                del self.by_disk_ino[node.disk_ino]
            node.disk_ino = None

    def drop_link(self, node: Node, directory: Node, name: str) -> None:
        """``node`` is no longer the entry ``name`` of ``directory``."""
        node.links = [(d, n) for d, n in node.links if not (d is directory and n == name)]
        if not node.links and node.disk_ino is not None and self.by_disk_ino.get(node.disk_ino) is node:
            del self.by_disk_ino[node.disk_ino]  # the disk may give the number to a new file
        if node.is_dir and node.children is not None and not node.links:
            node.children = {}

    def add_link(self, directory: Node, name: str, node: Node) -> None:
        """Make ``node`` the entry ``name`` of ``directory``."""
        assert directory.children is not None
        directory.children[name] = node
        node.links.append((directory, name))
        node.times_stale = True  # made or linked just now: storage may have times of its own
        directory.touch()
