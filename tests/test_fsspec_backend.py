"""FsspecFilesystem specifics: URLs, providers, root rules, object-store directory markers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, IsDirectory, PermissionDenied, StaleFileError
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.vfs import ObjectStoreBackend
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = pytest.mark.anyio


async def test_urls_and_providers(tmp_path: Path, moto: MotoServer, fake_gcs: FakeGcsServer) -> None:
    local = FsspecFilesystem(f"file://{tmp_path}/ws")
    await local.write_file("a.txt", "a")
    assert (tmp_path / "ws" / "a.txt").read_text() == "a"
    assert (local.provider, local.name, local.capabilities.empty_dirs) == ("file", "FsspecFilesystem", True)
    mem = FsspecFilesystem(f"memory://{unique('url')}")
    assert mem.provider == "memory" and not mem.capabilities.blocking
    s3 = FsspecFilesystem(
        f"s3://{S3_BUCKET}/{unique('url')}",
        storage_options={"key": "testing", "secret": "testing", "endpoint_url": moto.endpoint_url, "skip_instance_cache": True},
    )
    await s3.write_file("x/y.txt", "s3")
    assert await s3.read_file("/x/y.txt") == b"s3"
    assert (s3.provider, s3.capabilities.empty_dirs, s3.capabilities.versions) == ("s3", False, True)
    gcs = FsspecFilesystem(
        f"gcs://{GCS_BUCKET}/{unique('url')}",
        storage_options={"token": "anon", "project": "test", "endpoint_url": fake_gcs.endpoint_url, "skip_instance_cache": True},
    )
    await gcs.write_file("g.txt", "gcs")
    assert (await gcs.stat("g.txt")).etag  # the generation
    assert gcs.provider == "gcs"
    with pytest.raises(TypeError, match="storage_options apply only when a URL is given"):
        FsspecFilesystem(MemoryFileSystem(), storage_options={"x": 1})
    with pytest.raises(TypeError, match="fs_or_url must be"):
        FsspecFilesystem(42)


async def test_leading_slash_means_root_and_root_is_protected() -> None:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/r")
    await fs.write_file("/docs/a.txt", "a")
    assert await fs.read_file("docs/a.txt") == b"a"
    assert [e.name for e in await fs.readdir("/")] == ["docs"]
    with pytest.raises(PermissionDenied):
        await fs.rmdir("/", recursive=True)
    with pytest.raises(IsDirectory):
        await fs.write_file("/", "x")
    with pytest.raises(PermissionDenied, match="must not contain"):
        FsspecFilesystem(MemoryFileSystem(), root="a/../../b")


async def test_symlink_escape_on_file_urls(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "s.txt").write_text("secret")
    (tmp_path / "ws").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "ws" / "link")
    fs = FsspecFilesystem(f"file://{tmp_path}/ws")
    with pytest.raises(PermissionDenied):
        await fs.read_file("link/s.txt")
    with pytest.raises(PermissionDenied):
        await fs.write_file("link/new.txt", "x")
    assert sorted(os.listdir(tmp_path / "out")) == ["s.txt"]
    assert [e.name for e in await fs.readdir("", recursive=True)] == ["link"]  # not followed out


@pytest.mark.s3
async def test_s3_markers_keep_directories(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('mk')}"
    client = moto.boto3_client()
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=root)
    prefix = root.split("/", 1)[1]

    def keys() -> list[str]:
        listed = client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix + "/")
        return sorted(o["Key"][len(prefix) + 1 :] for o in listed.get("Contents", []))

    await fs.mkdir("empty/dir")
    assert keys() == ["empty/dir/"]
    await fs.write_file("d/only.txt", "x")
    await fs.delete_file("d/only.txt")
    assert keys() == ["d/", "empty/dir/"]
    assert [e.name for e in await fs.readdir("")] == ["d", "empty"]
    await fs.rmdir("empty/dir")
    assert keys() == ["d/", "empty/"]


def _count_s3_calls(raw: Any) -> list[str]:
    """The S3 methods ``raw`` (s3fs) calls from now on, in order."""
    calls: list[str] = []
    call_s3 = raw._call_s3

    async def counting(method: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(method)
        return await call_s3(method, *args, **kwargs)

    raw._call_s3 = counting
    return calls


def _count_signed_heads(fs: FsspecFilesystem) -> list[str]:
    """The paths ``fs`` sends a HEAD of through a signed URL from now on (not through s3fs)."""
    backend = fs.backend
    assert isinstance(backend, ObjectStoreBackend) and backend.ranged is not None
    heads: list[str] = []
    head = backend.ranged.head

    def counting(path: str) -> dict[str, str] | None:
        heads.append(path)
        return head(path)

    backend.ranged.head = counting  # type: ignore[method-assign]
    return heads


@pytest.mark.s3
async def test_s3_forced_delete_of_a_listed_file_sends_only_the_delete(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('fd')}"
    raw = moto.s3fs(use_listings_cache=False)
    fs = FsspecFilesystem(raw, root=root, listing_ttl=60)
    await fs.write_file("d/a.txt", "a")
    await fs.write_file("d/b.txt", "b")  # the write checks keep the listing of d
    await fs.mkdir("d/sub")
    calls = _count_s3_calls(raw)
    heads = _count_signed_heads(fs)
    await fs.delete_file("d/a.txt", force=True)
    assert calls == ["delete_object"] and heads == []
    # Without force, or for what the listing shows as a directory, the check stays.
    calls.clear()
    await fs.delete_file("d/b.txt")
    assert heads == [f"{root}/d/b.txt"] and calls == ["delete_object"]
    with pytest.raises(IsDirectory):
        await fs.delete_file("d/sub", force=True)
    assert not await fs.exists("d/a.txt") and not await fs.exists("d/b.txt")
    assert (await fs.stat("d/sub")).type == "directory"


@pytest.mark.s3
async def test_s3_list_stats_feeds_the_write_checks(moto: MotoServer) -> None:
    """A FUSE mount lists a directory before it deletes in it: that listing is enough."""
    root = f"{S3_BUCKET}/{unique('ls')}"
    writer = FsspecFilesystem(moto.s3fs(), root=root)
    await writer.write_file("d/a.txt", "a")
    await writer.mkdir("d/sub")
    raw = moto.s3fs(use_listings_cache=False)
    fs = FsspecFilesystem(raw, root=root, listing_ttl=60)  # knows nothing of d yet
    assert [st.name for st in await fs.list_stats("d")] == ["a.txt", "sub"]
    calls = _count_s3_calls(raw)
    await fs.delete_file("d/a.txt", force=True)
    assert calls == ["delete_object"]
    with pytest.raises(IsDirectory):
        await fs.delete_file("d/sub", force=True)
    assert not await fs.exists("d/a.txt")


@pytest.mark.s3
async def test_s3_write_onto_directory_made_elsewhere(moto: MotoServer) -> None:
    # A bucket of its own: moto's listing time grows with the bucket, and the listing is
    # trusted for ten times what it cost.
    bucket = unique("conflict")
    moto.create_bucket(bucket)
    root = f"{bucket}/ws"
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=root, listing_ttl=0.2)
    await fs.exists("warm-up")  # the first request also opens the connection
    await fs.write_file("a.txt", "a")
    moto.s3fs().pipe_file(f"{root}/dir/inner.txt", b"made by another client")
    await anyio.sleep(1.0)  # past the listing TTL (0.2 s, or 10x a tiny listing) the check sees it
    with pytest.raises(IsDirectory):
        await fs.write_file("dir", "x")
    moto.s3fs().pipe_file(f"{root}/file", b"f")
    with pytest.raises(NotADirectoryError):
        await fs.write_file("file/child.txt", "x")


@pytest.mark.s3
async def test_s3_kept_listings_learn_implied_directories(moto: MotoServer) -> None:
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/{unique('implied')}", listing_ttl=60)
    await fs.write_file("top.txt", "t")  # the root's names are now kept for a minute
    await fs.write_file("a/b/c.txt", "c")  # implies directories a and a/b
    with pytest.raises(IsDirectory):
        await fs.write_file("a", "x")
    await fs.mkdir("m/n")
    with pytest.raises(IsDirectory):
        await fs.write_file("m", "x")
    await fs.copy_file("top.txt", "cp/deep/x.txt")
    with pytest.raises(IsDirectory):
        await fs.write_file("cp", "x")


@pytest.mark.s3
async def test_s3_guarded_write_is_one_conditional_put(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('guard')}"
    raw = moto.s3fs(use_listings_cache=False)
    raw.connect()
    sent: list[str] = []
    raw.s3.meta.events.register("before-call.s3", lambda model, **kw: sent.append(model.name))
    fs = FsspecFilesystem(raw, root=root)
    await fs.write_file("r.txt", "v1")
    seen = await fs.stat("r.txt")
    sent.clear()
    await fs.write_file("r.txt", "v2", expected_mtime=seen)
    assert sent == ["PutObject"]  # the ETag rides along as If-Match: no HEAD first
    moto.s3fs().pipe_file(f"{root}/r.txt", b"v3 from elsewhere")
    with pytest.raises(StaleFileError):
        await fs.write_file("r.txt", "mine", expected_mtime=seen)
    assert moto.s3fs().cat_file(f"{root}/r.txt") == b"v3 from elsewhere"


@pytest.mark.s3
async def test_s3_records_the_content_type(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('mime')}"
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=root)
    await fs.write_file("page.html", "<p>hi</p>", mime_type="text/html")
    head = moto.boto3_client().head_object(Bucket=S3_BUCKET, Key=root.split("/", 1)[1] + "/page.html")
    assert head["ContentType"] == "text/html"
