"""A mount publishes only complete files: a flush before any write publishes nothing, and
readers of the storage see the old object or the new one while a file is being written."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
from _mountproc import mount_point
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, fuse_available
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique

pytestmark = [
    pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"),
    pytest.mark.s3,
]


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    yield from mount_point(tmp_path)


def _calls(raw: Any) -> list[str]:
    """The S3 operations ``raw`` (an s3fs instance) sends, in order, from now on."""
    seen: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: seen.append(model.name))
    return seen


def _sh(script: str, cwd: str) -> None:
    subprocess.run(["bash", "-c", script], cwd=cwd, check=True, timeout=60)


def test_a_shell_redirect_is_one_put_of_the_whole_file(moto: MotoServer, mnt: str, tmp_path: Path) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('publish')}"
    raw.pipe_file(f"{prefix}/old.txt", b"old content\n")
    with Mount(FsspecFilesystem(raw, root=prefix), mnt, options={"metadata_ttl": 0.2}):
        os.listdir(mnt)  # the mount's client exists: its events can be watched
        calls = _calls(raw)
        _sh("echo hi > new.txt", mnt)
        # Durable when the writer's close returned, in one request.
        assert raw.cat_file(f"{prefix}/new.txt") == b"hi\n"
        assert calls.count("PutObject") == 1, calls
        calls.clear()
        # Over an existing file: the shell truncates (O_TRUNC), closes a duplicate (a FLUSH
        # before any write), then writes. Storage never holds the empty file.
        _sh("echo new > old.txt", mnt)
        assert calls.count("PutObject") == 1, calls
        assert raw.cat_file(f"{prefix}/old.txt") == b"new\n"
        # A truncation with nothing written is published too, at the last close.
        _sh(": > old.txt", mnt)
        assert wait_until(lambda: raw.cat_file(f"{prefix}/old.txt") == b"", timeout=10)
        # A new file closed without a write appears, empty.
        _sh("touch touched.txt", mnt)
        assert wait_until(lambda: raw.exists(f"{prefix}/touched.txt"), timeout=10)


@pytest.mark.parametrize("writer", ["redirect", "dd", "cp"])
def test_readers_of_storage_see_the_old_or_the_new_object(
    moto: MotoServer, mnt: str, tmp_path: Path, writer: str
) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('whole')}"
    old = b"o" * (3 << 20)
    new = os.urandom(8 << 20)
    source = tmp_path / "new.bin"
    source.write_bytes(new)
    raw.pipe_file(f"{prefix}/f.bin", old)
    observer = moto.s3fs(use_listings_cache=False)
    seen: list[bytes] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(observer.cat_file(f"{prefix}/f.bin"))

    with Mount(FsspecFilesystem(raw, root=prefix), mnt):
        thread = threading.Thread(target=watch)
        thread.start()
        try:
            script = {
                # Slow writes in small blocks: the observer gets many looks mid-write.
                "redirect": f"for i in 1 2 3 4 5 6 7 8; do head -c 1048576 {source} | tail -c 1048576; done > f.bin",
                "dd": f"dd if={source} of=f.bin bs=64k status=none",
                "cp": f"cp {source} f.bin",
            }[writer]
            _sh(script, mnt)
        finally:
            stop.set()
            thread.join()
    expected_new = new if writer != "redirect" else new[: 1 << 20] * 8
    assert raw.cat_file(f"{prefix}/f.bin") == expected_new
    assert seen and all(content in (old, expected_new) for content in seen), sorted({len(s) for s in seen})


@pytest.mark.parametrize("change", ["replaced", "renamed"])
def test_a_reader_gets_the_version_it_opened_or_estale(moto: MotoServer, mnt: str, change: str) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('pinned')}"
    old = os.urandom(24 << 20)
    raw.pipe_file(f"{prefix}/big.bin", old)
    other = moto.s3fs(use_listings_cache=False)
    options = {"prefetch_parts": 0, "part_size": 1 << 20}

    def read_rest(f: Any, got: bytearray) -> None:
        while chunk := f.read(1 << 20):
            got += chunk

    with Mount(FsspecFilesystem(raw, root=prefix), mnt, options=options), open(f"{mnt}/big.bin", "rb", buffering=0) as f:
        assert f.read(1 << 20) == old[: 1 << 20]
        # Someone else changes the object (same length: the kernel cannot tell by size).
        if change == "replaced":
            other.pipe_file(f"{prefix}/big.bin", os.urandom(24 << 20))
        else:
            other.mv(f"{prefix}/big.bin", f"{prefix}/moved.bin")
        got = bytearray(old[: 1 << 20])
        with pytest.raises(OSError) as stale:
            read_rest(f, got)
        assert stale.value.errno == errno.ESTALE
        # What was served before the error is the old version's, never the new one's.
        assert bytes(got) == old[: len(got)]


def test_a_reader_sees_the_writes_of_its_own_mount(moto: MotoServer, mnt: str) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('ownwrite')}"
    raw.pipe_file(f"{prefix}/f.txt", b"old old old")
    with Mount(FsspecFilesystem(raw, root=prefix), mnt), open(f"{mnt}/f.txt", "rb", buffering=0) as reader:
        assert reader.read(3) == b"old"
        with open(f"{mnt}/f.txt", "r+b") as writer:
            writer.write(b"NEW")
        reader.seek(0)
        assert reader.read() == b"NEW old old"


def test_a_file_replaced_elsewhere_before_the_first_read_is_read_whole(moto: MotoServer, mnt: str) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('replaced')}"
    raw.pipe_file(f"{prefix}/same.bin", b"a" * 4096)
    raw.pipe_file(f"{prefix}/longer.bin", b"a" * 4096)
    other = moto.s3fs(use_listings_cache=False)
    with Mount(FsspecFilesystem(raw, root=prefix), mnt, options={"metadata_ttl": 60}):
        assert os.path.getsize(f"{mnt}/same.bin") == 4096 == os.path.getsize(f"{mnt}/longer.bin")
        # Replaced in storage while the mount still trusts what it listed (metadata_ttl).
        other.pipe_file(f"{prefix}/same.bin", b"b" * 4096)
        other.pipe_file(f"{prefix}/longer.bin", b"b" * 8192)
        # Same size: the new version, whole (nothing of the old one was served).
        assert open(f"{mnt}/same.bin", "rb").read() == b"b" * 4096
        # Another size: the kernel holds the old size, so ESTALE rather than the new bytes
        # cut to the old length; the next open sees the new file.
        with pytest.raises(OSError) as stale:
            open(f"{mnt}/longer.bin", "rb").read()
        assert stale.value.errno == errno.ESTALE
        assert wait_until(lambda: open(f"{mnt}/longer.bin", "rb").read() == b"b" * 8192)
