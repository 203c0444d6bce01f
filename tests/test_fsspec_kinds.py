"""The storage kinds under FsspecFilesystem: one Backend class per kind, chosen once, each
usable on its own (the conformance suite runs through each: tests/test_conformance.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, StaleFileError, WorkspaceReadOnlyError
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.vfs import (
    Backend,
    BackendFilesystem,
    ByteRange,
    DiskBackend,
    FsspecBackend,
    GcsBackend,
    MemoryBackend,
    MemoryStoreBackend,
    ObjectStoreBackend,
    S3Backend,
    SupportsReadIntoBuffer,
    SupportsStreamingUpload,
    SupportsTransfer,
    Version,
    WriteMode,
    fsspec_backend,
)
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = pytest.mark.anyio


def _calls(raw: Any) -> list[str]:
    """The S3 operations ``raw`` (an s3fs instance) sends, in order, from now on."""
    seen: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: seen.append(model.name))
    return seen


async def test_each_kind_has_its_backend(tmp_path: Path, moto: MotoServer, fake_gcs: FakeGcsServer) -> None:
    memory = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    disk = FsspecFilesystem(f"file://{tmp_path}")
    local = LocalFilesystem(tmp_path)
    generic = FsspecFilesystem(DirFileSystem(path=os.fspath(tmp_path), fs=LocalFileSystem()))
    s3 = FsspecFilesystem(moto.s3fs(), root=f"{S3_BUCKET}/k")
    gcs = FsspecFilesystem(fake_gcs.gcsfs(), root=f"{GCS_BUCKET}/k")
    kinds = [type(fs.backend) for fs in (memory, disk, local, generic, s3, gcs)]
    assert kinds == [MemoryStoreBackend, DiskBackend, DiskBackend, FsspecBackend, S3Backend, GcsBackend]
    assert issubclass(GcsBackend, ObjectStoreBackend) and issubclass(S3Backend, ObjectStoreBackend)
    for fs in (memory, disk, local, generic, s3, gcs):
        await fs.probe()  # the workspace root answers (LocalFilesystem: its base path)
        # The filesystem says what its backend can do; it decides nothing of its own.
        assert fs.capabilities is fs.backend.capabilities
        assert fs.fs is fs.backend.fs
    assert [fs.provider for fs in (memory, disk, generic, s3, gcs)] == ["memory", "file", "dir", "s3", "gcs"]
    assert local.provider == "local" and local.backend.provider == "file"
    assert not memory.capabilities.blocking and s3.capabilities.versions and not s3.capabilities.empty_dirs
    assert [fs.capabilities.metadata for fs in (memory, disk, generic, s3, gcs)] == [False, False, False, True, True]
    assert disk.capabilities.symlinks and disk.capabilities.atomic_rename
    assert not generic.capabilities.atomic_rename  # a staged write, then a rename of its own
    # The same choice, made by the public factory for an fsspec instance and a root.
    assert type(fsspec_backend(MemoryFileSystem(), "/x")) is MemoryStoreBackend
    assert type(fsspec_backend(moto.s3fs(), f"{S3_BUCKET}/x")) is S3Backend
    # Optional groups are Protocols a backend implements or not.
    assert isinstance(s3.backend, SupportsStreamingUpload) and isinstance(s3.backend, SupportsTransfer)
    assert isinstance(disk.backend, SupportsTransfer) and isinstance(disk.backend, SupportsReadIntoBuffer)
    assert not isinstance(memory.backend, SupportsStreamingUpload)
    assert not isinstance(MemoryBackend(), SupportsTransfer)


@pytest.mark.s3
async def test_s3_guard_is_one_conditional_put(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    fs = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('guard')}")
    backend = fs.backend
    assert isinstance(backend, S3Backend)
    seen_first = await backend.write("a.txt", b"one")
    await backend.write("a.txt", b"two")  # someone else replaced it since
    calls = _calls(raw)
    with pytest.raises(StaleFileError) as refused:
        await backend.write("a.txt", b"three", guard=Version.of(seen_first))
    # S3 refused the PUT itself (If-Match): no HEAD went before it.
    assert calls[0] == "PutObject", calls
    assert refused.value.actual_mtime is not None
    assert await backend.read("a.txt") == b"two"
    current = await backend.stat("a.txt")
    calls.clear()
    await backend.write("a.txt", b"four", guard=Version.of(current))
    assert calls[0] == "PutObject" and await backend.read("a.txt") == b"four"
    # Through the filesystem: a tool's read-before-write guard travels with the PUT too.
    seen = await fs.stat("a.txt")
    await backend.write("a.txt", b"five")
    calls.clear()
    with pytest.raises(StaleFileError):
        await fs.write_file("a.txt", "six", expected_mtime=seen)
    assert calls[0] == "PutObject", calls
    assert await fs.read_file("a.txt") == b"five"
    # A guard on a file that is gone: the backend says stale (nothing there); the filesystem
    # creates it, as the reference does.
    await fs.delete_file("a.txt")
    with pytest.raises(StaleFileError) as gone:
        await backend.write("a.txt", b"x", guard=Version.of(seen))
    assert gone.value.actual_mtime is None
    await fs.write_file("a.txt", "seven", expected_mtime=seen)
    assert await fs.read_file("a.txt") == b"seven"


@pytest.mark.s3
async def test_backend_filesystem_streams_through_an_s3_backend(moto: MotoServer, tmp_path: Path) -> None:
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    backend = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('stream')}").backend
    fs = BackendFilesystem(backend)
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(3 << 20))
    await fs.mkdir("in")
    calls = _calls(raw)
    await fs.upload_file(os.fspath(local), "in/big.bin")
    # The open file is the body of one PUT (never read into memory by the layer above).
    assert calls.count("PutObject") == 1 and "CreateMultipartUpload" not in calls
    assert await fs.read_file("in/big.bin") == local.read_bytes()
    await fs.download_file("in/big.bin", os.fspath(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()
    changes: list[tuple[str, tuple[str, ...]]] = []
    fs.watch(lambda _fs, op, paths: changes.append((op, paths)))
    stream = await fs.open_upload("/in/streamed.bin", part_size=5 << 20)
    assert stream is not None
    for _ in range(3):
        await stream.write(b"x" * (4 << 20))
    assert not await fs.exists("in/streamed.bin")  # invisible until committed
    await stream.commit()
    assert changes == [("upload_file", ("/in/streamed.bin",))]  # announced as the caller named it
    assert (await fs.stat("in/streamed.bin")).size == 12 << 20
    dropped = await fs.open_upload("in/dropped.bin", part_size=5 << 20)
    assert dropped is not None
    await dropped.write(b"y" * (6 << 20))
    await dropped.abort()
    assert not await fs.exists("in/dropped.bin")
    assert raw.call_s3("list_multipart_uploads", Bucket=S3_BUCKET).get("Uploads", []) == []


async def test_backend_filesystem_transfers_without_the_protocols(tmp_path: Path) -> None:
    fs = BackendFilesystem(MemoryBackend())
    (tmp_path / "a.txt").write_bytes(b"local")
    await fs.upload_file(os.fspath(tmp_path / "a.txt"), "d/e/a.txt")  # parents made
    assert await fs.read_file("d/e/a.txt") == b"local"
    await fs.download_file("d/e/a.txt", os.fspath(tmp_path / "b.txt"))
    assert (tmp_path / "b.txt").read_bytes() == b"local"
    assert await fs.open_upload("x.bin", part_size=1 << 20) is None  # written whole instead
    read_only = BackendFilesystem(MemoryBackend(), read_only=True)
    with pytest.raises(WorkspaceReadOnlyError):
        await read_only.upload_file(os.fspath(tmp_path / "a.txt"), "a.txt")


async def test_generic_kind_stages_and_renames(tmp_path: Path) -> None:
    fs = FsspecFilesystem(DirFileSystem(path=os.fspath(tmp_path), fs=LocalFileSystem()), root="ws")
    await fs.setup()
    await fs.write_file("d/a.txt", "one")
    await fs.mkdir("d/sub")
    with pytest.raises(IsADirectoryError):
        await fs.write_file("d/sub", "x")  # never moved into the directory
    assert os.listdir(tmp_path / "ws" / "d" / "sub") == []
    with pytest.raises(FileExistsError):
        await fs.write_file("d/a.txt", "two", overwrite=False)
    assert (tmp_path / "ws" / "d" / "a.txt").read_text() == "one"
    assert sorted(os.listdir(tmp_path / "ws" / "d")) == ["a.txt", "sub"]  # no staged leftovers
    backend = fs.backend
    with pytest.raises(FileExistsError):
        await backend.write("d/a.txt", b"three", mode=WriteMode.CREATE)


# -- the storage contract, on every kind ------------------------------------------------------

KINDS = ["reference", "memory-store", "disk", "dir", "s3", "gcs"]


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, empty backend of each kind (``reference`` is MemoryBackend)."""
    name = request.param
    if name == "reference":
        return MemoryBackend()
    if name == "memory-store":
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        return FsspecFilesystem(raw, root="/kind").backend
    if name == "disk":
        return FsspecFilesystem(f"file://{tmp_path}").backend
    if name == "dir":
        return FsspecFilesystem(DirFileSystem(path=os.fspath(tmp_path), fs=LocalFileSystem())).backend
    if name == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
        return FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('kind')}").backend
    fake_gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
    return FsspecFilesystem(fake_gcs.gcsfs(), root=f"{GCS_BUCKET}/{unique('kind')}").backend


