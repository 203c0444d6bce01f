"""Snapshots: take, list, diff, restore and SnapshotFilesystem on every kind of storage.

Backends: fsspec memory, the reference MemoryBackend, local disk, S3 (moto; a bucket with
versioning off, and one with versioning on, where no content may be copied) and GCS
(fake-gcs-server; versioning off and on). Changes "made by someone else" are made in
storage directly (boto3, the inner filesystem), never through the snapshot code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceReadOnlyError
from agentvfs.errors import BlobIntegrityError, FileExists, SnapshotNotFoundError, StaleFileError
from agentvfs.snapshots import (
    DEFAULT_PREFIX,
    GarbageReport,
    SnapshotFilesystem,
    SnapshotStore,
    restore_snapshot,
    take_snapshot,
)
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.vfs import (
    BackendFilesystem,
    FileStat,
    MemoryBackend,
    TimeoutFilesystem,
    WorkspaceFilesystem,
    WrapperFilesystem,
    list_stats,
    put_new,
    sha256_hex,
    walk,
)
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = pytest.mark.anyio

BACKENDS = [
    "memory",
    "memory-backend",
    "local",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-versioned", marks=pytest.mark.s3),
    pytest.param("gcs", marks=pytest.mark.gcs),
    pytest.param("gcs-versioned", marks=pytest.mark.gcs),
]

BINARY = bytes(range(256)) * 64
LARGE = os.urandom(3 * 1024 * 1024 + 17)
SEED: dict[str, bytes] = {
    "README.md": b"# Project\nline two\n",
    "src/app.py": b"def main():\n    return 1\n",
    "src/data.bin": BINARY,
    "big/large.bin": LARGE,
    "\u00fcn\u00efc\u00f6de/\u65e5\u672c\u8a9e \u00e9t\u00e9.txt": "h\u00e9llo w\u00f6rld\n".encode(),
}


@dataclass
class Storage:
    """A workspace filesystem, and a way to change it behind the snapshot code's back."""

    fs: WorkspaceFilesystem
    kind: str
    boto: Any = None  # an S3 client, for changes made directly in the bucket
    bucket: str | None = None
    key_prefix: str | None = None

    async def put_directly(self, path: str, data: bytes) -> None:
        if self.boto is not None:
            self.boto.put_object(Bucket=self.bucket, Key=f"{self.key_prefix}/{path}", Body=data)
            return
        inner = self.fs.inner if isinstance(self.fs, WrapperFilesystem) else self.fs
        await inner.write_file(path, data)


