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
from agentvfs.vfs import ContentCache, FsspecFilesystem
from conftest import S3_BUCKET, unique

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"),
]

MiB = 1024 * 1024


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