async def test_a_guarded_write_is_a_compare_and_swap_on_every_kind(backend: Backend) -> None:
    first = await backend.write("a.txt", b"v1")
    second = await backend.write("a.txt", b"v2.", guard=Version.of(first))
    assert second.etag != first.etag
    with pytest.raises(StaleFileError):
        await backend.write("a.txt", b"lost", guard=Version.of(first))
    assert await backend.read("a.txt") == b"v2."
    await backend.delete("a.txt")
    with pytest.raises(StaleFileError) as gone:
        await backend.write("a.txt", b"x", guard=Version.of(second))
    assert gone.value.actual_mtime is None
    with pytest.raises(FileNotFoundError):
        await backend.stat("a.txt")


async def test_of_many_guarded_writers_of_one_version_one_wins_on_every_kind(backend: Backend) -> None:
    seen = await backend.write("n.txt", b"0")
    won: list[int] = []

    async def writer(i: int) -> None:
        try:
            await backend.write("n.txt", b"%d" % i, guard=Version.of(seen))
            won.append(i)
        except StaleFileError:
            pass

    async with anyio.create_task_group() as tg:
        for i in range(1, 11):
            tg.start_soon(writer, i)
    assert len(won) == 1, won
    assert await backend.read("n.txt") == b"%d" % won[0]


