"""Random reads of a remote file: aligned windows fetched once, kept per handle, within budget."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from _mounted import wait_until
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, _ops, fuse_available
from agentvfs.vfs._base import read_range

MiB = 1 << 20
FUSE = fuse_available()
pytestmark = pytest.mark.skipif(FUSE is not None, reason=f"FUSE unavailable: {FUSE}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ranged read the mount sends to storage, as (start, end)."""
    seen: list[tuple[int, int]] = []
    original = read_range

    async def counting(fs: Any, path: str, start: int, end: int) -> Any:
        seen.append((start, end))
        return await original(fs, path, start, end)

    monkeypatch.setattr(_ops, "read_range", counting)  # the name the mount calls
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
