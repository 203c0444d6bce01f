"""Local disk through descriptors (agentvfs.vfs._disk): containment by openat2 and by the
per-component walk (both run every test), links inside and out, several roots, special files,
atomic publishing, and a racer swapping a directory for a link during the calls."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.vfs import _disk
from agentvfs.vfs._disk import ContainmentError, Disk, NotRegularFileError, write_into


@pytest.fixture(params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test with openat2 and again with the user-space walk alone."""
    if request.param == "walk":
        monkeypatch.setattr(_disk, "_openat2_works", False)
    elif not _disk._openat2_works:
        pytest.skip("openat2 is not available on this kernel")
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """ws/ (the root) beside host/ (outside) and allowed/ (a second root)."""
    ws, host, allowed = tmp_path / "ws", tmp_path / "host", tmp_path / "allowed"
    for d in (ws / "a" / "b", host / "dir", allowed):
        d.mkdir(parents=True)
    (ws / "a" / "f.txt").write_text("inside")
    (host / "secret").write_text("host secret")
    (host / "dir" / "x").write_text("host x")
    (allowed / "x").write_text("allowed x")
    links = {
        "rel": "a/f.txt", "abs": str(ws / "a" / "f.txt"), "up": "a/b/../f.txt",
        "esc": "../host/secret", "absesc": str(host / "secret"), "hostdir": str(host / "dir"),
        "toallowed": "../allowed/x", "alldir": str(allowed), "loop1": "loop2", "loop2": "loop1",
        "dangling": "nowhere", "a/b/climb": "../../a/f.txt", "a/b/tooHigh": "../../../host/secret",
    }  # fmt: skip
    for name, target in links.items():
        os.symlink(target, ws / name)
    return tmp_path


def host(tree: Path, rel: str) -> str:
    return str(tree / "ws" / rel)


