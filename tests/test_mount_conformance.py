"""The conformance suite run through a FUSE mount with plain ``os`` calls.

The filesystem under test is the mount point seen as a local directory; the oracle reads and
writes the mounted storage directly, so every check covers the whole path: kernel, mount,
storage.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvfs.mounts import fuse_available
from agentvfs.testing import (
    FakeGcsServer,
    FilesystemTests,
    Harness,
    MotoServer,
    backend_harness,
    local_harness,
    mounted_harness,
)
from agentvfs.vfs import MemoryBackend
from conftest import gcs_harness, memory_harness, s3_harness

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


def _mount(inner: Harness, tmp_path: Path, *, process: bool = False) -> Iterator[Harness]:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with mounted_harness(inner, os.fspath(mountpoint), process=process) as harness:
        yield harness


class TestMountMemory(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(memory_harness(), tmp_path)


class TestMountMemoryBackend(FilesystemTests):
    """A filesystem over the storage contract, mounted: what a third-party backend gets."""

    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(backend_harness(MemoryBackend()), tmp_path)


class TestMountLocal(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        base = tmp_path / "base"
        base.mkdir()
        yield from _mount(local_harness(os.fspath(base)), tmp_path)


@pytest.mark.s3
class TestMountS3(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: MotoServer, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(s3_harness(moto), tmp_path)


@pytest.mark.s3
class TestMountS3ChildProcess(FilesystemTests):
    """The mount a sandbox makes of a bucket: served by a child process."""

    @pytest.fixture
    def harness(self, moto: MotoServer, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(s3_harness(moto), tmp_path, process=True)


class TestMountLocalChildProcess(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        base = tmp_path / "base"
        base.mkdir()
        yield from _mount(local_harness(os.fspath(base)), tmp_path, process=True)


@pytest.mark.gcs
class TestMountGcs(FilesystemTests):
    @pytest.fixture
    def harness(self, fake_gcs: FakeGcsServer, tmp_path: Path) -> Iterator[Harness]:
        yield from _mount(gcs_harness(fake_gcs), tmp_path)