def _versioned_gcs_bucket(server: FakeGcsServer) -> str:
    name = unique("vb")
    body = json.dumps({"name": name, "versioning": {"enabled": True}}).encode()
    request = urllib.request.Request(
        f"{server.endpoint_url}/storage/v1/b?project=test", data=body,
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    return name


def _versioned_s3_bucket(moto: MotoServer) -> str:
    name = unique("vb")
    moto.create_bucket(name)
    moto.boto3_client().put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture(params=BACKENDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Storage]:
    kind = request.param
    if kind == "memory":
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        made = Storage(FsspecFilesystem(raw, root=f"/{unique('ws')}"), kind)
    elif kind == "memory-backend":
        made = Storage(BackendFilesystem(MemoryBackend()), kind)
    elif kind == "local":
        os.makedirs(tmp_path / "ws")
        made = Storage(LocalFilesystem(str(tmp_path / "ws")), kind)
    elif kind.startswith("s3"):
        moto: MotoServer = request.getfixturevalue("moto")
        bucket = _versioned_s3_bucket(moto) if kind == "s3-versioned" else S3_BUCKET
        prefix = unique("ws")
        fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{bucket}/{prefix}")
        made = Storage(fs, kind, moto.boto3_client(), bucket, prefix)
    else:
        server: FakeGcsServer = request.getfixturevalue("fake_gcs")
        bucket = _versioned_gcs_bucket(server) if kind == "gcs-versioned" else GCS_BUCKET
        made = Storage(FsspecFilesystem(server.gcsfs(), root=f"{bucket}/{unique('ws')}"), kind)
    await made.fs.init()
    yield made
    await made.fs.destroy()


async def _seed(fs: WorkspaceFilesystem) -> None:
    for path, data in SEED.items():
        await fs.write_file(path, data)
    await fs.mkdir("empty/nested")


async def _blob_count(fs: WorkspaceFilesystem) -> int:
    try:
        entries = await walk(fs, f"{DEFAULT_PREFIX}/blobs")
    except FileNotFoundError:
        return 0
    return sum(1 for e in entries if e.type == "file")


async def test_round_trip(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    first = await ws.snapshot("before")
    assert set(first.files) == set(SEED)
    assert {"empty", "empty/nested", "src", "big"} <= first.directories
    assert not any(p.startswith(".agentvfs") for p in [*first.files, *first.directories])
    for path, data in SEED.items():
        record = first.files[path]
        assert record.sha256 == sha256_hex(data) and record.size == len(data)
        assert record.etag == (await fs.stat(path)).etag
    versioned = storage.kind.endswith("versioned")
    assert first.content == ("s3-versions" if storage.kind == "s3-versioned" else "gcs-generations" if versioned else "blobs")
    # No object data copied where the bucket keeps versions; else each content once.
    assert await _blob_count(fs) == (0 if versioned else len(SEED))

    await fs.write_file("README.md", b"# Project\nline two changed\n")
    await fs.delete_file("src/data.bin")
    await fs.write_file("added.txt", b"new\n")
    # moto lists a removed marker of a versioned bucket as a common prefix still (S3 does
    # not): there empty directories are neither removed nor added.
    dirs = storage.kind != "s3-versioned"
    gone = {"empty/nested"} if dirs else set()
    new = {"newdir"} if dirs else set()
    if dirs:
        await fs.rmdir("empty/nested")
        await fs.mkdir("newdir")

    diff = await ws.diff("before")
    assert diff.changed == ("README.md",)
    assert set(diff.removed) == {"src/data.bin", *gone}
    assert set(diff.added) == {"added.txt", *new}
    readme = next(c for c in diff.changes if c.path == "README.md")
    assert readme.patch is not None and "-line two\n" in readme.patch and "+line two changed\n" in readme.patch
    binary = next(c for c in diff.changes if c.path == "src/data.bin")
    assert binary.patch is None  # binary: no line diff
    assert "+new" in (next(c for c in diff.changes if c.path == "added.txt").patch or "")

    # Without force: what was deleted comes back; what changed after the snapshot stays.
    gentle = await ws.restore("before")
    assert set(gentle.restored) == {"src/data.bin", *gone}
    assert {(c.path, c.reason) for c in gentle.conflicts} == {
        ("README.md", "modified"), ("added.txt", "added"), *(("newdir", "added") for _ in new),
    }  # fmt: skip
    assert await fs.read_file("src/data.bin") == BINARY
    assert await fs.read_file("README.md") == b"# Project\nline two changed\n"

    forced = await ws.restore("before", force=True)
    assert set(forced.restored) == {"README.md", "added.txt", *new} and forced.complete
    for path, data in SEED.items():
        assert await fs.read_file(path) == data
    assert not await fs.exists("added.txt") and not await fs.exists("newdir")
    assert await fs.exists("empty/nested")
    assert not await ws.diff("before")
    assert not await ws.diff("before", (await ws.snapshot("after")).id)


async def test_incremental_snapshots_copy_only_new_content(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    await ws.snapshot()
    blobs = await _blob_count(fs)
    second = await ws.snapshot()
    assert await _blob_count(fs) == blobs  # nothing new: nothing written
    await fs.write_file("src/app.py", b"changed\n")
    third = await ws.snapshot()
    versioned = storage.kind.endswith("versioned")
    assert await _blob_count(fs) == blobs + (0 if versioned else 1)
    assert third.files["src/app.py"].sha256 == sha256_hex(b"changed\n")
    assert third.files["README.md"] == second.files["README.md"]
    if versioned:
        assert third.files["src/app.py"].version != second.files["src/app.py"].version
        # The old version is still readable: the pinned content of the second snapshot.
        old = SnapshotFilesystem(fs, second.id)
        assert await old.read_file("src/app.py") == SEED["src/app.py"]


async def test_snapshot_filesystem_shows_the_original_versions(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    taken = await ws.snapshot("base")
    await fs.write_file("README.md", b"later\n")
    snap = await ws.open_snapshot("base")
    assert snap.read_only and snap.snapshot.id == taken.id
    for path, data in SEED.items():
        assert await snap.read_file(path) == data
    assert (await snap.read_file("README.md", encoding="utf-8")) == SEED["README.md"].decode()
    names = {e.name for e in await snap.readdir("", recursive=True)}
    assert {*SEED, "empty", "empty/nested", "src", "big"} <= names and "added.txt" not in names
    assert [e.name for e in await snap.readdir("src")] == ["app.py", "data.bin"]
    with pytest.raises(NotADirectoryError):
        await snap.readdir("src/app.py")
    with pytest.raises(IsADirectoryError):
        await snap.read_file("src")
    with pytest.raises(FileNotFoundError):
        await snap.stat("added.txt")
    with pytest.raises(WorkspaceReadOnlyError):
        await snap.write_file("x.txt", "no")
    # stat carries the ETag the file had then: a guarded write of the live file with it
    # succeeds where the live file is still that version, and is refused where it is not.
    unchanged = await snap.stat("src/app.py")
    assert unchanged.etag == taken.files["src/app.py"].etag and unchanged.size == len(SEED["src/app.py"])
    await fs.write_file("src/app.py", b"edit on the snapshot's version\n", expected_mtime=unchanged)
    with pytest.raises(StaleFileError):
        await fs.write_file("README.md", b"stale edit\n", expected_mtime=await snap.stat("README.md"))


async def test_restore_refuses_a_change_made_in_storage_unless_forced(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    await ws.snapshot("base")
    await fs.delete_file("src/app.py")
    await storage.put_directly("README.md", b"changed directly in storage\n")
    result = await ws.restore("base")
    assert [(c.path, c.reason) for c in result.conflicts] == [("README.md", "modified")]
    assert result.restored == ("src/app.py",) and not result.complete
    assert await fs.read_file("README.md") == b"changed directly in storage\n"
    forced = await ws.restore("base", ["README.md"], force=True)
    assert forced.restored == ("README.md",) and forced.complete
    assert await fs.read_file("README.md") == SEED["README.md"]


class _InterferingFilesystem(WrapperFilesystem):
    """A real filesystem with a concurrent writer: the first time ``trigger`` runs for
    ``path``, it writes ``data`` there through the inner filesystem first."""

    def __init__(self, inner: WorkspaceFilesystem, on: str, path: str, data: bytes) -> None:
        super().__init__(inner)
        self.on, self.path, self.data, self.fired = on, path, data, False

    async def _fire(self, operation: str) -> None:
        if operation == self.on and not self.fired:
            self.fired = True
            await self.inner.write_file(self.path, self.data)

    async def list_stats(self, path: str = "") -> list[FileStat]:
        # The listing the snapshot works from is taken before the concurrent write lands.
        stats = await list_stats(self.inner, path)
        if path == "":
            await self._fire("list")
        return stats

    async def write_file(self, path: str, content: str | bytes, **options: Any) -> None:
        if path == self.path:
            await self._fire("write")
        await self.inner.write_file(path, content, **options)


async def test_a_write_during_a_snapshot_gives_a_consistent_record(storage: Storage) -> None:
    await _seed(storage.fs)
    fs = _InterferingFilesystem(storage.fs, "list", "README.md", b"written while the snapshot runs\n")
    snapshot = await take_snapshot(fs)
    assert fs.fired
    record = snapshot.files["README.md"]
    live = await storage.fs.stat("README.md")
    # The record is of one version: the one written meanwhile (its ETag, its size, its hash).
    assert record.etag == live.etag and record.size == live.size
    assert record.sha256 == sha256_hex(b"written while the snapshot runs\n")
    assert await SnapshotFilesystem(storage.fs, snapshot).read_file("README.md") == b"written while the snapshot runs\n"


async def test_restore_never_overwrites_a_change_made_while_it_runs(storage: Storage) -> None:
    await _seed(storage.fs)
    ws = Workspace(filesystem=storage.fs)
    await ws.snapshot("base")
    await storage.fs.write_file("README.md", b"edited after the snapshot\n")
    racing = _InterferingFilesystem(storage.fs, "write", "README.md", b"edited during the restore\n")
    store = ws.snapshot_store()
    from agentvfs.snapshots import restore_snapshot

    result = await restore_snapshot(racing, "base", store=store, force=True)
    assert racing.fired
    assert [(c.path, c.reason) for c in result.conflicts] == [("README.md", "changed during restore")]
    assert await storage.fs.read_file("README.md") == b"edited during the restore\n"


@pytest.mark.parametrize("backend", ["memory", pytest.param("s3", marks=pytest.mark.s3)])
async def test_tampered_manifest_and_blob_are_refused(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "memory":
        fs: WorkspaceFilesystem = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/t")
    else:
        fs = FsspecFilesystem(request.getfixturevalue("moto").s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{unique('ws')}")
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    taken = await ws.snapshot("base")
    store = ws.snapshot_store()
    # A blob changed in storage: the restore reads and checks everything before it writes.
    await fs.delete_file("src/app.py")
    await fs.write_file("README.md", b"mine\n")
    blob = store.blobs.path(taken.files["src/app.py"].sha256)
    await fs.write_file(blob, b"def main():\n    return 'evil'\n")
    with pytest.raises(BlobIntegrityError, match="does not match hash"):
        await ws.restore("base", force=True)
    assert not await fs.exists("src/app.py")
    assert await fs.read_file("README.md") == b"mine\n"  # nothing was written
    with pytest.raises(BlobIntegrityError):
        await (await ws.open_snapshot("base")).read_file("src/app.py")
    # A manifest changed in storage no longer hashes to its id: refused by id and by name.
    path = store.manifest_path(taken.id)
    raw = await fs.read_file(path)
    assert isinstance(raw, bytes)
    await fs.write_file(path, raw.replace(b"README.md", b"READ_ME.md"))
    for ref in (taken.id, "base"):
        with pytest.raises((BlobIntegrityError, SnapshotNotFoundError)):
            await ws.restore(ref, force=True)
    with pytest.raises(BlobIntegrityError, match="does not match its id"):
        await store.load(taken.id)
    assert await fs.read_file("README.md") == b"mine\n"
    # Deleted by its id without being read; gone from the listing too.
    assert await ws.delete_snapshot(taken.id) == taken.id
    assert await ws.list_snapshots() == []


async def test_read_only_workspace_snapshots_into_a_given_store(tmp_path: Any) -> None:
    raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
    writable = FsspecFilesystem(raw, root="/ro")
    await _seed(writable)
    ro = FsspecFilesystem(raw, root="/ro", read_only=True)
    with pytest.raises(WorkspaceReadOnlyError, match="snapshot_store"):
        await Workspace(filesystem=ro).snapshot()
    elsewhere = f"file://{tmp_path}/snapshots"
    ws = Workspace(filesystem=ro, snapshot_store=elsewhere)
    taken = await ws.snapshot("ro")
    assert set(taken.files) == set(SEED)
    assert not await writable.exists(".agentvfs")
    assert os.path.isdir(tmp_path / "snapshots" / "manifests")
    assert [i.name for i in await ws.list_snapshots()] == ["ro"]
    await writable.write_file("README.md", b"changed\n")
    assert (await ws.diff("ro")).changed == ("README.md",)
    with pytest.raises(WorkspaceReadOnlyError):
        await ws.restore("ro", force=True)
    # The same store serves another workspace object of the same storage (a new process).
    again = Workspace(filesystem=writable, snapshot_store=elsewhere)
    assert (await again.restore("ro", force=True)).restored == ("README.md",)


async def test_names_ids_and_listing() -> None:
    fs = BackendFilesystem(MemoryBackend())
    ws = Workspace(filesystem=fs)
    assert await ws.list_snapshots() == []
    await fs.write_file("a.txt", "1")
    one = await ws.snapshot("x")
    await fs.write_file("a.txt", "2")
    two = await ws.snapshot("x")
    unnamed = await ws.snapshot()
    listed = await ws.list_snapshots()
    assert [i.id for i in listed] == [one.id, two.id, unnamed.id]
    assert listed[0].files == 1 and listed[0].bytes == 1 and listed[2].name is None
    store = ws.snapshot_store()
    assert (await store.resolve("x")).id == two.id  # the newest of that name
    assert (await store.resolve(one.id[:10])).id == one.id
    assert (await store.resolve(one.id)).id == one.id
    with pytest.raises(SnapshotNotFoundError, match="No snapshot 'nope'"):
        await ws.restore("nope")
    with pytest.raises(ValueError, match="snapshot name"):
        await ws.snapshot("bad\nname")
    with pytest.raises(TypeError, match="list of paths"):
        await ws.restore("x", "a.txt")
    with pytest.raises(ValueError, match=r"\.agentvfs"):
        await ws.restore("x", [".agentvfs/snapshots"])
    # Agentvfs's own directory is neither snapshotted nor compared.
    assert not any(c.path.startswith(".agentvfs") for c in (await ws.diff(one.id)).changes)


async def test_delete_snapshot(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    old = await ws.snapshot("old")
    await fs.write_file("src/app.py", b"changed\n")
    new = await ws.snapshot("new")
    blobs = await _blob_count(fs)
    with pytest.raises(ValueError, match="snapshot"):
        await ws.delete_snapshot("")
    with pytest.raises(SnapshotNotFoundError):
        await ws.delete_snapshot("nope")
    assert await ws.delete_snapshot("old") == old.id
    assert [i.id for i in await ws.list_snapshots()] == [new.id]
    with pytest.raises(SnapshotNotFoundError):
        await ws.restore("old")
    with pytest.raises(SnapshotNotFoundError):
        await ws.delete_snapshot(old.id)  # already gone
    store = ws.snapshot_store()
    assert not await fs.exists(store.manifest_path(old.id))
    # Blobs stay (content other snapshots may share); the snapshot left restores in full.
    assert await _blob_count(fs) == blobs
    await fs.delete_file("src/app.py")
    result = await ws.restore(new.id[:8])
    assert result.restored == ("src/app.py",) and await fs.read_file("src/app.py") == b"changed\n"
    assert await ws.delete_snapshot(new.id[:8]) == new.id
    assert await ws.list_snapshots() == []


async def test_delete_snapshot_refuses_on_a_read_only_store(tmp_path: Any) -> None:
    await LocalFilesystem(str(tmp_path)).write_file("a.txt", "1")
    taken = await Workspace(filesystem=LocalFilesystem(str(tmp_path))).snapshot()
    reader = Workspace(filesystem=LocalFilesystem(str(tmp_path), read_only=True))
    with pytest.raises(WorkspaceReadOnlyError):
        await reader.delete_snapshot(taken.id)
    assert [i.id for i in await reader.list_snapshots()] == [taken.id]


async def test_restore_of_selected_paths(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    await ws.snapshot("base")
    await fs.write_file("src/app.py", b"x\n")
    await fs.write_file("README.md", b"y\n")
    await fs.delete_file("big/large.bin")
    result = await ws.restore("base", ["src", "big/large.bin"], force=True)
    assert set(result.restored) == {"src/app.py", "big/large.bin"}
    assert await fs.read_file("README.md") == b"y\n"
    assert await fs.read_file("big/large.bin") == LARGE


async def test_symbolic_links_on_local_disk(tmp_path: Any) -> None:
    root = tmp_path / "ws"
    os.makedirs(root / "d")
    (root / "d" / "f.txt").write_bytes(b"target\n")
    os.symlink("d/f.txt", root / "link")
    os.symlink("d", root / "dirlink")
    fs = LocalFilesystem(str(root))
    ws = Workspace(filesystem=fs)
    taken = await ws.snapshot("links")
    assert dict(taken.links) == {"link": "d/f.txt", "dirlink": "d"}
    assert "dirlink/f.txt" not in taken.files  # a link is recorded, not followed
    snap = await ws.open_snapshot("links")
    assert await snap.read_file("link") == b"target\n"
    assert (await snap.stat("link")).link_target == "d/f.txt"
    assert await snap.read_file("dirlink/f.txt") == b"target\n"
    os.unlink(root / "link")
    os.unlink(root / "dirlink")
    os.symlink("elsewhere", root / "dirlink")
    assert set((await ws.diff("links")).removed) == {"link"}
    assert set((await ws.diff("links")).changed) == {"dirlink"}
    result = await ws.restore("links", force=True)
    assert set(result.restored) >= {"link", "dirlink"}
    assert os.readlink(root / "link") == "d/f.txt" and os.readlink(root / "dirlink") == "d"


async def test_snapshot_of_a_kind_change_restores_with_force() -> None:
    fs = BackendFilesystem(MemoryBackend())
    await fs.write_file("thing/inner.txt", "inner")
    await fs.write_file("file.txt", "file")
    ws = Workspace(filesystem=fs)
    await ws.snapshot("base")
    await fs.rmdir("thing", recursive=True)
    await fs.write_file("thing", "now a file")
    await fs.delete_file("file.txt")
    await fs.write_file("file.txt/below.txt", "now a directory")
    gentle = await ws.restore("base")
    assert {(c.path, c.reason) for c in gentle.conflicts} >= {("thing", "type"), ("file.txt", "type")}
    assert await fs.read_file("thing") == b"now a file"
    forced = await ws.restore("base", force=True)
    assert forced.complete, forced.conflicts
    assert await fs.read_file("thing/inner.txt") == b"inner" and await fs.read_file("file.txt") == b"file"


async def test_snapshot_of_a_versioned_bucket_reads_nothing_twice(moto: MotoServer) -> None:
    bucket = _versioned_s3_bucket(moto)
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{bucket}/{uuid.uuid4().hex[:8]}")
    await fs.write_file("a.txt", "one")
    ws = Workspace(filesystem=fs)
    first = await ws.snapshot()
    assert first.files["a.txt"].version not in (None, "null")
    # The object is deleted in the bucket: its pinned version still restores it.
    moto.boto3_client().delete_object(Bucket=bucket, Key=f"{fs.root.partition('/')[2]}/a.txt")
    result = await ws.restore(first.id)
    assert result.restored == ("a.txt",) and await fs.read_file("a.txt") == b"one"
    # Expired versions (a lifecycle rule) are reported, nothing is written.
    version = first.files["a.txt"].version
    moto.boto3_client().delete_object(Bucket=bucket, Key=f"{fs.root.partition('/')[2]}/a.txt", VersionId=version)
    with pytest.raises(FileNotFoundError, match="is gone"):
        await (await ws.open_snapshot(first.id)).read_file("a.txt")


async def test_put_new_creates_a_file_once_and_never_replaces_it(storage: Storage) -> None:
    """The blob store's writes (``put_new``): parents made, content whole, an existing file
    left as it is, on every backend and through a wrapper."""
    fs = storage.fs
    await put_new(fs, "made/by/put_new.bin", BINARY)
    assert await fs.read_file("made/by/put_new.bin") == BINARY
    assert (await fs.stat("made/by")).type == "directory"
    with pytest.raises(FileExists):
        await put_new(TimeoutFilesystem(fs, 30_000), "made/by/put_new.bin", b"other bytes")
    assert await fs.read_file("made/by/put_new.bin") == BINARY
    assert [e.name for e in await walk(fs, "made")] == ["by", "by/put_new.bin"]


async def test_put_new_refuses_on_a_read_only_filesystem(tmp_path: Any) -> None:
    raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
    fs = FsspecFilesystem(raw, root=f"/{unique('ro')}", read_only=True)
    with pytest.raises(WorkspaceReadOnlyError):
        await put_new(fs, "a.bin", b"x")
    with pytest.raises(WorkspaceReadOnlyError):
        await put_new(LocalFilesystem(str(tmp_path), read_only=True), "a.bin", b"x")
    assert not os.path.exists(tmp_path / "a.bin")


@pytest.mark.s3
async def test_a_first_snapshot_stores_each_blob_with_one_request(moto: MotoServer) -> None:
    """Blobs go to ``blobs/<h[:2]>/``, a new directory for most: each is one create-only PUT,
    with no listing or HEAD of its parents (these used to cost a listing per blob once the
    parent's kept listing expired, and more for a directory not seen before)."""
    raw = moto.s3fs(use_listings_cache=False)
    fs = FsspecFilesystem(raw, root=f"{S3_BUCKET}/{unique('ws')}", listing_ttl=0)
    files = {f"d{i % 3}/f{i:02d}.txt": f"file {i}\n".encode() * (i + 1) for i in range(60)}
    for path, data in files.items():
        await fs.write_file(path, data)
    sent: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: sent.append(model.name))
    snapshot = await Workspace(filesystem=fs).snapshot()
    assert len(snapshot.files) == len(files)
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    assert await store.blobs.digests() == {sha256_hex(d) for d in files.values()}
    puts = sent.count("PutObject")
    # The blobs, the manifest and its listing record, the lease, and the marker that keeps
    # locks/ when the lease goes.
    assert puts == len(files) + 4, Counter(sent)
    checks = sent.count("ListObjectsV2") + sent.count("HeadObject")
    # The workspace's scan, the store's and the lease's, whatever the number of blobs (31 for
    # 40 blobs or 60; before, 301 for 40).
    assert checks <= 40, Counter(sent)


async def test_garbage_collection_deletes_only_blobs_no_snapshot_holds(storage: Storage) -> None:
    fs = storage.fs
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    store = ws.snapshot_store()
    first = await ws.snapshot("first")
    await fs.write_file("src/app.py", b"second version\n")
    second = await ws.snapshot("second")
    blobs = await _blob_count(fs)
    versioned = storage.kind.endswith("versioned")
    # Everything is held: nothing goes, whatever the grace.
    report = await store.collect_garbage(grace=timedelta(0))
    assert (report.blobs_deleted, report.blobs_kept) == (0, blobs)
    await ws.delete_snapshot("first")
    # Unheld now, but written within the grace period: kept.
    assert (await store.collect_garbage()).blobs_deleted == 0
    assert await _blob_count(fs) == blobs
    await anyio.sleep(1.1)  # object stores keep times to the second
    report = await store.collect_garbage(grace=timedelta(seconds=1))
    gone = first.files["src/app.py"].sha256
    if versioned:
        assert blobs == 0 and report.blobs_deleted == 0  # versions, not blobs: nothing to collect
    else:
        assert (report.blobs_deleted, report.bytes_freed) == (1, len(SEED["src/app.py"]))
        assert not await store.blobs.has(gone)
        assert report.blobs_kept == blobs - 1
    # No lease or claim is left behind.
    assert [e.name for e in await fs.readdir(f"{DEFAULT_PREFIX}/locks")] == []
    # The snapshot kept restores in full.
    for path in SEED:
        await fs.delete_file(path)
    result = await ws.restore("second")
    assert set(result.restored) >= set(SEED)
    assert await fs.read_file("src/app.py") == b"second version\n"
    assert await fs.read_file("big/large.bin") == LARGE
    # Nothing left to collect.
    assert (await store.collect_garbage(grace=timedelta(0))).blobs_deleted == 0
    assert [i.id for i in await ws.list_snapshots()] == [second.id]


async def test_garbage_collection_refuses_what_it_cannot_account_for() -> None:
    fs = BackendFilesystem(MemoryBackend())
    await _seed(fs)
    ws = Workspace(filesystem=fs)
    store = ws.snapshot_store()
    taken = await ws.snapshot()
    blobs = await _blob_count(fs)
    with pytest.raises(ValueError, match="grace must not be negative"):
        await store.collect_garbage(grace=timedelta(seconds=-1))
    # A manifest changed in storage: what it holds is unknown, nothing is deleted.
    path = store.manifest_path(taken.id)
    raw = await fs.read_file(path)
    assert isinstance(raw, bytes)
    await fs.write_file(path, raw.replace(b"README.md", b"READ_ME.md"))
    with pytest.raises(BlobIntegrityError, match=f"Garbage collection is refused.*--delete {taken.id}"):
        await store.collect_garbage(grace=timedelta(0))
    assert await _blob_count(fs) == blobs
    await ws.delete_snapshot(taken.id)  # by id: deleted without being read
    # A skill store sharing the directory: its blobs would look unused.
    await fs.write_file(f"{DEFAULT_PREFIX}/skills/pdf/versions/x.json", b"{}")
    with pytest.raises(ValueError, match="'skills', which is not part of a snapshot store"):
        await store.collect_garbage(grace=timedelta(0))
    assert await _blob_count(fs) == blobs
    await fs.rmdir(f"{DEFAULT_PREFIX}/skills", recursive=True)
    await anyio.sleep(0.01)
    assert (await store.collect_garbage(grace=timedelta(0))).blobs_deleted == blobs


class _SlowManifestFilesystem(WrapperFilesystem):
    """A store filesystem on which writing a manifest waits ``pause`` seconds: ``reached``
    is set when a snapshot's blobs are stored and its manifest is about to be written."""

    def __init__(self, inner: WorkspaceFilesystem, pause: float = 0.6) -> None:
        super().__init__(inner)
        self.reached = anyio.Event()
        self.pause = pause

    async def write_file(self, path: str, content: str | bytes, **options: Any) -> None:
        if "/manifests/" in path:
            self.reached.set()
            await anyio.sleep(self.pause)
        await self.inner.write_file(path, content, **options)


def _age(directory: Any, seconds: float) -> None:
    then = time.time() - seconds
    for dirpath, _, names in os.walk(directory):
        for name in names:
            os.utime(os.path.join(dirpath, name), (then, then))


async def test_a_collection_waits_for_a_snapshot_that_counts_on_stored_blobs(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"content a\n")
    await fs.write_file("b.txt", b"content b\n")
    ws = Workspace(filesystem=fs)
    first = await ws.snapshot()
    await ws.delete_snapshot(first.id)
    _age(tmp_path / DEFAULT_PREFIX / "blobs", 7200)  # unheld and past the grace period
    slow = _SlowManifestFilesystem(fs)
    reports: list[GarbageReport] = []
    failures: list[BaseException] = []

    async def collect(wait: float) -> None:
        await slow.reached.wait()
        try:
            reports.append(await SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=wait).collect_garbage())
        except TimeoutError as exc:
            failures.append(exc)

    # The new snapshot finds both contents stored and writes nothing; a collection starting
    # before its manifest is saved gives way (first one giving up, then one that waits).
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, 0.2)
        second = await take_snapshot(fs, SnapshotStore(slow, prefix=DEFAULT_PREFIX))
    assert len(failures) == 1 and "snapshots of" in str(failures[0]) and "locks/snapshot-" in str(failures[0])
    slow.reached = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, 30.0)
        third = await take_snapshot(fs, SnapshotStore(slow, prefix=DEFAULT_PREFIX))
    assert reports == [GarbageReport(0, 0, 2)]  # ran after the manifest was saved: both held
    for taken in (second, third):
        content = SnapshotFilesystem(fs, taken)
        assert await content.read_file("a.txt") == b"content a\n"
        assert await content.read_file("b.txt") == b"content b\n"


def _signed_lock(store: SnapshotStore, path: str, **fields: Any) -> bytes:
    """The record a process with the store's key writes at ``path`` (as
    ``SnapshotStore._record``), with ``fields`` changed."""
    from agentvfs.snapshots._store import _lock_record, _lock_signed_bytes

    record = {**_lock_record(store.stale_after.total_seconds()), **fields}
    record["mac"] = store.key.sign("lock", _lock_signed_bytes(path, record))
    return json.dumps(record).encode()


async def test_a_snapshot_waits_for_a_collection_and_ignores_a_dead_ones_claim(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"a\n")
    claim = f"{DEFAULT_PREFIX}/locks/gc-0123456789abcdef.json"
    signer = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    await fs.write_file(claim, _signed_lock(signer, claim, host="h", pid=1))
    with pytest.raises(TimeoutError, match=r"garbage collection of .* under way .*gc-0123456789abcdef\.json"):
        await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.3))
    # Released while a snapshot waits: it goes on.
    async with anyio.create_task_group() as tg:

        async def release() -> None:
            await anyio.sleep(0.4)
            await fs.delete_file(claim)

        tg.start_soon(release)
        taken = await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=30))
    assert set(taken.files) == {"a.txt"}
    # A claim not renewed for stale_after was left by a process that died: ignored, and
    # removed by the next collection. Its age is the storage's (the listed time), whatever
    # clock its writer had; a claim that is not a lock record at all is aged the same way.
    await fs.write_file(claim, _signed_lock(signer, claim, at=time.time() + 7200, host="h", pid=1))
    garbage = f"{DEFAULT_PREFIX}/locks/gc-garbage.json"
    await fs.write_file(garbage, b"")
    with pytest.raises(TimeoutError):
        await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.3))
    _age(tmp_path / DEFAULT_PREFIX / "locks", 7200)
    await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.3))
    await SnapshotStore(fs, prefix=DEFAULT_PREFIX).collect_garbage()
    assert not await fs.exists(claim) and not await fs.exists(garbage)
    assert [e.name for e in await fs.readdir(f"{DEFAULT_PREFIX}/locks")] == []


