"""Reads of a remote file through the mount: random reads in aligned windows fetched once, kept
per handle, within budget; sequential reads in parts whose buffers are reused."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from _mounted import wait_until
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, _readahead, fuse_available
from agentvfs.testing import MotoServer
from agentvfs.vfs._base import read_range, read_range_into
from conftest import S3_BUCKET, unique
from test_fsspec_backend import _count_s3_calls

MiB = 1 << 20
FUSE = fuse_available()
pytestmark = pytest.mark.skipif(FUSE is not None, reason=f"FUSE unavailable: {FUSE}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ranged read the mount sends to storage, as (start, end)."""
    seen: list[tuple[int, int]] = []
    original = read_range

    async def counting(fs: Any, path: str, start: int, end: int, **pin: Any) -> Any:
        seen.append((start, end))
        return await original(fs, path, start, end, **pin)

    monkeypatch.setattr(_readahead, "read_range", counting)  # the name the mount calls
    return seen


@pytest.fixture
def data(tmp_path: Path) -> Iterator[tuple[FsspecFilesystem, bytes]]:
    # A memory filesystem has no local path: its files are read by ranges, as remote ones are.
    root = f"/random-reads-{os.getpid()}-{tmp_path.name}"
    raw = fsspec.filesystem("memory")
    blob = os.urandom(8 * MiB)
    raw.pipe_file(f"{root}/big.bin", blob)
    try:
        yield FsspecFilesystem(f"memory://{root}"), blob
    finally:
        raw.rm(root, recursive=True)


def _pread(fd: int, off: int, n: int) -> bytes:
    return os.pread(fd, n, off)


def test_reads_in_one_window_cost_one_request(tmp_path: Path, data: tuple[FsspecFilesystem, bytes],
                                              calls: list[tuple[int, int]]) -> None:
    fs, blob = data
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Mount(fs, str(mnt), options={"random_read_size": MiB}) as m:
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead
            for off in (3 * MiB + 100, 3 * MiB + 500_000, 3 * MiB + 900_000):
                assert _pread(fd, off, 4096) == blob[off : off + 4096]
            assert calls == [(3 * MiB, 4 * MiB)]
            # A read across a window boundary fetches both windows, and returns the right bytes.
            off = 6 * MiB - 100
            assert _pread(fd, off, 8192) == blob[off : off + 8192]
            assert sorted(calls[1:]) == [(5 * MiB, 6 * MiB), (6 * MiB, 7 * MiB)]
            assert m.operations is not None and m.operations.read_cache_used == 3 * MiB
        finally:
            os.close(fd)
        ops = m.operations
        assert wait_until(lambda: ops.read_cache_used == 0)  # released with the handle


