"""The conformance suite, run unchanged against every backend."""

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
    composite_harness,
    local_harness,
)
from agentvfs.vfs import MemoryBackend
from conftest import file_harness, gcs_harness, memory_harness, s3_harness


class TestMemory(FilesystemTests):
    @pytest.fixture
    def harness(self) -> Harness:
        return memory_harness()


class TestMemoryBackend(FilesystemTests):
    """The reference implementation of the storage contract, through ``BackendFilesystem``:
    what a third-party ``Backend`` runs to prove itself."""

    @pytest.fixture
    def harness(self) -> Harness:
        return backend_harness(MemoryBackend())


class TestMemoryBackendOnTrio(FilesystemTests):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "trio"

    @pytest.fixture
    def harness(self) -> Harness:
        return backend_harness(MemoryBackend())


class TestMemoryOnTrio(FilesystemTests):
    """The same suite on trio: nothing in the vfs layer may assume asyncio."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "trio"

    @pytest.fixture
    def harness(self) -> Harness:
        return memory_harness()


class TestLocalOnTrio(FilesystemTests):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "trio"

    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        base = tmp_path / "base"
        base.mkdir()
        return local_harness(os.fspath(base))


class TestFsspecLocal(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        return file_harness(tmp_path)


class TestLocalFilesystem(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        base = tmp_path / "base"
        base.mkdir()
        return local_harness(os.fspath(base))


@pytest.mark.s3
class TestS3(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: MotoServer) -> Harness:
        return s3_harness(moto)


@pytest.mark.gcs
class TestGCS(FilesystemTests):
    @pytest.fixture
    def harness(self, fake_gcs: FakeGcsServer) -> Harness:
        return gcs_harness(fake_gcs)


@pytest.mark.s3
class TestCompositeS3Memory(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: MotoServer) -> Harness:
        return composite_harness(s3_harness(moto), memory_harness())


class TestCompositeLocalMemory(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        base = tmp_path / "base"
        base.mkdir()
        return composite_harness(local_harness(os.fspath(base)), memory_harness())