async def test_locks_are_renewed_while_held_and_removed_when_cancelled(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"a\n")
    locks = f"{DEFAULT_PREFIX}/locks"
    slow = _SlowManifestFilesystem(fs, pause=1.5)
    # A snapshot longer than stale_after keeps its lease fresh: a collection gives way.
    quick = timedelta(seconds=0.5)
    failures: list[BaseException] = []

    async def collect() -> None:
        await slow.reached.wait()
        await anyio.sleep(1.0)  # the lease's first write is older than stale_after by now
        try:
            await SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.2, stale_after=quick).collect_garbage()
        except TimeoutError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await take_snapshot(fs, SnapshotStore(slow, prefix=DEFAULT_PREFIX, stale_after=quick))
    assert len(failures) == 1 and "locks/snapshot-" in str(failures[0])
    assert await fs.readdir(locks) == []
    # Cancelled while it holds its lease (a timeout), or while it waits: nothing is left.
    slow.reached = anyio.Event()
    with anyio.move_on_after(0.5):
        await take_snapshot(fs, SnapshotStore(slow, prefix=DEFAULT_PREFIX))
    assert slow.reached.is_set() and await fs.readdir(locks) == []
    claim = f"{locks}/gc-0123456789abcdef.json"
    await fs.write_file(claim, _lock_json())
    with anyio.move_on_after(0.5):
        await take_snapshot(fs, SnapshotStore(fs, prefix=DEFAULT_PREFIX))
    assert [e.name for e in await fs.readdir(locks)] == ["gc-0123456789abcdef.json"]
    await fs.delete_file(claim)
    # A collection cancelled while it waits for a snapshot leaves no claim.
    lease = f"{locks}/snapshot-0123456789abcdef.json"
    await fs.write_file(lease, _lock_json())
    with anyio.move_on_after(0.5):
        await SnapshotStore(fs, prefix=DEFAULT_PREFIX).collect_garbage()
    assert [e.name for e in await fs.readdir(locks)] == ["snapshot-0123456789abcdef.json"]