def test_windows_stay_within_the_read_cache(tmp_path: Path, data: tuple[FsspecFilesystem, bytes],
                                            calls: list[tuple[int, int]]) -> None:
    fs, blob = data
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Mount(fs, str(mnt), options={"random_read_size": MiB, "read_cache_bytes": 2 * MiB}) as m:
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            # The last read is elsewhere in window 1: the kernel's page cache holds the first.
            for window, within in ((1, 12_345), (2, 12_345), (3, 12_345), (4, 12_345), (1, 600_000)):
                off = window * MiB + within
                assert _pread(fd, off, 4096) == blob[off : off + 4096]
                assert m.operations is not None and m.operations.read_cache_used <= 2 * MiB
            # Window 1 was dropped (least recently used) to make room, so it is fetched again.
            assert [s // MiB for s, _ in calls] == [1, 2, 3, 4, 1]
        finally:
            os.close(fd)


def test_zero_window_reads_exact_ranges(tmp_path: Path, data: tuple[FsspecFilesystem, bytes],
                                        calls: list[tuple[int, int]]) -> None:
    fs, blob = data
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Mount(fs, str(mnt), options={"random_read_size": 0}):
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            off = 5 * MiB + 4096
            assert _pread(fd, off, 4096) == blob[off : off + 4096]
            assert calls == [(off, off + 4096)]
        finally:
            os.close(fd)


# -- sequential reads: parts, and the buffers they land in --------------------------------


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every part the mount fetches, as (start, length, id of the buffer it lands in)."""
    seen: list[tuple[int, int, int]] = []
    original = read_range_into

    async def counting(fs: Any, path: str, start: int, buffer: memoryview, **pin: Any) -> int:
        seen.append((start, len(buffer), id(buffer.obj)))
        return await original(fs, path, start, buffer, **pin)

    monkeypatch.setattr(_readahead, "read_range_into", counting)
    return seen


def test_sequential_parts_reuse_their_buffers(tmp_path: Path, parts: list[tuple[int, int, int]]) -> None:
    root = f"/seq-parts-{os.getpid()}-{tmp_path.name}"
    raw = fsspec.filesystem("memory")
    blob = os.urandom(24 * MiB)
    raw.pipe_file(f"{root}/big.bin", blob)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        options = {"part_size": MiB, "prefetch_parts": 2}
        with Mount(FsspecFilesystem(f"memory://{root}"), str(mnt), options=options) as m:
            ops = m.operations
            assert ops is not None
            # Two readers of one file at once, at different places, each on its own handle:
            # a buffer refilled under a reader would show as wrong bytes.
            with open(mnt / "big.bin", "rb", buffering=0) as a, open(mnt / "big.bin", "rb", buffering=0) as b:
                b.seek(12 * MiB)
                got_a, got_b = [], []
                for _ in range(12):
                    got_a.append(a.read(MiB))
                    got_b.append(b.read(MiB))
                assert b"".join(got_a) == blob[: 12 * MiB]
                assert b"".join(got_b) == blob[12 * MiB :]
            # Over 20 parts landed in a handful of buffers: per reader the part read and two
            # ahead, plus the four kept free (prefetch_parts + 2).
            assert len(parts) >= 20
            assert len({buffer for _, _, buffer in parts}) <= 2 * 4 + 4
            # Nothing being read: no part, and no buffer kept.
            assert wait_until(lambda: ops.read_cache_used == 0 and not ops.readahead.buffers.free)
    finally:
        raw.rm(root, recursive=True)


def test_a_failed_part_gives_back_its_share_of_the_cache(
    tmp_path: Path, data: tuple[FsspecFilesystem, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, blob = data
    original = read_range_into
    failures = [2 * MiB]  # the part at 2 MiB fails once

    async def flaky(fs: Any, path: str, start: int, buffer: memoryview, **pin: Any) -> int:
        if start in failures:
            failures.remove(start)
            raise OSError(5, "storage hiccup")
        return await original(fs, path, start, buffer, **pin)

    monkeypatch.setattr(_readahead, "read_range_into", flaky)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Mount(fs, str(mnt), options={"part_size": MiB, "prefetch_parts": 1}) as m:
        ops = m.operations
        assert ops is not None
        # The kernel's read-ahead meets the failure; the read the reader waits on asks again,
        # the part is fetched anew, and the file reads whole.
        assert (mnt / "big.bin").read_bytes() == blob
        assert failures == []
        assert wait_until(lambda: ops.read_cache_used == 0)  # the failed part's share too


@pytest.mark.s3
def test_a_sequential_read_from_s3_lands_whole_in_mapped_parts(tmp_path: Path, moto: MotoServer) -> None:
    # The default parts (1, 2, 4, 8 MiB, then 16 MiB) of a 40 MiB object: each one GET of a
    # signed URL whose body the socket reads straight into the part's buffer, an anonymous
    # mapping from 1 MiB on; not one byte through s3fs.
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('seq-s3')}"
    blob = os.urandom(40 * MiB + 12345)
    raw.pipe_file(f"{prefix}/big.bin", blob)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fs = FsspecFilesystem(raw, root=prefix)
    with Mount(fs, str(mnt)) as m:
        ops = m.operations
        assert ops is not None
        os.stat(mnt / "big.bin")
        calls = _count_s3_calls(raw)
        got = []
        mapped = False

        def some_part_is_mapped() -> bool:
            # In use by a handle, or given back to the pool (which empties once nothing is
            # being read: looked at while the file is read, not after).
            held = [part.buffer for h in list(ops.handles.values()) for part in list(h.reading.parts.values())]
            return any(isinstance(b, mmap.mmap) for b in [*held, *ops.readahead.buffers.free])

        with open(mnt / "big.bin", "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                got.append(chunk)
                mapped = mapped or some_part_is_mapped()
        assert mapped
        assert b"".join(got) == blob
        assert "get_object" not in calls
        assert wait_until(lambda: ops.read_cache_used == 0 and not ops.readahead.buffers.free)
