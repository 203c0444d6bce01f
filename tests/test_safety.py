"""Read-only workspaces never reach the backend on writes; failed writes never lose data;
credentials are never reported."""

from __future__ import annotations

import errno
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FilesystemError, FsspecFilesystem, Workspace, WorkspaceReadOnlyError
from agentvfs.testing import MotoServer
from agentvfs.vfs import ObjectStoreBackend
from conftest import S3_BUCKET, unique

pytestmark = pytest.mark.anyio

WRITE_CALLS = (
    ("write_file", ("docs/a.txt", "x")),
    ("append_file", ("docs/a.txt", "x")),
    ("delete_file", ("docs/a.txt",)),
    ("mkdir", ("docs/new",)),
    ("rmdir", ("docs",)),
    ("copy_file", ("docs/a.txt", "docs/b.txt")),
    ("move_file", ("docs/a.txt", "docs/b.txt")),
)


class CountingMemory(MemoryFileSystem):  # type: ignore[misc]
    """A memory filesystem that counts every public call made on it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, global_store=False, **kw)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if not name.startswith("_") and callable(value) and name not in ("calls",):
            super().__getattribute__("calls")[name] += 1
        return value


def count_requests(fs: Any) -> Counter[str]:
    """Count S3 API requests (by operation) sent by an s3fs instance."""
    seen: Counter[str] = Counter()
    fs.connect()

    def before_send(request: Any, **kwargs: Any) -> None:
        seen[kwargs.get("event_name", "").rsplit(".", 1)[-1] or "request"] += 1

    fs.s3.meta.events.register("before-call.s3", lambda model, **kw: seen.update([model.name]))
    return seen


def count_url_gets(fs: FsspecFilesystem, seen: Counter[str]) -> None:
    """Count the GETs ``fs`` sends through signed URLs (outside s3fs) as ``GetObject`` too."""
    assert isinstance(fs.backend, ObjectStoreBackend)
    reader = fs.backend.ranged
    assert reader is not None
    whole, ranged = reader.read_whole, reader.read

    def counted(path: str) -> bytes | None:
        seen["GetObject"] += 1
        return whole(path)

    def counted_range(path: str, start: int, end: int, *, version: str | None = None) -> bytes | None:
        seen["GetObject"] += 1  # a capped read is one ranged GET
        return ranged(path, start, end, version=version)

    reader.read_whole = counted  # type: ignore[method-assign]
    reader.read = counted_range  # type: ignore[method-assign]


async def test_read_only_memory_writes_make_no_backend_call() -> None:
    raw = CountingMemory(skip_instance_cache=True)
    raw.pipe_file("/ro/docs/a.txt", b"hello")
    ws = Workspace(filesystem=FsspecFilesystem(raw, root="/ro", read_only=True))
    fs = ws.filesystem
    assert fs is not None
    assert await fs.read_file("docs/a.txt") == b"hello"
    assert [e.name for e in await fs.readdir("docs")] == ["a.txt"]
    assert (await fs.stat("docs/a.txt")).size == 5
    raw.calls.clear()
    for name, args in WRITE_CALLS:
        with pytest.raises(WorkspaceReadOnlyError) as info:
            await getattr(fs, name)(*args)
        assert info.value.errno == errno.EROFS
        assert str(info.value) == f"Workspace is in read-only mode. Cannot perform: {name}"
    assert sum(raw.calls.values()) == 0, raw.calls
    assert raw.cat_file("/ro/docs/a.txt") == b"hello"


@pytest.mark.s3
async def test_read_only_s3_writes_send_no_request(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('ro')}"
    seed = moto.s3fs()
    seed.pipe_file(f"{root}/docs/a.txt", b"hello")
    raw = moto.s3fs(use_listings_cache=False)
    requests = count_requests(raw)
    ws = Workspace(filesystem=FsspecFilesystem(raw, root=root, read_only=True))
    fs = ws.filesystem
    assert fs is not None
    assert await fs.read_file("docs/a.txt") == b"hello"
    assert [e.name for e in await fs.readdir("docs")] == ["a.txt"]
    hits = await fs.grep("hell", "docs")  # type: ignore[attr-defined]
    assert [h.path for h in hits] == ["docs/a.txt"]
    assert requests, "the counter must see the reads"
    requests.clear()
    for name, args in WRITE_CALLS:
        with pytest.raises(WorkspaceReadOnlyError):
            await getattr(fs, name)(*args)
    assert sum(requests.values()) == 0, requests


@pytest.mark.s3
async def test_s3_list_and_grep_take_one_listing(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('walk')}"
    seed = moto.s3fs()
    seed.pipe({f"{root}/d{i}/sub/f{j}.txt": f"line {i}.{j}\nTODO\n".encode() for i in range(5) for j in range(4)})
    raw = moto.s3fs(use_listings_cache=False)
    requests = count_requests(raw)
    fs = FsspecFilesystem(raw, root=root)
    count_url_gets(fs, requests)
    entries = await fs.readdir("", recursive=True)
    assert len([e for e in entries if e.type == "file"]) == 20
    assert requests["ListObjectsV2"] == 1, requests
    requests.clear()
    hits = await fs.grep("TODO", "")
    assert len(hits) == 20
    # one listing for the tree, then one GET per file, fetched concurrently
    assert requests["ListObjectsV2"] == 1 and requests["GetObject"] == 20, requests


class FailingMemory(MemoryFileSystem):  # type: ignore[misc]
    def pipe_file(self, path: str, value: bytes, **kw: Any) -> None:
        raise OSError(errno.EIO, "backend went away")


_FULL_DISK_WRITE = """
import asyncio, resource, signal, sys
from agentvfs import FsspecFilesystem
# A file-size limit makes the kernel refuse the write part way (EFBIG), as a full disk would.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))
fs = FsspecFilesystem("file://" + sys.argv[1])
try:
    asyncio.run(fs.write_file("a.txt", b"new content that is much longer than the limit"))
