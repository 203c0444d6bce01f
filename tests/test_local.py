"""LocalFilesystem: the reference's path rules, golden messages and symlink containment."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from agentvfs import LocalFilesystem, PermissionDenied, WorkspaceReadOnlyError

pytestmark = pytest.mark.anyio


@pytest.fixture
def base(tmp_path: Path) -> Path:
    root = tmp_path / "base"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "x.txt").write_text("x")
    return root


async def test_absolute_paths_are_host_paths(base: Path) -> None:
    fs = LocalFilesystem(base)
    assert await fs.read_file(str(base / "sub" / "x.txt")) == b"x"
    cases = {
        "/etc/passwd": 'Permission denied: access (path is outside the workspace; use a path relative to the workspace root, without a leading "/") on /etc/passwd',
        "/sub/x.txt": 'Permission denied: access (path is outside the workspace; use a relative path like "sub/x.txt") on /sub/x.txt',
        "../x.txt": "Permission denied: access on ../x.txt",
        "/": "Permission denied: access on /",
        "~/x": "Permission denied: access on ~/x",
    }
    for path, message in cases.items():
        with pytest.raises(PermissionDenied) as info:
            await fs.read_file(path)
        assert str(info.value) == message


async def test_absolute_paths_from_the_workspace_root(base: Path, tmp_path: Path) -> None:
    fs = LocalFilesystem(base, absolute_paths="workspace")
    assert await fs.read_file("/sub/x.txt") == b"x"
    assert await fs.read_file(str(base / "sub" / "x.txt")) == b"x"  # a host path inside still is one
    await fs.write_file("/new.txt", "n")
    assert (base / "new.txt").read_text() == "n"
    assert sorted(e.name for e in await fs.readdir("/")) == ["new.txt", "sub"]
    (tmp_path / "secret").write_text("s")
    # Never the host's files: /etc/passwd is etc/passwd of the workspace, and nothing climbs out.
    with pytest.raises(FileNotFoundError):
        await fs.read_file("/etc/passwd")
    for escape in ("/../secret", "/sub/../../secret", "../secret", "~/x"):
        with pytest.raises(PermissionDenied):
            await fs.read_file(escape)
    with pytest.raises(ValueError, match="absolute_paths must be 'host' or 'workspace'"):
        LocalFilesystem(base, absolute_paths="root")  # type: ignore[arg-type]


async def test_symlink_out_is_refused_for_read_and_create(base: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "existing.txt").write_text("secret")
    os.symlink(outside, base / "alias")
    fs = LocalFilesystem(base)
    with pytest.raises(PermissionDenied) as info:
        await fs.read_file("alias/existing.txt")
    assert str(info.value) == f"Permission denied: access on {base}/alias/existing.txt"
    for call in (
        fs.write_file("alias/escaped.txt", "x"),
        fs.mkdir("alias/newdir"),
        fs.write_file("alias/deep/er/escaped.txt", "x"),
    ):
        with pytest.raises(PermissionDenied):
            await call
    assert sorted(os.listdir(outside)) == ["existing.txt"]


async def test_symlink_inside_is_fine(base: Path) -> None:
    os.symlink(base / "sub", base / "link")
    fs = LocalFilesystem(base)
    assert await fs.read_file("link/x.txt") == b"x"
    entries = {e.name: e for e in await fs.readdir(".")}
    assert entries["link"].is_symlink and entries["link"].type == "directory"
    assert entries["link"].symlink_target == str(base / "sub")


async def test_allowed_paths(base: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "e.txt").write_text("e")
    fs = LocalFilesystem(base, allowed_paths=[str(extra)])
    assert await fs.read_file(str(extra / "e.txt")) == b"e"
    assert fs.get_instructions() == (
        f'Local filesystem at "{base}". Relative paths resolve from this directory. File access is '
        f"restricted to this directory and the following allowed paths: {extra}."
    )
    assert (await fs.get_info())["metadata"] == {"base_path": str(base), "contained": True, "allowed_paths": [str(extra)]}
    fs.set_allowed_paths(lambda current: [])
    with pytest.raises(PermissionDenied):
        await fs.read_file(str(extra / "e.txt"))


async def test_uncontained(base: Path, tmp_path: Path) -> None:
    (tmp_path / "free.txt").write_text("free")
    fs = LocalFilesystem(base, contained=False)
    assert await fs.read_file("../free.txt") == b"free"
    assert fs.get_instructions().endswith("Containment is disabled, so any path on the host filesystem is accessible.")


async def test_instructions_info_and_config(base: Path) -> None:
    fs = LocalFilesystem(base)
    assert fs.get_instructions() == (
        f'Local filesystem at "{base}". Relative paths resolve from this directory. '
        "File access is restricted to this directory."
    )
    assert fs.get_mount_config() == {"type": "local", "base_path": str(base)}
    assert fs.name == "LocalFilesystem" and fs.provider == "local"
    assert fs.id.startswith("local-fs-")
    assert LocalFilesystem(base, instructions="custom").get_instructions() == "custom"
    assert LocalFilesystem(base, instructions=lambda o: o["default_instructions"] + "!").get_instructions().endswith("directory.!")


async def test_stat_paths_are_base_relative(base: Path) -> None:
    fs = LocalFilesystem(base)
    stat = await fs.stat("sub/x.txt")
    assert (stat.name, stat.path, stat.mime_type) == ("x.txt", "sub/x.txt", "text/plain")
    assert (await fs.stat(str(base / "sub"))).path == "sub"
    assert await fs.realpath("sub/../sub/x.txt") == "sub/x.txt"


async def test_init_creates_base_and_destroy_keeps_files(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path / "new" / "ws")
    assert fs.status == "pending"
    await fs.write_file("a.txt", "a")  # operations initialise on first use
    assert fs.status == "ready"
    await fs.destroy()
    assert fs.status == "destroyed"
    assert (tmp_path / "new" / "ws" / "a.txt").read_text() == "a"


async def test_root_cannot_be_removed(base: Path) -> None:
    fs = LocalFilesystem(base)
    with pytest.raises(PermissionDenied):
        await fs.rmdir(".", recursive=True)
    assert base.exists()


async def test_read_only_refuses_before_touching_disk(base: Path) -> None:
    fs = LocalFilesystem(base / "not-created", read_only=True)
    with pytest.raises(WorkspaceReadOnlyError) as info:
        await fs.write_file("a.txt", "a")
    assert str(info.value) == "Workspace is in read-only mode. Cannot perform: write_file"
    assert not (base / "not-created").exists()


async def test_writes_keep_mode_and_go_through_links(base: Path) -> None:
    script = base / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    (base / "real.txt").write_text("real")
    os.symlink(base / "real.txt", base / "link.txt")
    fs = LocalFilesystem(base)
    await fs.write_file("run.sh", "#!/bin/sh\necho hi\n")
    assert script.stat().st_mode & 0o777 == 0o755
    await fs.write_file("link.txt", "through the link")
    assert (base / "link.txt").is_symlink()
    assert (base / "real.txt").read_text() == "through the link"
    await fs.copy_file("sub/x.txt", "link.txt")
    assert (base / "link.txt").is_symlink() and (base / "real.txt").read_text() == "x"


async def test_symlink_cycles_end(base: Path) -> None:
    os.symlink(base, base / "sub" / "loop1")
    os.symlink(base / "sub", base / "sub" / "loop2")
    fs = LocalFilesystem(base)
    with anyio.fail_after(10):
        names = [e.name for e in await fs.readdir(".", recursive=True)]
        hits = await fs.grep("x", ".")
    assert "sub/x.txt" in names and "sub/loop1" in names and "sub/loop2" in names
    assert not any(n.startswith("sub/loop1/sub/loop1") for n in names)
    assert [h.path for h in hits] == ["sub/x.txt"]


async def test_grep_never_reads_through_links_out(base: Path, tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text("TOPSECRET")
    os.symlink(tmp_path / "out.txt", base / "leak.txt")
    fs = LocalFilesystem(base)
    with pytest.raises(PermissionDenied):
        await fs.read_file("leak.txt")
    assert await fs.grep("TOPSECRET", ".") == []


async def test_failed_append_keeps_old_content(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (base / "log.txt").write_text("old\n")
    fs = LocalFilesystem(base)
    real_write = os.write

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[:3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        await fs.append_file("log.txt", "new line\n")
    monkeypatch.undo()
    assert (base / "log.txt").read_text() == "old\n"
