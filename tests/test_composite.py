"""CompositeFilesystem routing, synthetic directories and cross-mount operations."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import CompositeFilesystem, FsspecFilesystem, LocalFilesystem, PermissionDenied

pytestmark = pytest.mark.anyio


def memory(read_only: bool = False) -> FsspecFilesystem:
    return FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m", read_only=read_only)


@pytest.fixture
def cfs(tmp_path: Path) -> CompositeFilesystem:
    return CompositeFilesystem({"/data": LocalFilesystem(tmp_path / "d"), "custom/": memory(read_only=True), "/mem": memory()})


async def test_construction_rules() -> None:
    with pytest.raises(ValueError, match="requires at least one mount"):
        CompositeFilesystem({})
    with pytest.raises(ValueError) as info:
        CompositeFilesystem({"/data": memory(), "/data/sub": memory()})
    assert str(info.value) == 'Nested mount paths are not supported: "/data/sub" is nested under "/data"'
    c = CompositeFilesystem({"/a": memory(read_only=True), "/b": memory(read_only=True)})
    assert c.read_only and c.provider == "composite" and c.name == "CompositeFilesystem"
    assert c.id.startswith("cfs-") and c.status == "ready"


async def test_routing_and_virtual_root(cfs: CompositeFilesystem) -> None:
    await cfs.init()
    assert cfs.mount_paths == ["/data", "/custom", "/mem"]
    root = await cfs.readdir("/")
    assert [(e.name, e.type, e.mount.provider if e.mount else None) for e in root] == [
        ("custom", "directory", "memory"), ("data", "directory", "local"), ("mem", "directory", "memory"),
    ]
    await cfs.write_file("data/doc.txt", "hi")
    for alias in ("data/doc.txt", "/data/doc.txt", "./data/doc.txt"):
        assert await cfs.read_file(alias) == b"hi"
    with pytest.raises(FileNotFoundError) as info:
        await cfs.read_file("/other/x")
    assert str(info.value) == "No mount for path: /other/x"
    stat = await cfs.stat("/data")
    assert (stat.type, stat.size, stat.path) == ("directory", 0, "/data")
    assert await cfs.exists("/") and await cfs.exists("/mem")
    assert cfs.get_instructions() == (
        "Filesystem mount points:\n- /data: local (read-write)\n- /custom: memory (read-only)\n- /mem: memory (read-write)"
    )


async def test_read_only_mount(cfs: CompositeFilesystem) -> None:
    with pytest.raises(PermissionDenied) as info:
        await cfs.write_file("/custom/x.txt", "x")
    assert str(info.value) == "Permission denied: write_file (filesystem is read-only) on /custom/x.txt"
    with pytest.raises(PermissionDenied):
        await cfs.move_file("/custom/a", "/mem/a")


async def test_cross_mount_copy_and_move(cfs: CompositeFilesystem) -> None:
    await cfs.write_file("/data/a.txt", "A")
    await cfs.copy_file("/data/a.txt", "/mem/deep/b.txt")
    assert await cfs.read_file("/mem/deep/b.txt") == b"A"
    await cfs.move_file("/mem/deep/b.txt", "/data/moved.txt")
    assert await cfs.read_file("/data/moved.txt") == b"A"
    assert not await cfs.exists("/mem/deep/b.txt")
    await cfs.write_file("/data/tree/x.txt", "x")
    await cfs.copy_file("/data/tree", "/mem/tree", recursive=True)
    assert await cfs.read_file("/mem/tree/x.txt") == b"x"
    with pytest.raises(FileNotFoundError, match="No mount for source"):
        await cfs.copy_file("/nowhere/a", "/mem/a")


async def test_recursive_listing_and_grep_across_mounts(cfs: CompositeFilesystem) -> None:
    await cfs.write_file("/data/a.md", "TODO one")
    await cfs.write_file("/mem/b.md", "TODO two")
    names = [e.name for e in await cfs.readdir("/", recursive=True)]
    assert "data/a.md" in names and "mem/b.md" in names
    hits = await cfs.grep("TODO", "/")
    assert sorted(h.path for h in hits) == ["data/a.md", "mem/b.md"]
    info = await cfs.get_info()
    assert set(info["metadata"]["mounts"]) == {"/data", "/custom", "/mem"}


async def test_cross_mount_directory_move_without_overwrite_keeps_everything(cfs: CompositeFilesystem) -> None:
    await cfs.write_file("/data/dir/keep.txt", "source")
    await cfs.write_file("/mem/dir/keep.txt", "destination")
    with pytest.raises(FileExistsError):
        await cfs.move_file("/data/dir", "/mem/dir", overwrite=False)
    assert await cfs.read_file("/data/dir/keep.txt") == b"source"
    assert await cfs.read_file("/mem/dir/keep.txt") == b"destination"


async def test_all_read_only_mounts_refuse_like_one(tmp_path: Path) -> None:
    c = CompositeFilesystem({"/a": memory(read_only=True), "/b": memory(read_only=True)})
    assert c.read_only
    with pytest.raises(PermissionDenied) as info:
        await c.write_file("/a/x.txt", "x")
    assert str(info.value) == "Permission denied: write_file (filesystem is read-only) on /a/x.txt"


async def test_a_default_mount_serves_paths_no_mount_matches() -> None:
    work = FsspecFilesystem(MemoryFileSystem(skip_instance_cache=True, global_store=False), root="/w")
    other = FsspecFilesystem(MemoryFileSystem(skip_instance_cache=True, global_store=False), root="/o")
    cfs = CompositeFilesystem({"/workspace": work, "/other": other})
    from agentvfs.errors import NoMountError

    with pytest.raises(NoMountError):
        await cfs.write_file("notes.txt", "x")  # the reference's rule, by default
    cfs.default_mount = "workspace"
    await cfs.write_file("notes.txt", "x")
    await cfs.write_file("/sub/deep.txt", "y")
    assert await work.read_file("notes.txt") == b"x" and await work.read_file("sub/deep.txt") == b"y"
    assert await cfs.read_file("/workspace/notes.txt") == b"x"
    assert sorted(e.name for e in await cfs.readdir("/")) == ["other", "workspace"]  # the root lists mounts
    await cfs.write_file("other/o.txt", "o")  # a mount's own prefix still wins
    assert await other.read_file("o.txt") == b"o"
    with pytest.raises(ValueError, match="default_mount '/nope' is not one of the mount paths"):
        cfs.default_mount = "/nope"
