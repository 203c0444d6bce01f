"""FUSE passthrough on local-directory mounts: the kernel reads and writes the files on disk.

Every test checks three things: that the data path really bypassed the mount (the ``read`` and
``write`` handlers were never called), that what the mount shows is right (bytes, sizes,
times), and that the files on disk are right when the call returns.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
from agentvfs import LocalFilesystem
from agentvfs.mounts import Mount, fuse_available, is_mounted, passthrough_unavailable_reason
from agentvfs.mounts._ops import MountOperations
from conftest import memory_harness

pytestmark = [
    pytest.mark.skipif(
        fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"
    ),
    pytest.mark.skipif(
        passthrough_unavailable_reason() is not None,
        reason=f"FUSE passthrough unavailable: {passthrough_unavailable_reason()}",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE passthrough needs CAP_SYS_ADMIN"),
]


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield point
    if is_mounted(os.fspath(point)):  # a failed test must not leave a mount behind
        subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    root = tmp_path / "disk"
    root.mkdir()
    return root


class _Counting:
    """Counts the data requests that reach the mount's handlers."""

    def __init__(self, ops: MountOperations) -> None:
        self.reads = 0
        self.writes = 0
        read, write = ops.read, ops.write

        async def counted_read(fh: int, off: int, size: int) -> Any:
            self.reads += 1
            return await read(fh, off, size)

        async def counted_write(fh: int, off: int, buf: bytes) -> int:
            self.writes += 1
            return await write(fh, off, buf)

        ops.read = counted_read  # type: ignore[method-assign]
        ops.write = counted_write  # type: ignore[method-assign]


def _off(ops: MountOperations) -> bool:
    return ops.passthrough is None


def _mounted(
    disk: Path, mnt: Path, *, read_only: bool = False, **options: Any
) -> tuple[Mount, MountOperations, _Counting]:
    fs = LocalFilesystem(base_path=os.fspath(disk))
    handle = Mount(fs, os.fspath(mnt), read_only=read_only, options=options or None).start()
    ops = handle.operations
    assert ops is not None
    if options.get("passthrough", True) and not ops.passthrough_granted():
        handle.close()
        pytest.skip("the kernel did not grant FUSE passthrough (Linux >= 6.9, CONFIG_FUSE_PASSTHROUGH)")
    return handle, ops, _Counting(ops)


def test_reads_and_writes_go_to_the_files_on_disk(disk: Path, mnt: Path) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (disk / "data.bin").write_bytes(payload)
    handle, ops, count = _mounted(disk, mnt)
    try:
        assert (mnt / "data.bin").read_bytes() == payload
        assert ops.passthrough_granted()
        with open(mnt / "new.bin", "wb") as f:
            f.write(payload)
            f.flush()
            # Written by the kernel, unseen by the mount: sizes still agree.
            assert os.fstat(f.fileno()).st_size == len(payload)
            assert (disk / "new.bin").stat().st_size == len(payload)
        assert (disk / "new.bin").read_bytes() == payload
        assert (mnt / "new.bin").stat().st_size == len(payload)
        assert count.reads == 0
        assert count.writes == 0
    finally:
        handle.close()


def test_every_kind_of_write_lands_on_disk(disk: Path, mnt: Path) -> None:
    (disk / "f.txt").write_bytes(b"0123456789")
    handle, _ops, count = _mounted(disk, mnt)
    try:
        f = mnt / "f.txt"
        with open(f, "ab") as out:  # appends, never truncates
            out.write(b"ab")
        assert (disk / "f.txt").read_bytes() == b"0123456789ab"
        fd = os.open(f, os.O_RDWR)
        try:
            os.pwrite(fd, b"XY", 4)
            os.ftruncate(fd, 8)
            assert os.fstat(fd).st_size == 8
            assert os.pread(fd, 100, 0) == b"0123XY67"
        finally:
            os.close(fd)
        assert (disk / "f.txt").read_bytes() == b"0123XY67"
        inode = (disk / "f.txt").stat().st_ino
        os.truncate(f, 3)  # by path, with no file open: on disk, in place (no staged copy)
        assert f.stat().st_size == 3
        assert (disk / "f.txt").read_bytes() == b"012"
        assert (disk / "f.txt").stat().st_ino == inode
        os.truncate(f, 5)  # up: zeros
        assert f.read_bytes() == b"012\0\0"
        os.truncate(f, 3)
        with open(f, "wb") as out:  # O_TRUNC
            out.write(b"new")
        assert (disk / "f.txt").read_bytes() == b"new"
        assert f.read_bytes() == b"new"
        assert count.writes == 0
    finally:
        handle.close()