except OSError as exc:
    print(type(exc).__name__, exc.errno, exc)
else:
    print("no error")
"""


def test_failed_local_write_keeps_old_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"old content")
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_WRITE, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith(f"FilesystemError {errno.EFBIG} write_file failed on a.txt"), done
    assert (tmp_path / "a.txt").read_bytes() == b"old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


async def test_failed_memory_write_keeps_old_file() -> None:
    raw = FailingMemory(global_store=False, skip_instance_cache=True)
    raw.store["/m/a.txt"] = MemoryFileSystem(global_store=False, skip_instance_cache=True).open("/x", "wb")
    raw.store["/m/a.txt"].write(b"old")
    raw.store["/m/a.txt"].commit()
    fs = FsspecFilesystem(raw, root="/m")
    with pytest.raises(FilesystemError, match="backend went away"):
        await fs.write_file("a.txt", b"new")
    assert raw.cat_file("/m/a.txt") == b"old"


@pytest.fixture
def failing_puts(moto: MotoServer) -> tuple[Any, str]:
    raw = moto.s3fs(use_listings_cache=False)
    raw.connect()

    def fail(model: Any, **kw: Any) -> None:
        if model.name == "PutObject":
            raise ConnectionError("connection reset during upload")

    raw.s3.meta.events.register("before-call.s3", fail)
    return raw, f"{S3_BUCKET}/{unique('fail')}"


@pytest.mark.s3
async def test_failed_s3_upload_is_reported_and_keeps_old(moto: MotoServer, failing_puts: tuple[Any, str]) -> None:
    raw, root = failing_puts
    moto.s3fs().pipe_file(f"{root}/a.txt", b"old")
    fs = FsspecFilesystem(raw, root=root)
    with pytest.raises(FilesystemError) as info:
        await fs.write_file("a.txt", b"new")
    assert info.value.errno == errno.EIO and "a.txt" in str(info.value)
    assert moto.s3fs().cat_file(f"{root}/a.txt") == b"old"


@pytest.mark.s3
async def test_credentials_never_reported(moto: MotoServer) -> None:
    secret = "very-secret-key-value"
    fs = FsspecFilesystem(
        f"s3://{S3_BUCKET}/prefix",
        storage_options={"key": "testing", "secret": secret, "endpoint_url": moto.endpoint_url, "skip_instance_cache": True},
    )
    ws = Workspace(filesystem=fs)
    texts = [repr(fs), repr(ws), str(fs.get_mount_config()), str(await ws.get_info()), fs.get_instructions()]
    assert fs.get_mount_config() == {"type": "fsspec", "protocol": "s3", "root": f"{S3_BUCKET}/prefix", "read_only": False}
    for text in texts:
        assert secret not in text