def test_reads_inside_and_links_that_stay(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    for rel in ("a/f.txt", "rel", "abs", "up", "a/b/climb"):
        assert disk.read(host(tree, rel)) == b"inside", rel
    assert disk.realpath(host(tree, "abs")) == str(tree / "ws" / "a" / "f.txt")


def test_links_that_leave_are_refused(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    for rel in ("esc", "absesc", "hostdir/x", "a/b/tooHigh", "toallowed", "alldir/x"):
        with pytest.raises(ContainmentError):
            disk.read(host(tree, rel))
        with pytest.raises(ContainmentError):
            disk.stat(host(tree, rel))
    with pytest.raises(ContainmentError):
        disk.read(str(tree / "host" / "secret"))  # not under the root at all


def test_links_between_roots(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws"), str(tree / "allowed")])
    assert disk.read(host(tree, "toallowed")) == b"allowed x"
    assert disk.read(host(tree, "alldir/x")) == b"allowed x"
    with pytest.raises(ContainmentError):
        disk.read(host(tree, "esc"))


def test_loops_dangling_and_missing(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    with pytest.raises(OSError) as info:
        disk.read(host(tree, "loop1"))
    assert info.value.errno == errno.ELOOP
    with pytest.raises(FileNotFoundError):
        disk.read(host(tree, "dangling"))
    with pytest.raises(FileNotFoundError):
        disk.read(host(tree, "a/missing/x"))
    with pytest.raises(NotADirectoryError):
        disk.read(host(tree, "a/f.txt/x"))
    assert not disk.exists(host(tree, "dangling")) and disk.exists(host(tree, "rel"))


def test_unconfined_root_follows_everything(tree: Path, resolution: str) -> None:
    disk = Disk(["/"])
    assert disk.read(host(tree, "esc")) == b"host secret"
    assert disk.read(host(tree, "hostdir/x")) == b"host x"


def test_special_files_are_never_opened(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    os.mkfifo(tree / "ws" / "fifo")
    os.symlink("fifo", tree / "ws" / "fifo-link")
    started = time.monotonic()
    for rel in ("fifo", "fifo-link"):
        with pytest.raises(NotRegularFileError) as info:
            disk.read(host(tree, rel))
        assert info.value.kind == "FIFO"
        with pytest.raises(NotRegularFileError):
            disk.append(host(tree, rel), b"x")
    assert time.monotonic() - started < 2  # nothing waited for a writer
    with pytest.raises(IsADirectoryError):
        disk.read(host(tree, "a"))
    if os.geteuid() == 0:
        os.mknod(tree / "ws" / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        with pytest.raises(NotRegularFileError, match="character device"):
            disk.read(host(tree, "zero"))


def test_publish_is_atomic_and_keeps_mode(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    target = tree / "ws" / "a" / "f.txt"
    target.chmod(0o640)
    disk.publish(str(target), write_into(b"new"), overwrite=True)
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    with pytest.raises(FileExistsError):
        disk.publish(str(target), write_into(b"no"), overwrite=False)
    disk.publish(host(tree, "a/fresh"), write_into(b"fresh"), overwrite=False)
    # Through a contained link to its target; the link stays a link.
    disk.publish(host(tree, "rel"), write_into(b"via link"), overwrite=True)
    assert target.read_bytes() == b"via link" and (tree / "ws" / "rel").is_symlink()
    # Withdrawn after staging: nothing changes, nothing is left.
    disk.publish(str(target), write_into(b"withdrawn"), overwrite=True, proceed=lambda: False)
    assert target.read_bytes() == b"via link"
    assert sorted(os.listdir(tree / "ws" / "a")) == ["b", "f.txt", "fresh"]
    for rel in ("esc", "hostdir/new"):
        with pytest.raises(ContainmentError):
            disk.publish(host(tree, rel), write_into(b"out"), overwrite=True)
    assert (tree / "host" / "secret").read_text() == "host secret"
    assert sorted(os.listdir(tree / "host" / "dir")) == ["x"]


def test_names_mkdirs_rename_rmtree(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    disk.makedirs(host(tree, "m/n/o"))
    assert (tree / "ws" / "m" / "n" / "o").is_dir()
    with pytest.raises(ContainmentError):
        disk.makedirs(host(tree, "hostdir/new/deeper"))
    with pytest.raises((FileExistsError, NotADirectoryError)):
        disk.makedirs(host(tree, "a/f.txt/below"))
    # A link inside the tree to delete is removed, its target kept.
    os.symlink(str(tree / "host" / "dir"), tree / "ws" / "m" / "n" / "out")
    (tree / "ws" / "m" / "n" / "o" / "file").write_text("x")
    disk.rmtree(host(tree, "m"))
    assert not (tree / "ws" / "m").exists() and (tree / "host" / "dir" / "x").exists()
    with pytest.raises(NotADirectoryError):
        disk.rmtree(host(tree, "hostdir"))  # a link at the top is refused, not followed
    disk.rename(host(tree, "a/f.txt"), host(tree, "a/g.txt"))
    (tree / "ws" / "a" / "h.txt").write_text("taken")
    with pytest.raises(FileExistsError):
        disk.rename(host(tree, "a/g.txt"), host(tree, "a/h.txt"), replace=False)
    disk.unlink(host(tree, "esc"))  # the link itself goes
    assert not os.path.lexists(tree / "ws" / "esc") and (tree / "host" / "secret").exists()
    with pytest.raises(ContainmentError):
        disk.unlink(host(tree, "hostdir/x"))


def test_listings_follow_only_contained_links(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    entries = {e.name: e for e in disk.listdir(str(tree / "ws"))}
    assert entries["rel"].link == "a/f.txt" and entries["rel"].stat is not None
    assert entries["hostdir"].stat is None and not entries["hostdir"].is_dir
    assert entries["a"].is_dir and entries["a"].link is None
    walked = [e.name for e in disk.walk(str(tree / "ws"), max_depth=10)]
    assert "a/b/climb" in walked and not any(n.startswith("hostdir/") for n in walked)


def test_read_beneath_a_directory(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    skill = tree / "ws" / "skill"
    (skill / "references").mkdir(parents=True)
    (skill / "references" / "r.md").write_text("ref")
    os.symlink("r.md", skill / "references" / "in")
    os.symlink(str(skill / "references" / "r.md"), skill / "references" / "absin")
    os.symlink("../../a/f.txt", skill / "references" / "out")
    for rel in ("references/r.md", "references/in", "references/absin", "references/../references/r.md"):
        assert disk.read_beneath(str(skill), rel) == b"ref"
    for rel in ("references/out", "../a/f.txt", "/etc/passwd"):
        with pytest.raises(ContainmentError):
            disk.read_beneath(str(skill), rel)


_RENAME_EXCHANGE = 2


@pytest.fixture
def racer(tree: Path) -> Iterator[tuple[str, str]]:
    """A thread swapping ws/race/d (a directory) with ws/race/l (a link to host/dir)."""
    race = tree / "ws" / "race"
    (race / "d").mkdir(parents=True)
    (race / "d" / "x").write_text("inside x")
    os.symlink(str(tree / "host" / "dir"), race / "l")
    libc = ctypes.CDLL(None, use_errno=True)
    a, b = os.fsencode(race / "d"), os.fsencode(race / "l")
    stop = threading.Event()
    swaps = [0]

    def run() -> None:
        while not stop.is_set():
            if libc.renameat2(-100, a, -100, b, _RENAME_EXCHANGE) == 0:
                swaps[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield str(race / "d"), str(tree / "host")
    finally:
        stop.set()
        thread.join()
        assert swaps[0] > 0


def test_a_racing_swap_never_leads_out(tree: Path, resolution: str, racer: tuple[str, str]) -> None:
    target, host_dir = racer
    disk = Disk([str(tree / "ws")])
    reads = refused = 0
    deadline = time.monotonic() + 30
    # At least 3,000 tries, and on until both sides of the race were met (a loaded machine
    # may schedule the racer rarely).
    for index in itertools.count():
        if index >= 3000 and ((reads and refused) or time.monotonic() > deadline):
            break
        try:
            data = disk.read(f"{target}/x")
            assert data == b"inside x", data
            reads += 1
        except (ContainmentError, FileNotFoundError, NotADirectoryError, BlockingIOError):
            refused += 1  # BlockingIOError: EAGAIN, the path kept changing under the walk
        with contextlib.suppress(ContainmentError, FileNotFoundError, NotADirectoryError, BlockingIOError):
            disk.publish(f"{target}/new-{index}", write_into(b"agent"), overwrite=True)
    assert reads and refused  # both sides of the race were met
    assert sorted(os.listdir(Path(host_dir) / "dir")) == ["x"]
    assert (Path(host_dir) / "dir" / "x").read_text() == "host x"


@pytest.mark.anyio
async def test_read_file_beneath_on_every_kind_of_filesystem(tree: Path) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from agentvfs import CompositeFilesystem, FsspecFilesystem, LocalFilesystem, PermissionDenied
    from agentvfs.vfs import read_file_beneath

    skill = tree / "ws" / "skill"
    skill.mkdir()
    (skill / "r.md").write_text("ref")
    os.symlink("../a/f.txt", skill / "out")
    local = LocalFilesystem(str(tree / "ws"))
    memory = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    await memory.write_file("skill/r.md", "ref")
    await memory.write_file("a/f.txt", "inside")
    both = CompositeFilesystem({"/local": local, "/mem": memory})
    for fs, top in ((local, "skill"), (memory, "skill"), (both, "/local/skill"), (both, "/mem/skill")):
        assert await read_file_beneath(fs, top, "r.md") == b"ref"
        assert await read_file_beneath(fs, top, "./r.md") == b"ref"
        for bad in ("../a/f.txt", "/etc/passwd"):
            with pytest.raises(PermissionDenied, match="leads outside its directory"):
                await read_file_beneath(fs, top, bad)
    with pytest.raises(PermissionDenied, match="leads outside its directory"):
        await read_file_beneath(local, "skill", "out")  # a link out of the directory, inside the root
    assert await local.read_file("skill/out") == b"inside"  # which the root itself allows


@pytest.mark.anyio
async def test_reads_with_max_bytes_never_read_past_the_limit(tree: Path) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from agentvfs import FileTooLarge, FsspecFilesystem, LocalFilesystem
    from agentvfs.vfs import read_file_beneath, read_many

    big = tree / "ws" / "big.bin"
    fd = os.open(big, os.O_CREAT | os.O_WRONLY, 0o644)
    os.ftruncate(fd, 1 << 30)  # sparse: 1 GiB that costs nothing on disk
    os.close(fd)
    (tree / "ws" / "small.txt").write_bytes(b"x" * 100)
    disk = Disk([str(tree / "ws")])
    with pytest.raises(_disk.TooLargeError):
        disk.read(str(big), max_bytes=1000)
    # A file whose size is already over the limit is refused before a byte is read (it
    # would otherwise cost the limit in memory on each call).
    read = os.pread
    calls: list[int] = []

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return read(fd, n, offset)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "pread", counting_pread)
        with pytest.raises(_disk.TooLargeError):
            disk.read(str(big), max_bytes=64 << 20)
    assert calls == []
    assert disk.read(str(tree / "ws" / "small.txt"), max_bytes=100) == b"x" * 100
    with pytest.raises(_disk.TooLargeError):
        disk.read(str(tree / "ws" / "small.txt"), max_bytes=99)
    local = LocalFilesystem(str(tree / "ws"))
    memory = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    await memory.write_file("big.bin", b"y" * 5000)
    await memory.write_file("small.txt", b"x" * 100)
    for fs in (local, memory):
        got = await read_many(fs, ["big.bin", "small.txt"], max_bytes=1000)
        assert isinstance(got["big.bin"], FileTooLarge) and got["small.txt"] == b"x" * 100
        assert "more than 1000 bytes" in str(got["big.bin"])
        with pytest.raises(FileTooLarge):
            await read_file_beneath(fs, "", "big.bin", max_bytes=1000)


def test_a_root_swapped_for_a_link_is_refused(tree: Path, resolution: str) -> None:
    ws = tree / "ws"
    (ws / "shared").mkdir()
    (ws / "shared" / "ok").write_text("shared")
    disk = Disk([str(ws), str(ws / "shared")])  # a root inside another (allowed_paths=["shared"])
    assert disk.read(str(ws / "shared" / "ok")) == b"shared"
    os.rename(ws / "shared", ws / "shared-moved")
    os.symlink(str(tree / "host"), ws / "shared")  # what a command in the sandbox can do
    with pytest.raises(ContainmentError, match="the root now leads to"):
        disk.read(str(ws / "shared" / "secret"))
    with pytest.raises(ContainmentError):
        disk.publish(str(ws / "shared" / "planted"), write_into(b"x"), overwrite=True)
    assert sorted(os.listdir(tree / "host")) == ["dir", "secret"]
    # A top-level root whose path someone re-pointed is refused the same way.
    outer = Disk([str(ws / "shared-moved")])
    os.rename(ws / "shared-moved", ws / "elsewhere")
    os.symlink(str(tree / "host"), ws / "shared-moved")
    with pytest.raises(ContainmentError):
        outer.read(str(ws / "shared-moved" / "secret"))


def test_a_walk_through_many_links_stays_linear(tree: Path, resolution: str) -> None:
    ws = tree / "ws" / "dag"
    levels, fanout = 12, 4
    for level in range(levels + 1):
        (ws / f"d{level}").mkdir(parents=True)
        (ws / f"d{level}" / "f").write_text("x")
    for level in range(levels):
        for link in range(fanout):
            os.symlink(f"../d{level + 1}", ws / f"d{level}" / f"l{link}")
    started = time.monotonic()
    found = Disk([str(tree / "ws")]).walk(str(ws), max_depth=100)
    # 4**12 paths through the links; each directory is entered at most twice.
    assert len(found) < 10 * (levels + 1) * (fanout + 2)
    assert time.monotonic() - started < 5
    stopped = Disk([str(tree / "ws")]).walk(str(ws), max_depth=100, stop=lambda: True)
    assert stopped == []


def test_no_descriptor_is_left_open(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        for call in (
            lambda: disk.read(host(tree, "esc")),
            lambda: disk.read(host(tree, "a/missing")),
            lambda: disk.publish(host(tree, "hostdir/x"), write_into(b"x"), overwrite=True),
            lambda: disk.publish(host(tree, "a/missing/x"), write_into(b"x"), overwrite=True),
            lambda: disk.unlink(host(tree, "a/nothing")),
            # A name the kernel refuses after the parent was opened (ENAMETOOLONG).
            lambda: disk.publish(host(tree, "a/" + "n" * 300), write_into(b"x"), overwrite=True),
        ):
            with contextlib.suppress(OSError):
                call()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_publish_never_carries_setuid_bits(tree: Path, resolution: str) -> None:
    disk = Disk([str(tree / "ws")])
    target = tree / "ws" / "tool"
    target.write_bytes(b"#!/bin/sh\n")
    target.chmod(0o6755)  # what a sandboxed command may have left
    disk.publish(str(target), write_into(b"#!/bin/sh\necho rewritten\n"), overwrite=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