async def test_create_mode_and_directories_on_every_kind(backend: Backend) -> None:
    await backend.write("a.txt", b"1", mode=WriteMode.CREATE)
    with pytest.raises(FileExistsError):
        await backend.write("a.txt", b"2", mode=WriteMode.CREATE)
    assert await backend.read("a.txt") == b"1"
    with pytest.raises(FileNotFoundError):
        await backend.write("d/a.txt", b"x")  # the parent must exist
    await backend.make_dir("d")
    await backend.make_dir("d")  # an existing directory is fine
    await backend.write("d/a.txt", b"x")
    with pytest.raises(OSError) as not_empty:
        await backend.remove_dir("d")
    assert not_empty.value.errno == errno.ENOTEMPTY
    with pytest.raises(NotADirectoryError):
        await backend.list("d/a.txt")
    with pytest.raises(NotADirectoryError):
        await backend.make_dir("d/a.txt/e")
    with pytest.raises(FileExistsError):
        await backend.make_dir("a.txt")
    with pytest.raises(IsADirectoryError):
        await backend.read("d")
    with pytest.raises(IsADirectoryError):
        await backend.write("d", b"x")
    assert sorted((s.name, s.type) for s in await backend.list("")) == [("a.txt", "file"), ("d", "directory")]
    await backend.move("d/a.txt", "b.txt")
    await backend.remove_dir("d")
    with pytest.raises(FileNotFoundError):
        await backend.stat("d")
    assert await backend.read("b.txt") == b"x"


