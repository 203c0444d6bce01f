"""The conformance suite, run unchanged against every backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem
from agentvfs.testing import (
    FakeGcsServer,
    FilesystemTests,
    Harness,
    MotoServer,
    backend_harness,
    composite_harness,
    fsspec_harness,
    local_harness,
)
from agentvfs.vfs import (
    Backend,
    ByteRange,
    Capabilities,
    DiskBackend,
    FileStat,
    FsspecBackend,
    GcsBackend,
    MemoryBackend,
    MemoryStoreBackend,
    S3Backend,
    SupportsBatchRead,
    SupportsReadIntoBuffer,
    SupportsTreeWalk,
)
from conftest import (
    GCS_BUCKET,
    S3_BUCKET,
    file_harness,
    gcs_harness,
    memory_harness,
    s3_harness,
    unique,
)


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


class SevenOperations(Backend):
    """A backend with the seven required operations only (no batch reads, no tree walk, no
    reads into buffers, the derived copy and move): every fallback of the layer above runs."""

    def __init__(self) -> None:
        self._store = MemoryBackend()
        self.capabilities = Capabilities(atomic_rename=False, versions=True, blocking=False)

    async def stat(self, path: str) -> FileStat:
        return await self._store.stat(path)

    async def list(self, path: str) -> list[FileStat]:
        return await self._store.list(path)

    async def read(self, path: str, range: ByteRange | None = None) -> bytes:
        return await self._store.read(path, range)

    async def write(self, path: str, data: bytes, **kw: Any) -> FileStat:
        return await self._store.write(path, data, **kw)

    async def delete(self, path: str) -> None:
        await self._store.delete(path)

    async def make_dir(self, path: str) -> None:
        await self._store.make_dir(path)

    async def remove_dir(self, path: str) -> None:
        await self._store.remove_dir(path)


class TestSevenOperationsBackend(FilesystemTests):
    @pytest.fixture
    def harness(self) -> Harness:
        backend = SevenOperations()
        assert not isinstance(backend, SupportsBatchRead | SupportsTreeWalk | SupportsReadIntoBuffer)
        return backend_harness(backend, name="seven-operations")


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



# -- the storage kinds under FsspecFilesystem, each as a Backend on its own -----------------------
#
# Every kind passes the suite twice: through FsspecFilesystem (above) and here, through the
# generic BackendFilesystem over ``fs.backend``, the way a third party would use it.


class TestMemoryStoreBackend(FilesystemTests):
    @pytest.fixture
    def harness(self) -> Harness:
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        backend = FsspecFilesystem(raw, root=f"/{unique('ws')}").backend
        assert isinstance(backend, MemoryStoreBackend)
        return backend_harness(backend)


class TestDiskBackend(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        backend = FsspecFilesystem(f"file://{tmp_path}").backend
        assert isinstance(backend, DiskBackend)
        return backend_harness(backend)


class TestGenericFsspec(FilesystemTests):
    """The generic kind (real directories, staged writes renamed into place), through
    FsspecFilesystem: a ``DirFileSystem`` is neither memory, local disk nor an object store."""

    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        raw = DirFileSystem(path=os.fspath(tmp_path), fs=LocalFileSystem())
        harness = fsspec_harness(raw, "ws", name="dir")
        assert isinstance(harness.fs, FsspecFilesystem) and type(harness.fs.backend) is FsspecBackend
        return harness


class TestGenericFsspecBackend(FilesystemTests):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Harness:
        raw = DirFileSystem(path=os.fspath(tmp_path), fs=LocalFileSystem())
        (tmp_path / "ws").mkdir()
        return backend_harness(FsspecFilesystem(raw, root="ws").backend, name="dir")


@pytest.mark.s3
class TestS3Backend(FilesystemTests):
    @pytest.fixture
    def harness(self, moto: MotoServer) -> Harness:
        raw = moto.s3fs(use_listings_cache=False)
        backend = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('ws')}").backend
        assert isinstance(backend, S3Backend)
        return backend_harness(backend)


@pytest.mark.gcs
class TestGCSBackend(FilesystemTests):
    @pytest.fixture
    def harness(self, fake_gcs: FakeGcsServer) -> Harness:
        backend = FsspecFilesystem(fake_gcs.gcsfs(), root=f"{GCS_BUCKET}/{unique('ws')}").backend
        assert isinstance(backend, GcsBackend)
        return backend_harness(backend)