def test_a_reader_and_a_writer_share_the_file(disk: Path, mnt: Path) -> None:
    """The kernel allows one backing file per inode: later opens of an open file use it."""
    (disk / "shared").write_bytes(b"aaaa")
    handle, ops, count = _mounted(disk, mnt)
    try:
        reader = os.open(mnt / "shared", os.O_RDONLY)
        writer = os.open(mnt / "shared", os.O_WRONLY)
        try:
            os.pwrite(writer, b"bb", 1)
            assert os.pread(reader, 10, 0) == b"abba"
            nodes = [n for n in ops.inodes.values() if n.pt_opens]
            assert len(nodes) == 1 and nodes[0].pt_opens == 2 and nodes[0].pt_writers == 1
        finally:
            os.close(reader)
            os.close(writer)
        # Given back when the last handle is released (the kernel sends that after close returns).
        assert wait_until(lambda: not any(n.backing_fd >= 0 for n in ops.inodes.values()))
        assert (disk / "shared").read_bytes() == b"abba"
        assert count.reads == count.writes == 0
    finally:
        handle.close()


def test_times_and_modes(disk: Path, mnt: Path) -> None:
    handle, _ops, _count = _mounted(disk, mnt)
    try:
        fd = os.open(mnt / "t", os.O_CREAT | os.O_WRONLY, 0o640)
        try:
            before = os.fstat(fd).st_mtime_ns
            os.write(fd, b"x" * 10)
            os.utime(fd, ns=(1_000_000_000_000_000_001, 1_100_000_000_000_000_002))
        finally:
            os.close(fd)
        st = os.stat(mnt / "t")
        assert (st.st_atime_ns, st.st_mtime_ns) == (
            1_000_000_000_000_000_001,
            1_100_000_000_000_000_002,
        )
        assert st.st_mode & 0o777 == 0o640
        assert (disk / "t").stat().st_mtime_ns == 1_100_000_000_000_000_002  # on disk too
        # A write moves mtime forward again.
        with open(mnt / "t", "ab") as out:
            out.write(b"y")
        assert os.stat(mnt / "t").st_mtime_ns >= before > 1_100_000_000_000_000_002
        assert os.stat(mnt / "t").st_size == 11
    finally:
        handle.close()


def test_unlinked_while_open_keeps_its_data(disk: Path, mnt: Path) -> None:
    (disk / "gone").write_bytes(b"still here")
    handle, _ops, _count = _mounted(disk, mnt)
    try:
        fd = os.open(mnt / "gone", os.O_RDWR)
        try:
            os.unlink(mnt / "gone")
            assert not (disk / "gone").exists()
            os.pwrite(fd, b"S", 0)
            assert os.pread(fd, 100, 0) == b"Still here"
        finally:
            os.close(fd)
        assert not (mnt / "gone").exists()
    finally:
        handle.close()


def test_hard_link_made_while_open_gets_the_writes(disk: Path, mnt: Path) -> None:
    """A hard link on disk is one file: the other name has the writes made while it was open."""
    (disk / "a").write_bytes(b"old")
    handle, _ops, _count = _mounted(disk, mnt)
    try:
        fd = os.open(mnt / "a", os.O_WRONLY)
        try:
            os.link(mnt / "a", mnt / "b")
            os.pwrite(fd, b"new", 0)
        finally:
            os.close(fd)
        assert (disk / "a").read_bytes() == b"new"
        assert (disk / "b").read_bytes() == b"new"
        assert (mnt / "b").read_bytes() == b"new"
    finally:
        handle.close()


def test_fsync_and_rename_over(disk: Path, mnt: Path) -> None:
    (disk / "target").write_bytes(b"target")
    handle, _ops, _count = _mounted(disk, mnt)
    try:
        reader = os.open(mnt / "target", os.O_RDONLY)
        try:
            with open(mnt / "tmp", "wb") as out:
                out.write(b"replacement")
                out.flush()
                os.fsync(out.fileno())
            os.rename(mnt / "tmp", mnt / "target")
            # The descriptor opened before the rename still reads the replaced file.
            assert os.pread(reader, 100, 0) == b"target"
        finally:
            os.close(reader)
        assert (disk / "target").read_bytes() == b"replacement"
        assert (mnt / "target").read_bytes() == b"replacement"
    finally:
        handle.close()


