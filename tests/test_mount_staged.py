"""The staged path of a local-directory mount (passthrough off, or where it is unavailable):
each written file is a private copy beside the files, published by a hard link and a rename
under a version check.

Requests of one file reach the mount concurrently: the kernel sends the last close's
``release`` after ``close(2)`` returned, so a program's next ``open`` or ``write`` of the file
arrives while that close's publish is still running. The filesystem here holds one of its
calls (a publish, a removal, a listing), as a slow disk would, so that the order of the
requests is the test's own, every run.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import anyio.to_thread
import pytest

from _mounted import wait_until
from agentvfs import LocalFilesystem
from agentvfs.mounts import Mount, fuse_available, is_mounted
from agentvfs.vfs import FileStat, PosixAttributes, Version

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")

#: Writes are staged also where FUSE passthrough would open files in place.
STAGED = {"passthrough": False, "metadata_ttl": 0.2}
#: Long enough for a request sent by another thread to reach the mount and be served as far
#: as it goes while the held call waits.
SETTLE = 0.5


class _Gate:
    """One held call: ``reached`` once it is waiting, and it goes on once ``opened``."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()


class _HeldDisk(LocalFilesystem):
    """A local directory whose next publish, deletion or move can be held at its start
    (before it looks at the version on disk or changes anything), and its next listing or
    stat once it is read (before the mount uses it)."""

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self._gates: dict[str, _Gate] = {}

    def hold(self, call: str) -> _Gate:
        """Hold the next ``call`` (``publish``, ``delete``, ``move``, ``list``, ``stat``)
        until the gate returned is opened."""
        gate = self._gates[call] = _Gate()
        return gate

    async def _pass(self, call: str) -> None:
        gate = self._gates.pop(call, None)
        if gate is not None:
            gate.reached.set()
            await anyio.to_thread.run_sync(functools.partial(gate.opened.wait, 30))

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
        await self._pass("publish")
        return await super().publish_file(
            local_path, path, expected=expected, create=create, attributes=attributes, keep=keep
        )

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        await self._pass("delete")
        await super().delete_file(path, force=force)

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        await self._pass("move")
        await super().move_file(src, dest, overwrite=overwrite)

    async def list_stats(self, path: str = "") -> list[FileStat]:
        listed = await super().list_stats(path)
        await self._pass("list")
        return listed

    async def stat(self, path: str) -> FileStat:
        found = await super().stat(path)
        await self._pass("stat")
        return found


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


