#!/usr/bin/env python
"""The least a pyfuse3 server on trio does for ``grep -r``: a read-only tree copied into memory
at start and served by readdirplus, open, read and release alone (no flush handler: the kernel
stops sending them), with no checks and no storage. What it takes is the floor of a Python
FUSE server on this machine (``bench_cache.py`` times ``grep -r`` through it beside agentvfs
and a C server).

Usage: ``python benchmarks/_pyfuse3_floor.py SOURCE_DIR MOUNTPOINT`` (stays in the foreground
until unmounted).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

import pyfuse3
import trio


class Floor(pyfuse3.Operations):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {}
        self.children: dict[int, list[tuple[bytes, int]]] = {}
        self.data: dict[int, bytes] = {}
        self._next = pyfuse3.ROOT_INODE
        self._add(source, pyfuse3.ROOT_INODE)

    def _add(self, path: str, ino: int) -> None:
        st = os.lstat(path)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.st_mode = st.st_mode
        entry.st_nlink = st.st_nlink
        entry.st_size = st.st_size
        entry.st_mtime_ns = st.st_mtime_ns
        entry.st_ctime_ns = st.st_ctime_ns
        entry.st_atime_ns = st.st_atime_ns
        entry.attr_timeout = entry.entry_timeout = 300
        self.attrs[ino] = entry
        if stat.S_ISDIR(st.st_mode):
            kids = []
            for name in sorted(os.listdir(path)):
                self._next += 1
                kids.append((os.fsencode(name), self._next))
                self._add(os.path.join(path, name), self._next)
            self.children[ino] = kids
        else:
            with open(path, "rb") as f:
                self.data[ino] = f.read()

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self.attrs[inode]

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        for child, ino in self.children.get(parent_inode, []):
            if child == name:
                return self.attrs[ino]
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        kids = self.children[fh]
        for index in range(start_id, len(kids)):
            name, ino = kids[index]
            if not pyfuse3.readdir_reply(token, name, self.attrs[ino], index + 1):
                break

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self.data[fh][off : off + size]

    async def release(self, fh: int) -> None:
        return None

    async def releasedir(self, fh: int) -> None:
        return None


def main() -> None:
    source, mountpoint = sys.argv[1], sys.argv[2]
    ops = Floor(source)
    pyfuse3.init(ops, mountpoint, {"fsname=pyfuse3-floor", "ro", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