def test_read_only_mount_passes_reads_and_refuses_writes(disk: Path, mnt: Path) -> None:
    (disk / "r").write_bytes(b"read me")
    handle, _ops, count = _mounted(disk, mnt, read_only=True)
    try:
        assert (mnt / "r").read_bytes() == b"read me"
        assert count.reads == 0
        with pytest.raises(OSError) as info:
            os.open(mnt / "r", os.O_WRONLY)
        assert info.value.errno == errno.EROFS
        assert (disk / "r").read_bytes() == b"read me"
    finally:
        handle.close()


def test_option_off_and_other_storage_serve_through_the_mount(disk: Path, mnt: Path) -> None:
    (disk / "f").write_bytes(b"via the mount")
    handle, ops, count = _mounted(disk, mnt, passthrough=False)
    try:
        assert (mnt / "f").read_bytes() == b"via the mount"
        (mnt / "g").write_bytes(b"written")
        assert (disk / "g").read_bytes() == b"written"
        assert ops.passthrough is None and not ops.passthrough_granted()
        # Writes reach the handlers; reads of the clean file are answered from its
        # descriptor by the mount's library (see the next test), not by the kernel.
        assert count.writes >= 1
    finally:
        handle.close()
    h = memory_harness()
    h.put("m", b"memory")
    with Mount(h.fs, os.fspath(mnt)) as memory_mount:
        assert memory_mount.operations is not None
        assert memory_mount.operations.passthrough is None  # no file on disk to pass through to
        assert (mnt / "m").read_bytes() == b"memory"