def _in_thread(call: Callable[[], object]) -> concurrent.futures.Future[object]:
    """Run ``call`` in a thread of its own (it may block on the mount while the test goes on)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


_CHANGES: dict[str, tuple[Callable[[Path], None], bytes]] = {
    # What a program does to the file right after closing it, and what the file then holds.
    "append": (lambda path: _append(path, b"new\n"), b"new\n"),
    "truncate and write": (lambda path: _replace(path, b"new\n"), b"new\n"),
    "truncate(2)": (lambda path: os.truncate(path, 100), bytes(100)),
}


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_a_change_while_the_last_close_publishes_waits_for_that_publish(
    change: str, disk: Path, mnt: Path
) -> None:
    # ``: > f`` writes nothing: its last close (the release, after close(2) returned)
    # publishes the empty file. A change that comes in meanwhile used to go into the staged
    # copy being published: storage got the change in place, after the version the publish
    # recorded, and the change's own publish then took that for another writer's (EIO, its
    # data in the recovery area). It waits for the publish now, and starts from a copy.
    (disk / "f").write_bytes(b"the old version\n")
    fs = _HeldDisk(disk)
    do, expected = _CHANGES[change]
    with Mount(fs, mnt, options=STAGED) as mount:
        gate = fs.hold("publish")
        os.close(os.open(mnt / "f", os.O_WRONLY | os.O_TRUNC))
        assert gate.reached.wait(10)
        changed = _in_thread(lambda: do(mnt / "f"))
        time.sleep(SETTLE)
        gate.opened.set()
        changed.result(timeout=30)  # no error
        assert (mnt / "f").read_bytes() == expected
        assert (disk / "f").read_bytes() == expected
        assert mount.kept == []
    assert os.stat(disk / "f").st_nlink == 1


def _settled(mount: Mount) -> bool:
    """Nothing of the mount is left to publish (a release served after its close returned)."""
    assert mount.operations is not None
    # Copied in one step (the mount's thread changes the table meanwhile).
    return not any(node.dirty for node in tuple(mount.operations.inodes.values()))


_RENAMES: dict[str, Callable[[Path], None]] = {
    # A name change of the file while its last close publishes: unlinked, or replaced by a
    # rename of another file over it (also after a utime of the open file, which took the
    # publish's version check away).
    "unlink": lambda mnt: os.unlink(mnt / "f"),
    "rename over it": lambda mnt: os.rename(mnt / "g", mnt / "f"),
}


@pytest.mark.parametrize("utime", [False, True], ids=["", "after utime"])
@pytest.mark.parametrize("change", sorted(_RENAMES))
def test_a_name_change_while_the_last_close_publishes_is_the_mount_s_own(
    change: str, utime: bool, disk: Path, mnt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The release's publish used to start while the unlink or rename was in storage, with the
    # names the file had before it: it then found the mount's own change there, took it for
    # another writer's (an error logged, the data in the recovery area), or, without its
    # version check, put the old file back over the one renamed there.
    (disk / "f").write_bytes(b"the old version\n")
    (disk / "g").write_bytes(b"the file renamed over it\n")
    fs = _HeldDisk(disk)
    with Mount(fs, mnt, options=STAGED) as mount:
        fd = os.open(mnt / "f", os.O_WRONLY | os.O_TRUNC)
        if utime:
            os.utime(fd, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        changing = fs.hold("delete" if change == "unlink" else "move")
        publishing = fs.hold("publish")
        changed = _in_thread(lambda: _RENAMES[change](mnt))
        assert changing.reached.wait(10)
        os.close(fd)  # nothing written: its last close publishes, after close(2) returns
        time.sleep(SETTLE)
        changing.opened.set()
        changed.result(timeout=30)
        publishing.opened.set()
        assert wait_until(lambda: _settled(mount))
        assert mount.kept == []
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert sorted(os.listdir(disk)) == (["f"] if change == "rename over it" else ["g"])
    if change == "rename over it":
        assert (disk / "f").read_bytes() == b"the file renamed over it\n"


def test_a_utime_of_a_file_being_written_keeps_its_publish_conditional(disk: Path, mnt: Path) -> None:
    # ``cp -p`` sets the times through the descriptor before it closes. The times used to go
    # to the old file on disk, whose version the mount then no longer knew: the publish went
    # unchecked and replaced what another writer put there meanwhile, silently.
    (disk / "f").write_bytes(b"the old version\n")
    with Mount(LocalFilesystem(disk), mnt, options=STAGED) as mount:
        fd = os.open(mnt / "f", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"mine\n")
        os.utime(fd, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        (disk / "f").write_bytes(b"another writer's\n")
        with pytest.raises(OSError) as closed:
            os.close(fd)
        assert closed.value.errno == errno.EIO
        assert [open(kept.data, "rb").read() for kept in mount.kept] == [b"the old version\nmine\n"]
    assert (disk / "f").read_bytes() == b"another writer's\n"


def test_a_utime_of_a_file_being_written_is_kept_by_its_publish(disk: Path, mnt: Path) -> None:
    (disk / "f").write_bytes(b"the old version\n")
    with Mount(LocalFilesystem(disk), mnt, options=STAGED):
        fd = os.open(mnt / "f", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"mine\n")
        os.utime(fd, ns=(1_500_000_000_000_000_000, 1_600_000_000_000_000_000))
        assert os.stat(mnt / "f").st_mtime_ns == 1_600_000_000_000_000_000
        # The old file keeps its own times until the publish replaces it.
        assert os.stat(disk / "f").st_mtime_ns != 1_600_000_000_000_000_000
        os.close(fd)
        assert os.stat(mnt / "f").st_mtime_ns == 1_600_000_000_000_000_000
    assert (disk / "f").read_bytes() == b"the old version\nmine\n"
    assert os.stat(disk / "f").st_mtime_ns == 1_600_000_000_000_000_000



def _released(mount: Mount) -> bool:
    """No file of the mount is open for writing (the releases of closed ones are served)."""
    assert mount.operations is not None
    return not any(node.writers for node in tuple(mount.operations.inodes.values()))


@pytest.mark.parametrize("change", ["publish", "utime"])
def test_a_listing_read_before_the_mount_s_own_change_does_not_undo_it(change: str, disk: Path, mnt: Path) -> None:
    # A listing shows storage as it was when it was read. Applied after the mount published
    # the file (the close of a descriptor opened before) or set its times, it used to show
    # the file as it was before: its old size (reads cut short), its old version (the next
    # publish over it refused as another writer's), until the next listing.
    (disk / "f").write_bytes(b"the old version\n")
    fs = _HeldDisk(disk)
    with Mount(fs, mnt, options=STAGED) as mount:
        fd = os.open(mnt / "f", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"written through the mount\n")
        if change == "utime":
            os.close(fd)  # published before the listing; its times are set during it
            fd = os.open(mnt / "f", os.O_RDONLY)
        time.sleep(0.3)  # past metadata_ttl: the next lookup lists the directory
        listing = fs.hold("list")
        listed = _in_thread(lambda: os.listdir(mnt))
        assert listing.reached.wait(10)
        if change == "utime":
            os.utime(fd, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        os.close(fd)
        assert wait_until(lambda: _released(mount))  # a file open for writing keeps its state
        listing.opened.set()
        listed.result(timeout=30)
        expected = (disk / "f").read_bytes()
        assert expected == b"the old version\nwritten through the mount\n"
        assert os.stat(mnt / "f").st_size == len(expected)
        assert (mnt / "f").read_bytes() == expected
        assert os.stat(mnt / "f").st_mtime_ns == os.stat(disk / "f").st_mtime_ns
        _append(mnt / "f", b"and again\n")  # over the version the mount published
    assert (disk / "f").read_bytes() == expected + b"and again\n"


def test_a_stat_read_before_the_mount_s_own_publish_does_not_undo_it(disk: Path, mnt: Path) -> None:
    # The same for the one stat that checks an open file whose attributes are older than
    # metadata_ttl (fstat of a reader): read before a publish of the file, it used to make
    # the mount show the version before that publish.
    (disk / "f").write_bytes(b"the old version\n")
    fs = _HeldDisk(disk)
    with Mount(fs, mnt, options=STAGED):
        reader = os.open(mnt / "f", os.O_RDONLY)
        time.sleep(0.3)  # past metadata_ttl: the next getattr asks storage
        asking = fs.hold("stat")
        asked = _in_thread(lambda: os.fstat(reader))
        assert asking.reached.wait(10)
        _append(mnt / "f", b"written through the mount\n")
        asking.opened.set()
        asked.result(timeout=30)
        os.close(reader)
        expected = b"the old version\nwritten through the mount\n"
        assert (disk / "f").read_bytes() == expected
        assert os.stat(mnt / "f").st_size == len(expected)
        assert (mnt / "f").read_bytes() == expected
