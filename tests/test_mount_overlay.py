"""The conformance suite through a FUSE mount of an overlay, and what a process sees of one.

The mount serves the overlay to the kernel; the oracle writes into the base storage and reads
the view from the two storages directly, so each check covers kernel, mount, overlay and
both layers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.mounts import Mount, fuse_available
from agentvfs.testing import (
    FilesystemTests,
    Harness,
    backend_harness,
    local_harness,
    mounted_harness,
    overlay_harness,
)
from agentvfs.vfs import BackendFilesystem, MemoryBackend, OverlayFilesystem
from conftest import memory_harness

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


def _mount(inner: Harness, tmp_path: Path) -> Iterator[Harness]:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with mounted_harness(inner, os.fspath(mountpoint)) as harness:
        yield harness


def _local(tmp_path: Path, name: str) -> Harness:
    directory = tmp_path / name
    directory.mkdir()
    return local_harness(os.fspath(directory))


class TestMountOverlayMemory(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(overlay_harness(memory_harness(), backend_harness(MemoryBackend())), tmp_path)


class TestMountOverlayLocalOnLocal(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(overlay_harness(_local(tmp_path, "base"), _local(tmp_path, "upper")), tmp_path)


@pytest.mark.anyio
async def test_a_process_edits_the_overlay_and_the_commit_publishes_it(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    (base_dir / "src").mkdir(parents=True)
    (base_dir / "src" / "app.py").write_bytes(b"old\n")
    (base_dir / "gone.txt").write_bytes(b"bye\n")
    base = local_harness(os.fspath(base_dir))
    overlay = OverlayFilesystem(base.fs, BackendFilesystem(MemoryBackend()))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with Mount(overlay, os.fspath(mountpoint), options={"metadata_ttl": 0.0}):
        with open(mountpoint / "src" / "app.py", "ab") as handle:
            handle.write(b"appended\n")
        os.unlink(mountpoint / "gone.txt")
        os.rename(mountpoint / "src", mountpoint / "source")
        assert sorted(os.listdir(mountpoint)) == ["source"]
        assert (mountpoint / "source" / "app.py").read_bytes() == b"old\nappended\n"
        assert sorted(os.listdir(mountpoint)) == ["source"]
        # The base directory is untouched while the mount works on the overlay.
        assert (base_dir / "src" / "app.py").read_bytes() == b"old\n"
        assert (base_dir / "gone.txt").exists()
    report = await overlay.commit()
    assert report.ok, report.reasons
    assert sorted(os.listdir(base_dir)) == ["source"]
    assert (base_dir / "source" / "app.py").read_bytes() == b"old\nappended\n"