def test_kernel_refusal_falls_back_to_the_mount(
    disk: Path, mnt: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CAP_SYS_ADMIN the kernel refuses backing files: files are served as usual."""
    (disk / "f").write_bytes(b"fallback")
    handle, ops, count = _mounted(disk, mnt)
    try:
        assert ops.passthrough is not None

        def refuse(fd: int) -> int:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(ops.passthrough, "open_backing", refuse)
        assert (mnt / "f").read_bytes() == b"fallback"
        (mnt / "f").write_bytes(b"written anyway")
        assert (disk / "f").read_bytes() == b"written anyway"
        assert _off(ops)  # not tried again for this mount
        assert count.writes >= 1
        assert "FUSE passthrough off for this mount" in caplog.text
    finally:
        handle.close()


def test_unmount_gives_back_every_descriptor(disk: Path, mnt: Path) -> None:
    for i in range(20):
        (disk / f"f{i}").write_bytes(b"x" * i)
    _mounted(disk, mnt)[0].close()  # what a mount keeps for the process's life (threads...)
    before = len(os.listdir("/proc/self/fd"))
    handle, _ops, _count = _mounted(disk, mnt)
    held = [os.open(mnt / f"f{i}", os.O_RDONLY) for i in range(20)]
    for fd in held:
        os.close(fd)
    held = [os.open(mnt / f"f{i}", os.O_RDONLY) for i in range(5)]
    try:
        handle.close()
    finally:
        for fd in held:
            with contextlib.suppress(OSError):
                os.close(fd)
    assert len(os.listdir("/proc/self/fd")) <= before


def test_mmap_of_the_process_own_mount(disk: Path, mnt: Path) -> None:
    """Page faults go to the file on disk, not to this process's FUSE thread: mapping a file
    of a mount this process serves is safe with passthrough."""
    (disk / "mapped").write_bytes(b"a" * 8192)
    handle, _ops, count = _mounted(disk, mnt)
    try:
        fd = os.open(mnt / "mapped", os.O_RDWR)
        try:
            with mmap.mmap(fd, 8192) as view:
                view[0:5] = b"HELLO"
                view.flush()
                assert view[8000:8003] == b"aaa"
        finally:
            os.close(fd)
        assert (disk / "mapped").read_bytes()[:6] == b"HELLOa"
        assert count.reads == count.writes == 0
    finally:
        handle.close()


def test_free_space_is_the_disk_s(disk: Path, mnt: Path) -> None:
    """Writes in place are bounded by the disk, not by the staging budget."""
    handle, _ops, _count = _mounted(disk, mnt, staging_limit=1024 * 1024)
    try:
        seen, real = os.statvfs(mnt), os.statvfs(disk)
        seen_free, real_free = seen.f_bavail * seen.f_frsize, real.f_bavail * real.f_frsize
        assert abs(seen_free - real_free) <= max(real_free // 100, 64 * 1024 * 1024)
        if real_free > 2 * 1024 * 1024:
            assert seen_free > 1024 * 1024  # not the 1 MiB budget
    finally:
        handle.close()


def test_unlink_acts_on_disk_without_the_filesystem_object(
    disk: Path, mnt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As create does: no hop through the filesystem object's worker threads."""
    for name in ("a", "b"):
        (disk / name).write_bytes(b"x")
    handle, ops, _count = _mounted(disk, mnt)
    try:
        calls: list[str] = []
        delete = ops.fs.delete_file

        async def counted(path: str, *, force: bool = False) -> None:
            calls.append(path)
            await delete(path, force=force)

        monkeypatch.setattr(ops.fs, "delete_file", counted)
        os.unlink(mnt / "a")
        assert not (disk / "a").exists() and not (mnt / "a").exists()
        assert calls == []
        (disk / "b").unlink()  # gone behind the mount's back: unlink still succeeds
        os.unlink(mnt / "b")
        with pytest.raises(FileNotFoundError):
            os.unlink(mnt / "b")
        assert sorted(os.listdir(mnt)) == []
    finally:
        handle.close()


def test_closing_a_file_opened_for_reading_sends_no_flush(tmp_path: Path, mnt: Path) -> None:
    # Read-only opens are answered with FOPEN_NOFLUSH (one request less per file a reader
    # goes through); a writer's close still flushes, and its data is published then.
    harness = memory_harness()
    handle = Mount(harness.fs, os.fspath(mnt), options={"passthrough": False}).start()
    ops = handle.operations
    assert ops is not None
    flushes: list[int] = []
    flush = ops.flush

    async def counted_flush(fh: int) -> None:
        flushes.append(fh)
        await flush(fh)

    ops.flush = counted_flush  # type: ignore[method-assign]
    try:
        (mnt / "f.txt").write_bytes(b"first")
        assert len(flushes) >= 1  # the writer's close
        assert harness.get("f.txt") == b"first"
        before = len(flushes)
        for _ in range(3):
            assert (mnt / "f.txt").read_bytes() == b"first"
        fd = os.open(mnt / "f.txt", os.O_RDONLY)
        os.close(os.dup(fd))
        os.close(fd)
        assert len(flushes) == before
        with open(mnt / "f.txt", "r+b") as f:  # read-write: flushed
            f.write(b"F")
        assert len(flushes) == before + 1
        assert harness.get("f.txt") == b"First"
    finally:
        handle.close()


def test_reads_answered_from_a_descriptor_follow_every_change(disk: Path, mnt: Path) -> None:
    # Without passthrough, the library answers reads of a clean file from the descriptor
    # the mount opened; a write through another descriptor (the file is published anew, in
    # a new inode) takes that back first: the next read of the old descriptor shows it.
    (disk / "f").write_bytes(b"0123456789" * 1000)
    handle, _ops, count = _mounted(disk, mnt, passthrough=False)
    try:
        reader = os.open(mnt / "f", os.O_RDONLY)
        try:
            assert os.pread(reader, 10, 0) == b"0123456789"
            assert count.reads == 0  # answered by the library
            writer = os.open(mnt / "f", os.O_WRONLY)
            try:
                os.pwrite(writer, b"ABCDE", 0)
            finally:
                os.close(writer)
            os.posix_fadvise(reader, 0, 0, os.POSIX_FADV_DONTNEED)  # no page from before
            assert os.pread(reader, 10, 0) == b"ABCDE56789"
            assert count.reads >= 1  # by the handler now, which follows the change
        finally:
            os.close(reader)
        assert (disk / "f").read_bytes()[:10] == b"ABCDE56789"
        # A new descriptor of the changed (published, clean) file is served again.
        before = count.reads
        assert (mnt / "f").read_bytes()[:12] == b"ABCDE5678901"
        assert count.reads == before
    finally:
        handle.close()