def _lock_json() -> bytes:
    return json.dumps({"at": time.time(), "host": "elsewhere", "pid": 1}).encode()


_DIE_HOLDING = """
import os, signal, sys
import anyio
from agentvfs import LocalFilesystem
from agentvfs.snapshots import DEFAULT_PREFIX, SnapshotStore

async def main() -> None:
    store = SnapshotStore(LocalFilesystem(sys.argv[1]), prefix=DEFAULT_PREFIX)
    if sys.argv[2] == "lease":
        async with store.taking():
            print("held", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    async with store._lock("gc"):
        print("held", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
"""


@pytest.mark.parametrize("kind", ["lease", "claim"])
async def test_a_lock_of_a_process_killed_holding_it_holds_nobody_off(tmp_path: Any, kind: str) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"a\n")
    with anyio.fail_after(120):
        died = await anyio.run_process([sys.executable, "-c", _DIE_HOLDING, str(tmp_path), kind], check=False)
    assert died.returncode == -signal.SIGKILL and died.stdout == b"held\n", died.stderr
    locks = f"{DEFAULT_PREFIX}/locks"
    assert len(await fs.readdir(locks)) == 1  # left behind, and fresh
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.5)
    # Its process is gone: neither a snapshot nor a collection waits for it.
    started = time.monotonic()
    taken = await take_snapshot(fs, store)
    report = await store.collect_garbage(grace=timedelta(0))
    assert time.monotonic() - started < 5
    assert set(taken.files) == {"a.txt"} and report.blobs_deleted == 0
    assert await fs.readdir(locks) == []  # removed by the collection