async def test_ranges_on_every_kind(backend: Backend) -> None:
    await backend.write("r.bin", bytes(range(10)))
    assert await backend.read("r.bin", ByteRange(2, 5)) == bytes([2, 3, 4])
    assert await backend.read("r.bin", ByteRange(8)) == bytes([8, 9])
    assert await backend.read("r.bin", ByteRange(20, 30)) == b""
    assert await backend.read("r.bin", ByteRange(3, 3)) == b""
    with pytest.raises(FileNotFoundError):
        await backend.read("missing.bin", ByteRange(0, 1))


async def test_object_metadata_where_the_kind_keeps_it(backend: Backend) -> None:
    meta = {"mode": "0755", "uid": "1000"}
    await backend.write("a.sh", b"#!/bin/sh\n", metadata=meta)
    if not backend.capabilities.metadata:
        # Accepted and not kept: the kind has nowhere to keep it, and says so.
        assert (await backend.stat("a.sh")).metadata == {}
        return
    assert (await backend.stat("a.sh")).metadata == meta
    await backend.copy("a.sh", "b.sh")
    assert (await backend.stat("b.sh")).metadata == meta
    await backend.write("a.sh", b"new")
    assert (await backend.stat("a.sh")).metadata == {}  # a write replaces what it had
    listed = {s.name: s.metadata for s in await backend.list("")}
    # Listings carry it where the store lists it; S3 lists none: not known (None), not empty.
    assert listed["b.sh"] == meta if backend.provider != "s3" else listed["b.sh"] is None


@pytest.mark.s3
async def test_s3_missing_bucket_is_nothing_there(moto: MotoServer) -> None:
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False, skip_instance_cache=True), root="no-such-bucket/x")
    assert not await fs.exists("a.txt")
    with pytest.raises(FileNotFoundError):
        await fs.stat("a.txt")
    with pytest.raises(FileNotFoundError, match="no-such-bucket"):
        await fs.probe()


async def test_a_subclass_on_local_disk_gets_the_disk_kind(tmp_path: Path) -> None:
    class Mine(FsspecFilesystem):
        pass

    fs = Mine(LocalFileSystem(), root=os.fspath(tmp_path))
    assert type(fs.backend) is DiskBackend and fs.capabilities.atomic_rename
    os.symlink("/etc", tmp_path / "out")
    with pytest.raises(PermissionError):
        await fs.read_file("out/hostname")  # contained by descriptors, as DiskFilesystem is
    await fs.write_file("a.txt", "x")
    assert (tmp_path / "a.txt").read_text() == "x"


async def test_local_filesystem_names_paths_as_before(tmp_path: Path) -> None:
    base, allowed = tmp_path / "base", tmp_path / "allowed"
    base.mkdir()
    fs = LocalFilesystem(base, allowed_paths=[os.fspath(allowed)])
    with pytest.raises(FileNotFoundError) as missing:
        await fs.write_file(f"{allowed}/x.txt", "hi")  # the allowed directory is not there
    assert missing.value.filename == os.fspath(allowed) or os.fspath(allowed) in str(missing.value)
    with pytest.raises(IsADirectoryError):
        await fs.write_file(".", "x")
    base.rmdir()
    with pytest.raises(FileNotFoundError) as gone:
        await fs.probe()
    assert "base" not in str(gone.value)  # the workspace root, named as the root


