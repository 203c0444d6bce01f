"""Mounts with ``-o cache``: files of a bucket served from the persistent cache across mounts,
never stale, and nothing half-written served after the mount process is killed."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentvfs.mounts import ProcessMount, fuse_available
from agentvfs.vfs import SETTLE_SECONDS, ContentCache, FsspecFilesystem
from conftest import S3_BUCKET, unique

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"),
]

MiB = 1024 * 1024


def _settle() -> None:
    """Wait until what was just written to S3 can be cached: a version (the ETag is an MD5)
    is kept once its modification time is settled."""
    time.sleep(SETTLE_SECONDS + 1.1)


@pytest.fixture
def bucket(moto: Any, tmp_path: Path) -> dict[str, Any]:
    raw = moto.s3fs(use_listings_cache=False)
    root = f"{S3_BUCKET}/{unique('ws')}"
    return {"raw": raw, "root": root, "fs": FsspecFilesystem(raw, root=root), "cache": str(tmp_path / "cache")}


def _mount(bucket: dict[str, Any], tmp_path: Path, *, read_only: bool = False, **options: Any) -> ProcessMount:
    mountpoint = tmp_path / unique("mnt")
    mountpoint.mkdir()
    settings = {"cache_dir": bucket["cache"], "metadata_ttl": 1.0} | options
    return ProcessMount(bucket["fs"], str(mountpoint), read_only=read_only, options=settings)


def test_files_read_in_one_mount_are_served_from_the_cache_in_the_next(bucket: dict[str, Any], tmp_path: Path) -> None:
    raw, root = bucket["raw"], bucket["root"]
    for d in range(3):
        for i in range(20):
            raw.pipe_file(f"{root}/src/d{d}/m{i:02}.py", f"x = {i}\n{'# TODO' if i % 5 == 0 else ''}\n".encode())
    big = os.urandom(12 * MiB + 3)
    raw.pipe_file(f"{root}/data/big.bin", big)
    raw.pipe_file(f"{root}/data/ünïcode ✓.txt", b"unicode name\n")
    _settle()
    with _mount(bucket, tmp_path) as first:
        out = subprocess.run(["grep", "-r", "-l", "TODO", first.mountpoint], capture_output=True, text=True, check=True)
        assert len(out.stdout.splitlines()) == 12
        assert Path(first.mountpoint, "data", "big.bin").read_bytes() == big
        assert Path(first.mountpoint, "data", "ünïcode ✓.txt").read_bytes() == b"unicode name\n"
    cache = ContentCache(bucket["cache"])
    info = cache.info()
    assert info.entries == 62 and info.pending == 0  # every file, the big one filled as it was read

    # Storage goes away for data: entries are found by version, so the next mount serves
    # every byte from the cache. Changing a file in storage must show the new content.
    raw.pipe_file(f"{root}/src/d0/m00.py", b"# changed in storage, nothing left\n")
    _settle()
    for read_only in (False, True):
        with _mount(bucket, tmp_path, read_only=read_only) as again:
            out = subprocess.run(["grep", "-r", "-l", "TODO", again.mountpoint], capture_output=True, text=True, check=True)
            assert len(out.stdout.splitlines()) == 11
            got = Path(again.mountpoint, "data", "big.bin").read_bytes()
            assert hashlib.sha256(got).digest() == hashlib.sha256(big).digest()
            assert Path(again.mountpoint, "src", "d0", "m00.py").read_bytes() == b"# changed in storage, nothing left\n"
    assert cache.info().entries == 63  # the new version too; the old one ages out


def test_a_file_changed_in_storage_is_never_served_stale_after_the_ttl(bucket: dict[str, Any], tmp_path: Path) -> None:
    raw, root = bucket["raw"], bucket["root"]
    raw.pipe_file(f"{root}/note.txt", b"version 1")
    with _mount(bucket, tmp_path, metadata_ttl=0.5) as m:
        path = Path(m.mountpoint, "note.txt")
        assert path.read_bytes() == b"version 1"
        for n in range(2, 6):
            raw.pipe_file(f"{root}/note.txt", f"version {n} {'x' * n}".encode())
            time.sleep(0.7)
            assert path.read_bytes() == f"version {n} {'x' * n}".encode()
        # Writes through the mount go to storage and are read back as written.
        path.write_bytes(b"written through the mount")
        assert path.read_bytes() == b"written through the mount"
    assert bytes(raw.cat_file(f"{root}/note.txt")) == b"written through the mount"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_mount_killed_while_filling_leaves_no_entry_that_can_be_served(
    bucket: dict[str, Any], tmp_path: Path, how: signal.Signals
) -> None:
    # SIGKILL cuts the fill short; SIGTERM unmounts (the reader may still finish first).
    raw, root = bucket["raw"], bucket["root"]
    big = os.urandom(48 * MiB)
    raw.pipe_file(f"{root}/big.bin", big)
    _settle()
    m = _mount(bucket, tmp_path)
    m.start()
    started = threading.Event()
    try:
        pid = m.pid
        assert pid is not None

        def reader() -> None:
            try:
                with open(Path(m.mountpoint, "big.bin"), "rb") as f:
                    while f.read(MiB):
                        started.set()
            except OSError:
                pass  # the mount is killed under it

        thread = threading.Thread(target=reader)
        thread.start()
        assert started.wait(30)
        os.kill(pid, how)  # the fill under way, at its first mebibyte
        thread.join(timeout=30)
    finally:
        m.close()
    assert not os.path.ismount(m.mountpoint)  # no dead mount is left behind either
    # Whatever the cache holds is whole: a fill the kill cut short is no entry.
    cache = ContentCache(bucket["cache"])
    for record in Path(bucket["cache"], "v1", "entries").rglob("*.m"):
        data = Path(str(record)[:-2])
        assert data.exists() and hashlib.sha256(data.read_bytes()).digest() == hashlib.sha256(big).digest()
    with _mount(bucket, tmp_path) as again:
        assert Path(again.mountpoint, "big.bin").read_bytes() == big
    assert cache.info().entries == 1
    assert cache.info().pending == 0


def test_a_filesystem_with_a_cache_is_mounted_through_it(bucket: dict[str, Any], tmp_path: Path) -> None:
    raw, root = bucket["raw"], bucket["root"]
    raw.pipe_file(f"{root}/a.txt", b"through the filesystem's cache")
    _settle()
    fs = FsspecFilesystem(raw, root=root, cache=str(tmp_path / "own-cache"))
    mountpoint = tmp_path / "mnt-own"
    mountpoint.mkdir()
    with ProcessMount(fs, str(mountpoint)) as m:
        assert m.options.cache_dir == str(tmp_path / "own-cache")
        assert Path(m.mountpoint, "a.txt").read_bytes() == b"through the filesystem's cache"
    assert ContentCache(tmp_path / "own-cache").info().entries == 1


def test_a_mount_in_this_process_leaves_the_filesystems_cache_as_it_found_it(
    bucket: dict[str, Any], tmp_path: Path
) -> None:
    """``-o cache_dir`` on a mount served in this process turns the cache on for the mount's
    life only: the filesystem object given reads uncached again afterwards, and one that had
    a cache of its own keeps it."""
    from agentvfs.mounts import Mount

    raw, root = bucket["raw"], bucket["root"]
    raw.pipe_file(f"{root}/a.txt", b"read through the mount\n")
    _settle()
    fs = bucket["fs"]
    mountpoint = tmp_path / "mnt-here"
    mountpoint.mkdir()
    with Mount(fs, str(mountpoint), options={"cache_dir": bucket["cache"]}) as m:
        assert fs.cache is not None
        assert Path(m.mountpoint, "a.txt").read_bytes() == b"read through the mount\n"
    assert fs.cache is None
    assert ContentCache(bucket["cache"]).info().entries == 1  # what the mount read is kept
    own = FsspecFilesystem(raw, root=root, cache=str(tmp_path / "own-cache"))
    before = own.cache
    with Mount(own, str(mountpoint), options={"cache_dir": bucket["cache"]}):
        assert own.cache is before
    assert own.cache is before and before is not None


#: Two 128-byte blocks with one MD5 (Wang et al., 2004): one S3 ETag.
_MD5_A = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
)
_MD5_B = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
)


def test_bytes_of_the_same_md5_written_through_a_mount_are_seen_everywhere(bucket: dict[str, Any], tmp_path: Path) -> None:
    """The agent rewrites a file through its sandbox's mount with bytes of the same MD5 (the
    ETag stays): the host's cached reads, its diff, its next snapshot and a forced restore
    all see the change."""
    import anyio

    from agentvfs import Workspace

    assert hashlib.md5(_MD5_A).digest() == hashlib.md5(_MD5_B).digest()
    raw, root = bucket["raw"], bucket["root"]
    raw.pipe_file(f"{root}/tool.bin", _MD5_A)
    _settle()
    host = FsspecFilesystem(raw, root=root, cache=bucket["cache"], metadata_ttl=0)
    ws = Workspace(filesystem=host)

    async def before() -> None:
        assert await host.read_file("tool.bin") == _MD5_A  # and now cached
        await ws.snapshot("before-agent")

    anyio.run(before)
    assert ContentCache(bucket["cache"]).info().entries >= 1
    etag = raw.info(f"{root}/tool.bin")["ETag"]
    with _mount(bucket, tmp_path) as m:  # the agent's mount, on the same cache
        assert Path(m.mountpoint, "tool.bin").read_bytes() == _MD5_A
        Path(m.mountpoint, "tool.bin").write_bytes(_MD5_B)
        assert Path(m.mountpoint, "tool.bin").read_bytes() == _MD5_B
    raw.invalidate_cache()
    assert raw.info(f"{root}/tool.bin")["ETag"] == etag and raw.cat_file(f"{root}/tool.bin") == _MD5_B

    async def after() -> None:
        assert await host.read_file("tool.bin") == _MD5_B
        assert await FsspecFilesystem(raw, root=root, cache=bucket["cache"]).read_file("tool.bin") == _MD5_B
        assert (await ws.diff("before-agent")).changed == ("tool.bin",)
        taken = await ws.snapshot()
        assert taken.files["tool.bin"].sha256 == hashlib.sha256(_MD5_B).hexdigest()
        assert (await ws.restore("before-agent", force=True)).restored == ("tool.bin",)
        assert await host.read_file("tool.bin") == _MD5_A

    anyio.run(after)
    with _mount(bucket, tmp_path, read_only=True) as m:
        assert Path(m.mountpoint, "tool.bin").read_bytes() == _MD5_A