async def test_a_store_inside_the_workspace_is_refused(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("a.txt", b"a\n")
    inside = [
        SnapshotStore(fs),  # the workspace's own root
        SnapshotStore(fs, prefix="snaps"),
        SnapshotStore(LocalFilesystem(str(tmp_path / "snaps"), contained=False)),
        SnapshotStore(f"file://{tmp_path}/deep/snaps"),
        SnapshotStore(LocalFilesystem(str(tmp_path.parent), contained=False), prefix=f"{tmp_path.name}/snaps"),
    ]
    for store in inside:
        with pytest.raises(ValueError, match="is inside the workspace it records"):
            await take_snapshot(fs, store)
        with pytest.raises(ValueError, match="is inside the workspace it records"):
            await restore_snapshot(fs, "0" * 64, store=store)
    with pytest.raises(ValueError, match="is inside the workspace it records"):
        await Workspace(filesystem=fs, snapshot_store=fs).snapshot()
    assert await fs.read_file("a.txt") == b"a\n" and not os.path.exists(tmp_path / "snaps")
    # In agentvfs's own directory, or beside the workspace, it is fine.
    own = await take_snapshot(fs, SnapshotStore(fs, prefix=".agentvfs/other"))
    beside = await take_snapshot(LocalFilesystem(str(tmp_path / "deep")), SnapshotStore(fs, prefix="snaps2"))
    assert set(own.files) == {"a.txt"} and beside.files == {}


class _FailingRenewals(WrapperFilesystem):
    """A store filesystem on which every write of a lock after the first fails."""

    def __init__(self, inner: WorkspaceFilesystem) -> None:
        super().__init__(inner)
        self.lock_writes = 0

    async def write_file(self, path: str, content: str | bytes, **options: Any) -> None:
        if "/locks/" in path:
            self.lock_writes += 1
            if self.lock_writes > 1:
                raise PermissionError(13, "throttled", path)
        await self.inner.write_file(path, content, **options)


async def test_a_lock_that_cannot_be_renewed_stops_its_holder(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    store = SnapshotStore(_FailingRenewals(fs), prefix=DEFAULT_PREFIX, stale_after=timedelta(seconds=0.5))
    ran: list[bool] = []

    async def hold() -> None:
        async with store.taking():
            await anyio.sleep(5)  # longer than stale_after: the lease must not go stale unnoticed
            ran.append(True)

    with pytest.raises(TimeoutError, match="could not be renewed"):
        await hold()
    assert not ran
    assert await fs.readdir(f"{DEFAULT_PREFIX}/locks") == []


async def test_a_lock_is_stale_by_its_holders_setting_when_that_is_longer(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    patient = SnapshotStore(fs, prefix=DEFAULT_PREFIX, stale_after=timedelta(hours=1))
    hasty = SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=0.2, stale_after=timedelta(seconds=1))
    async with patient.taking():
        _age(tmp_path / DEFAULT_PREFIX / "locks", 60)  # a minute since its last renewal
        with pytest.raises(TimeoutError, match="locks/snapshot-"):
            await hasty.collect_garbage()
    with pytest.raises(ValueError, match="stale_after must be longer than 0"):
        SnapshotStore(fs, stale_after=timedelta(0))
    with pytest.raises(ValueError, match="lock_wait must be 0 seconds or more"):
        SnapshotStore(fs, lock_wait=-1)


async def test_an_interrupt_while_holding_a_lock_comes_out_as_itself(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    cause = KeyError("why")

    async def hold(exc: BaseException) -> None:
        async with store.taking():
            raise exc

    with pytest.raises(KeyboardInterrupt):
        await hold(KeyboardInterrupt())
    failure = ValueError("what")
    failure.__cause__ = cause
    with pytest.raises(ValueError) as caught:
        await hold(failure)
    assert caught.value.__cause__ is cause
    assert await fs.readdir(f"{DEFAULT_PREFIX}/locks") == []


async def test_reading_a_snapshot_whose_blobs_were_collected_names_the_file(tmp_path: Any) -> None:
    fs = LocalFilesystem(str(tmp_path))
    await fs.write_file("notes/a.txt", b"a\n")
    ws = Workspace(filesystem=fs)
    taken = await ws.snapshot()
    held = await ws.open_snapshot(taken.id)  # kept open while the snapshot goes
    await ws.delete_snapshot(taken.id)
    await ws.snapshot_store().collect_garbage(grace=timedelta(0))
    with pytest.raises(FileNotFoundError, match=rf"notes/a\.txt \(its content in snapshot {taken.id[:12]}, blob "):
        await held.read_file("notes/a.txt")


_SNAPSHOTTER_OR_COLLECTOR = """
import hashlib, random, sys, time
from datetime import timedelta
import anyio, s3fs
from agentvfs import FsspecFilesystem
from agentvfs.snapshots import DEFAULT_PREFIX, SnapshotStore, take_snapshot

endpoint, root, role, seconds, seed = sys.argv[1:]
raw = s3fs.S3FileSystem(
    key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True, use_listings_cache=False,
    client_kwargs={"verify": False, "region_name": "us-east-1"},
)
fs = FsspecFilesystem(raw, root=root)
store = SnapshotStore(fs, prefix=DEFAULT_PREFIX, lock_wait=120)
rng = random.Random(int(seed))

async def main() -> None:
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        if role == "snapshots":
            # Few variants per file: a snapshot keeps finding content stored for an earlier
            # snapshot, which the collector may just have found unheld.
            for i in rng.sample(range(30), 8):
                await fs.write_file(f"f{i}.txt", f"variant {rng.randrange(3)} of f{i}\\n")
            taken = await take_snapshot(fs, store)
            print("snapshot", taken.id, flush=True)
            await anyio.sleep(rng.uniform(0, 0.1))
        else:
            # Half the snapshots (by id) are kept for the check at the end, the rest deleted.
            for info in (await store.list())[:-1]:
                if info.id[0] in "89abcdef":
                    await store.delete(info.id)
            report = await store.collect_garbage(grace=timedelta(0))
            print("collected", report.blobs_deleted, flush=True)

anyio.run(main)
"""


@pytest.mark.s3
async def test_two_processes_snapshotting_and_collecting_one_bucket(moto: MotoServer) -> None:
    """One process takes snapshots of a changing workspace while another deletes about half of
    them and collects garbage, both on one S3 store with no grace period: every
    snapshot left holds every blob it names, whole."""
    import hashlib

    root = f"{S3_BUCKET}/{unique('race')}"
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=root)
    for i in range(30):
        await fs.write_file(f"f{i}.txt", f"variant 0 of f{i}\n")
    argv = [sys.executable, "-c", _SNAPSHOTTER_OR_COLLECTOR, moto.endpoint_url, root]
    outputs: dict[str, str] = {}

    async def run(role: str, seed: int) -> None:
        done = await anyio.run_process([*argv, role, "10", str(seed)], check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        outputs[role] = done.stdout.decode()

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "snapshots", 1)
            tg.start_soon(run, "collector", 2)
    taken = [line.split()[1] for line in outputs["snapshots"].splitlines()]
    collected = [int(line.split()[1]) for line in outputs["collector"].splitlines()]
    assert len(taken) >= 5 and len(collected) >= 3 and sum(collected) > 0, (len(taken), collected)
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    left = await store.list()
    # Kept: those of ids 0-7 and the newest (ones the collector saw newest may be left too).
    assert {t for t in taken if t[0] not in "89abcdef"} | {taken[-1]} <= {i.id for i in left} <= set(taken)
    for info in left:
        snapshot = await store.load(info.id)
        for path, record in snapshot.files.items():
            data = await fs.read_file(store.blobs.path(record.sha256), encoding=None)
            assert isinstance(data, bytes) and hashlib.sha256(data).hexdigest() == record.sha256, (info.id, path)
    # And a collection now, with nothing racing it, keeps what the snapshots left hold.
    await store.collect_garbage(grace=timedelta(0))
    for info in left:
        snapshot = await store.load(info.id)
        assert all([await fs.exists(store.blobs.path(r.sha256)) for r in snapshot.files.values()])


async def test_local_files_hashed_by_a_snapshot_are_not_read_again_until_they_change(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stat memo: a later snapshot (and a diff with the live files) reuses the hash of a
    local file whose size, mtime, ctime and inode are unchanged, and reads a file rewritten
    in place with its old size and mtime put back (only its ctime moved)."""
    from agentvfs.snapshots import _take, _tree, diff_snapshots
    from agentvfs.snapshots._store import StatMemo
    from agentvfs.snapshots._take import SnapshotContent

    for i in range(20):
        (tmp_path / f"f{i}.txt").write_text(f"file {i}\n")
    fs = LocalFilesystem(str(tmp_path))
    store = SnapshotStore(fs, prefix=DEFAULT_PREFIX)
    reads: list[str] = []
    real = _tree.read_live

    async def counted(fs: Any, stat: Any) -> bytes:
        reads.append(stat.path)
        return await real(fs, stat)

    monkeypatch.setattr(_take, "read_live", counted)
    monkeypatch.setattr("agentvfs.snapshots._diff.read_live", counted)
    # Just written: within the margin, so hashed and not kept.
    first = await take_snapshot(fs, store)
    assert len(reads) == 20 and not store.memo._known
    await take_snapshot(fs, store)
    assert len(reads) == 40
    monkeypatch.setattr(StatMemo, "MARGIN_NS", 0)  # as if two seconds had passed
    await take_snapshot(fs, store)
    reads.clear()
    third = await take_snapshot(fs, store)
    assert reads == [] and third.files == first.files
    assert (await diff_snapshots(fs, third.id, None, store=store)).changes == () and reads == []
    # Rewritten in place: same inode and size, the old mtime put back.
    target = tmp_path / "f3.txt"
    before = target.stat()
    fd = os.open(target, os.O_WRONLY)
    os.pwrite(fd, b"FILE", 0)
    os.close(fd)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    changed = await diff_snapshots(fs, third.id, None, store=store)
    assert [c.path for c in changed.changes] == ["f3.txt"] and set(reads) == {"f3.txt"}  # compared, then its patch
    fourth = await take_snapshot(fs, store)
    assert fourth.files["f3.txt"].sha256 != third.files["f3.txt"].sha256
    assert await (SnapshotContent(fourth, store, fs)).read(fourth.files["f3.txt"]) == b"FILE 3\n"
    # A file whose mtime is not older than the listing (here: set ahead) is not kept.
    ahead = time.time_ns() + 100 * 10**9
    os.utime(tmp_path / "f5.txt", ns=(ahead, ahead))
    await take_snapshot(fs, store)
    assert (str(tmp_path), "f5.txt") not in store.memo._known and (str(tmp_path), "f6.txt") in store.memo._known
    # Other storage keeps no memo: memory has no ctime to go by.
    assert store.memo.location(FsspecFilesystem(MemoryFileSystem(skip_instance_cache=True))) is None
