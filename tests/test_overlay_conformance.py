"""The conformance suite, unchanged, on copy-on-write overlays of every backend.

S3, GCS and the reference backend run under a memory upper layer (the upper layer of a
workspace fork), local disk under an upper layer of its own kind (a second directory); the
oracle writes into the base storage and reads the view from both storages directly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentvfs.testing import (
    FakeGcsServer,
    FilesystemTests,
    Harness,
    MotoServer,
    backend_harness,
    local_harness,
    overlay_harness,
)
from agentvfs.vfs import MemoryBackend
from conftest import gcs_harness, memory_harness, s3_harness


def _local(tmp_path: Path, name: str) -> Harness:
    directory = tmp_path / name
    directory.mkdir()
    return local_harness(os.fspath(directory))


class TestOverlayMemoryOnMemoryBackend(FilesystemTests):
    """The upper layer is the reference backend with the seven operations behind it."""

    @pytest.fixture
    def harness(self) -> Harness:
        return overlay_harness(memory_harness(), backend_harness(MemoryBackend()))


class TestOverlayLocalOnLocal(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        return overlay_harness(_local(tmp_path, "base"), _local(tmp_path, "upper"))


@pytest.mark.s3
class TestOverlayS3OnMemory(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: MotoServer) -> Harness:
        return overlay_harness(s3_harness(moto), memory_harness())


@pytest.mark.gcs
class TestOverlayGcsOnMemory(FilesystemTests):
    @pytest.fixture
    def harness(self, fake_gcs: FakeGcsServer) -> Harness:
        return overlay_harness(gcs_harness(fake_gcs), memory_harness())