# -- conditional publishes and pinned reads (what a mount's close and read use) -----------------

FS_KINDS = ["memory-store", "disk", "dir", "s3", "gcs"]


@pytest.fixture(params=FS_KINDS)
def kind_fs(request: pytest.FixtureRequest, tmp_path: Path) -> FsspecFilesystem:
    """A fresh FsspecFilesystem of each kind."""
    name = request.param
    root = tmp_path / "root"
    root.mkdir()
    if name == "memory-store":
        return FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/kind")
    if name == "disk":
        return FsspecFilesystem(f"file://{root}")
    if name == "dir":
        return FsspecFilesystem(DirFileSystem(path=os.fspath(root), fs=LocalFileSystem()))
    if name == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        return FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{unique('pub')}")
    fake_gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
    return FsspecFilesystem(fake_gcs.gcsfs(), root=f"{GCS_BUCKET}/{unique('pub')}")


async def test_publish_file_only_over_the_version_seen(kind_fs: FsspecFilesystem, tmp_path: Path) -> None:
    from agentvfs.errors import FileExists

    def local_file(data: bytes) -> str:
        # A new file each time: local disk publishes by a hard link of the file itself.
        path = tmp_path / f"local-{len(data)}-{data[:4].hex()}"
        path.write_bytes(data)
        return os.fspath(path)

    version = await kind_fs.publish_file(local_file(b"first"), "d/f.bin", create=True)
    seen = await kind_fs.stat("d/f.bin")
    # Where the store gives the new version with the write, it is the one stat shows.
    assert version is None or version == seen.etag
    with pytest.raises(FileExists):
        await kind_fs.publish_file(local_file(b"again"), "d/f.bin", create=True)
    await kind_fs.publish_file(local_file(b"second!"), "d/f.bin", expected=Version.of(seen))
    assert await kind_fs.read_file("d/f.bin") == b"second!"
    # Published over a version that is not there any more: refused, nothing changed.
    with pytest.raises(StaleFileError) as stale:
        await kind_fs.publish_file(local_file(b"lost"), "d/f.bin", expected=Version.of(seen))
    assert stale.value.actual_mtime is not None
    assert await kind_fs.read_file("d/f.bin") == b"second!"
    current = await kind_fs.stat("d/f.bin")
    await kind_fs.delete_file("d/f.bin")
    with pytest.raises(StaleFileError) as gone:
        await kind_fs.publish_file(local_file(b"late"), "d/f.bin", expected=Version.of(current))
    assert gone.value.actual_mtime is None
    assert not await kind_fs.exists("d/f.bin")


async def test_a_pinned_read_serves_one_version_or_is_stale(kind_fs: FsspecFilesystem) -> None:
    await kind_fs.write_file("f.bin", b"A" * 4096)
    seen = await kind_fs.stat("f.bin")
    assert seen.etag is not None
    buffer = bytearray(10)
    assert await kind_fs.read_range_pinned("f.bin", 100, memoryview(buffer), seen.etag) == 10
    assert bytes(buffer) == b"A" * 10
    await kind_fs.write_file("f.bin", b"B" * 4096)
    if kind_fs.provider in ("s3", "gcs"):
        # The store answers only for that version: replaced means stale, never B's bytes.
        with pytest.raises(StaleFileError):
            await kind_fs.read_range_pinned("f.bin", 100, memoryview(buffer), seen.etag)
        await kind_fs.delete_file("f.bin")
        with pytest.raises(StaleFileError):
            await kind_fs.read_range_pinned("f.bin", 0, memoryview(buffer), seen.etag)
    else:
        # Elsewhere a read cannot name a version: it reads what is there.
        assert await kind_fs.read_range_pinned("f.bin", 100, memoryview(buffer), seen.etag) == 10
        assert bytes(buffer) == b"B" * 10
