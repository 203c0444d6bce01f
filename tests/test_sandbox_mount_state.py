"""The mount manager's state out of the agent's reach: a symlink mount re-pointed by the agent
is never reused (after a crash or by a second sandbox), markers live in a private host
directory bound read-only where a writable bind covers it, and a mount point whose parent the
agent replaced by a symlink makes the host create or mount nothing outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from _mounted import fuse_unavailable
from agentvfs import FsspecFilesystem, LocalFilesystem
from agentvfs.mounts import fuse_available, is_mounted
from agentvfs.sandbox import LocalSandbox
from agentvfs.sandbox._isolation import detect_isolation
from agentvfs.sandbox._mounts import marker_filename, markers_directory

pytestmark = pytest.mark.anyio

BWRAP = detect_isolation()
needs_bwrap = pytest.mark.skipif(not BWRAP["available"], reason=f"bubblewrap unusable here: {BWRAP['message']}")
_NO_FUSE = fuse_unavailable() or fuse_available()
needs_fuse = pytest.mark.skipif(_NO_FUSE is not None, reason=str(_NO_FUSE))


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    paths = {"wd": tmp_path / "wd", "data": tmp_path / "data", "host": tmp_path / "host"}
    for path in paths.values():
        path.mkdir()
    (paths["data"] / "configured.txt").write_text("configured\n")
    (paths["host"] / "secret.txt").write_text("host secret\n")
    return paths


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("isolation", ["none", pytest.param("bwrap", marks=needs_bwrap)])
async def test_a_repointed_link_is_never_reused(layout: dict[str, Path], isolation: str) -> None:
    wd, data, host = layout["wd"], layout["data"], layout["host"]
    first = LocalSandbox(working_directory=str(wd), isolation=isolation)
    assert (await first.mount(LocalFilesystem(data), "/data"))["success"]
    # The agent re-points the link of a read-write local mount at a host directory.
    os.unlink(wd / "data")
    os.symlink(host, wd / "data")
    # A crash leaves the marker; a second sandbox on the same working directory starts.
    second = LocalSandbox(working_directory=str(wd), isolation=isolation)
    try:
        assert (await second.mount(LocalFilesystem(data), "/data"))["success"]
        assert os.readlink(wd / "data") == str(data)
        assert second.mounts.isolation_binds() == [(str(data), True)]
        result = await second.execute_command("ls data; echo changed > data/new.txt")
        assert result.stdout == "configured.txt\n", result
        assert tree(host) == ["secret.txt"]
        assert (data / "new.txt").exists()
    finally:
        await second.destroy()
        await first.destroy()


async def test_reuse_needs_the_configured_target_and_binds_it_as_configured(layout: dict[str, Path]) -> None:
    wd, data = layout["wd"], layout["data"]
    alias = layout["wd"].parent / "alias"
    alias.symlink_to(data)
    first = LocalSandbox(working_directory=str(wd))
    assert (await first.mount(LocalFilesystem(alias), "/data"))["success"]
    second = LocalSandbox(working_directory=str(wd))
    assert (await second.mount(LocalFilesystem(alias), "/data"))["success"]
    # The configured path is what is bound, not what it resolves to at some moment.
    assert second.mounts.isolation_binds() == [(str(alias), True)]
    await second.destroy()
    await first.destroy()


def test_markers_live_in_a_private_host_directory(layout: dict[str, Path]) -> None:
    directory = Path(markers_directory())
    assert directory.is_dir() and not directory.is_symlink()
    assert directory.stat().st_uid == os.getuid()
    assert directory.stat().st_mode & 0o077 == 0
    assert not str(directory).startswith(str(layout["wd"]))


@needs_bwrap
async def test_markers_are_hidden_under_a_writable_bind(layout: dict[str, Path]) -> None:
    wd, data = layout["wd"], layout["data"]
    markers = markers_directory()
    parent = os.path.dirname(markers)
    box = LocalSandbox(working_directory=str(wd), isolation="bwrap", native_sandbox={"read_write_paths": [parent]})
    try:
        assert (await box.mount(LocalFilesystem(data), "/data"))["success"]
        marker = os.path.join(markers, marker_filename(str(wd / "data")))
        assert os.path.exists(marker)
        before = Path(marker).read_text()
        result = await box.execute_command(f"echo forged > {marker}; rm -f {marker}; touch {markers}/new; echo done")
        assert result.stdout == "done\n"
        # Not even to be read: an empty directory in its place.
        seen = await box.execute_command(f"ls -A {markers}; cat {marker}")
        assert seen.stdout == "" and "No such file" in seen.stderr, seen
        assert Path(marker).read_text() == before
        assert not os.path.exists(os.path.join(markers, "new"))
    finally:
        await box.destroy()


async def test_parent_replaced_by_a_symlink_creates_nothing_outside(layout: dict[str, Path]) -> None:
    wd, data, host = layout["wd"], layout["data"], layout["host"]
    # The agent replaces the mount point's parent with a link to a host directory.
    (wd / "deep").symlink_to(host)
    box = LocalSandbox(working_directory=str(wd))
    try:
        outcome = await box.mount(LocalFilesystem(data), "/deep/data")
        assert outcome["success"] is False
        assert "is a symlink or not a directory" in outcome["error"]
        assert tree(host) == ["secret.txt"]
    finally:
        await box.destroy()
    assert os.path.islink(wd / "deep")  # not removed either: it is the agent's


@needs_fuse
async def test_fuse_mount_never_lands_outside(layout: dict[str, Path]) -> None:
    wd, host = layout["wd"], layout["host"]
    memory = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    await memory.write_file("m.txt", "in memory\n")
    (wd / "deep").symlink_to(host)
    box = LocalSandbox(working_directory=str(wd))
    try:
        outcome = await box.mount(memory, "/deep/mem")
        assert outcome["success"] is False, outcome
        assert tree(host) == ["secret.txt"]
        assert not is_mounted(str(host / "mem"))
        # A real directory in its place works.
        os.unlink(wd / "deep")
        assert (await box.mount(memory, "/deep/mem"))["success"]
        result = await box.execute_command("cat deep/mem/m.txt")
        assert result.stdout == "in memory\n"
    finally:
        await box.destroy()
    assert not is_mounted(str(wd / "deep" / "mem"))


async def test_unmount_after_the_parent_was_swapped_touches_nothing_outside(layout: dict[str, Path]) -> None:
    wd, data, host = layout["wd"], layout["data"], layout["host"]
    (host / "data").symlink_to(data)  # looks like our link, but outside
    box = LocalSandbox(working_directory=str(wd))
    assert (await box.mount(LocalFilesystem(data), "/deep/data"))["success"]
    os.rename(wd / "deep", wd / "deep.moved")
    (wd / "deep").symlink_to(host)
    await box.destroy()
    assert os.path.islink(host / "data")  # the unmount did not follow the swapped parent
