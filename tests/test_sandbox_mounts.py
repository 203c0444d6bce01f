"""Mounting workspace filesystems into a LocalSandbox (reference §11, check 56): the mount
manager's states and hook, markers and reuse, and real FUSE mounts of buckets and read-only
directories that shell commands (also isolated ones) see as files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from _mounted import fuse_unavailable, wait_until
from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace
from agentvfs.mounts import is_mounted
from agentvfs.sandbox import LocalSandbox
from agentvfs.sandbox._mounts import (
    canonical_mount_path,
    config_hash,
    marker_filename,
    parse_marker_content,
)
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique

pytestmark = pytest.mark.anyio

needs_fuse = pytest.mark.skipif(fuse_unavailable() is not None, reason=str(fuse_unavailable()))


# -- pure parts ----------------------------------------------------------------------------------------


def test_config_hash_is_16_hex_digits_and_ignores_key_order() -> None:
    a = config_hash({"type": "s3", "bucket": "b", "nested": {"x": 1, "y": [1, 2]}})
    b = config_hash({"nested": {"y": [1, 2], "x": 1}, "bucket": "b", "type": "s3"})
    assert a == b
    assert len(a) == 16
    assert int(a, 16) >= 0
    assert config_hash({"type": "s3", "bucket": "c"}) != config_hash({"type": "s3", "bucket": "b"})


def test_marker_filename_is_the_base36_string_hash() -> None:
    # "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == -2**31
    assert marker_filename("hello") == "mount-1n1e4y"
    assert int(marker_filename("hello")[6:], 36) == 99162322
    assert int(marker_filename("polygenelubricants")[6:], 36) == 2**31
    assert marker_filename("/tmp/wd/data") == marker_filename("/tmp/wd/data")


def test_parse_marker_content_splits_at_the_last_bar() -> None:
    assert parse_marker_content("/a|b/c|0123456789abcdef") == ("/a|b/c", "0123456789abcdef")
    assert parse_marker_content("no separator") is None
    assert parse_marker_content("|abc") is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [("/data", "/data"), ("/data/", "/data"), ("/a//b", "/a/b"), ("/x.y-z_1", "/x.y-z_1")],
)
def test_canonical_mount_path(given: str, expected: str) -> None:
    assert canonical_mount_path(given) == expected


@pytest.mark.parametrize("bad", ["data", "/", "//", "/a/../b", "/a/./b", "/a b", "/ä", ""])
def test_bad_mount_paths_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="Invalid mount path"):
        canonical_mount_path(bad)


# -- the reference scenario (check 56) ------------------------------------------------------------


def _fs_dirs(base: Path) -> dict[str, Path]:
    dirs = {name: base / name for name in ("mA", "mB", "mC")}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["mA"] / "hello.txt").write_text("hello from A\n")
    return dirs


async def test_on_mount_hook_outcomes_states_instructions_and_cleanup(tmp_path: Path) -> None:
    dirs = _fs_dirs(tmp_path)
    wd = tmp_path / "wd"
    calls: list[dict[str, Any]] = []

    def hook(**kwargs: Any) -> Any:
        calls.append(kwargs)
        if kwargs["mount_path"] == "/skip":
            return False
        if kwargs["mount_path"] == "/custom":
            return {"success": False, "error": "nope"}
        return None

    sandbox = LocalSandbox(working_directory=str(wd))
    ws = Workspace(
        sandbox=sandbox,
        mounts={
            "/data": LocalFilesystem(dirs["mA"]),
            "/skip": LocalFilesystem(dirs["mB"]),
            "/custom": LocalFilesystem(dirs["mC"], read_only=True),
        },
        on_mount=hook,
    )
    entries = sandbox.mounts.entries
    assert [(p, e.state) for p, e in entries.items()] == [
        ("/data", "pending"),
        ("/skip", "pending"),
        ("/custom", "pending"),
    ]
    before = ws.get_instructions()
    assert before == (
        f'Local command execution. Working directory: "{wd}".\n\n'
        "Sandbox-mounted filesystems (accessible in shell commands):\n"
        f"  - {wd}/data: local (read-write)\n"
        f"  - {wd}/skip: local (read-write)\n"
        f"  - {wd}/custom: local (read-only)"
    )
    await ws.init()
    try:
        assert calls[0]["config"] == {"type": "local", "base_path": str(dirs["mA"])}
        assert calls[0]["sandbox"] is sandbox
        assert calls[0]["workspace"] is ws
        assert entries["/data"].state == "mounted"
        assert entries["/data"].error is None
        assert entries["/data"].config_hash is not None
        assert len(entries["/data"].config_hash) == 16
        assert (entries["/skip"].state, entries["/skip"].error) == ("unsupported", "Skipped by onMount hook")
        assert (entries["/custom"].state, entries["/custom"].error) == ("error", "nope")
        result = await sandbox.execute_command("cat data/hello.txt")
        assert result.stdout == "hello from A\n"
        assert os.path.islink(wd / "data")
        assert ws.get_instructions() == (
            f'Local command execution. Working directory: "{wd}".\n\n'
            "Sandbox-mounted filesystems (accessible in shell commands):\n"
            f"  - {wd}/data: local (read-write)\n\n"
            "Workspace-only filesystems (use file tools, NOT available in shell commands):\n"
            "  - /skip: local (read-write)\n"
            "  - /custom: local (read-only)"
        )
    finally:
        await ws.destroy()
    assert not os.path.lexists(wd / "data")
    assert (dirs["mA"] / "hello.txt").read_text() == "hello from A\n"  # the target is untouched


async def test_hook_that_raises_and_hook_that_mounts_itself(tmp_path: Path) -> None:
    dirs = _fs_dirs(tmp_path)

    async def hook(**kwargs: Any) -> Any:
        if kwargs["mount_path"] == "/boom":
            raise RuntimeError("boom")
        return {"success": True}

    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    ws = Workspace(
        sandbox=sandbox,
        mounts={"/boom": LocalFilesystem(dirs["mA"]), "/mine": LocalFilesystem(dirs["mB"])},
        on_mount=hook,
    )
    async with ws:
        boom, mine = sandbox.mounts.entries["/boom"], sandbox.mounts.entries["/mine"]
        assert (boom.state, boom.error) == ("error", "Mount hook error: boom")
        assert mine.state == "mounted"
        assert mine.config_hash == config_hash({"type": "local", "base_path": str(dirs["mB"])})
        # The hook did the mounting: the sandbox made nothing.
        assert not os.path.lexists(tmp_path / "wd" / "mine")
        assert not os.path.lexists(tmp_path / "wd" / "boom")


async def test_targets_that_are_occupied_are_refused_and_left_alone(tmp_path: Path) -> None:
    dirs = _fs_dirs(tmp_path)
    wd = tmp_path / "wd"
    (wd / "full").mkdir(parents=True)
    (wd / "full" / "keep.txt").write_text("mine")
    (wd / "file").write_text("a file")
    os.symlink(dirs["mC"], wd / "link")
    sandbox = LocalSandbox(working_directory=str(wd))
    ws = Workspace(
        sandbox=sandbox,
        mounts={
            "/full": LocalFilesystem(dirs["mA"]),
            "/file": LocalFilesystem(dirs["mB"]),
            "/link": LocalFilesystem(dirs["mA"]),
        },
    )
    async with ws:
        entries = sandbox.mounts.entries
        assert entries["/full"].state == "error"
        assert entries["/full"].error is not None
        assert f"Cannot mount at {wd}/full: directory exists and is not empty" in entries["/full"].error
        assert entries["/file"].state == "error"
        assert "a file exists at that path" in str(entries["/file"].error)
        assert entries["/link"].state == "error"
        assert "already occupied by an existing mount or symlink" in str(entries["/link"].error)
    assert (wd / "full" / "keep.txt").read_text() == "mine"
    assert (wd / "file").read_text() == "a file"
    assert os.readlink(wd / "link") == str(dirs["mC"])


async def test_invalid_mount_path_and_unmountable_filesystem(tmp_path: Path) -> None:
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    fs = LocalFilesystem(tmp_path / "d")
    outcome = await sandbox.mount(fs, "/a/../etc")
    assert outcome["success"] is False
    assert "Invalid mount path" in outcome["error"]
    outcome = await sandbox.mount(fs, "/")
    assert outcome["success"] is False
    assert "root" in outcome["error"]
    await sandbox.destroy()


async def test_symlink_mount_is_reused_by_a_new_sandbox_and_replaced_when_config_changes(tmp_path: Path) -> None:
    dirs = _fs_dirs(tmp_path)
    wd = tmp_path / "wd"
    first = LocalSandbox(working_directory=str(wd))
    assert (await first.mount(LocalFilesystem(dirs["mA"]), "/data"))["success"]
    # A second sandbox on the same working directory (e.g. after a restart) finds the
    # marker and the matching symlink: reused, not refused as foreign.
    second = LocalSandbox(working_directory=str(wd))
    assert (await second.mount(LocalFilesystem(dirs["mA"]), "/data"))["success"]
    assert os.readlink(wd / "data") == str(dirs["mA"])
    # Another configuration at the same path: the old symlink (ours) is replaced.
    assert (await second.mount(LocalFilesystem(dirs["mB"]), "/data"))["success"]
    assert os.readlink(wd / "data") == str(dirs["mB"])
    await second.unmount("/data")
    assert not os.path.lexists(wd / "data")
    await first.destroy()
    await second.destroy()


# -- FUSE mounts in the sandbox -------------------------------------------------------------------


def _s3(moto: MotoServer, *, read_only: bool = False, bucket: str = S3_BUCKET) -> FsspecFilesystem:
    return FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{bucket}/{unique('sbx')}", read_only=read_only)


def _state(sandbox: LocalSandbox, path: str) -> str:
    return sandbox.mounts.entries[path].state


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


def _mount_children() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "agentvfs.mounts._child"], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


@pytest.fixture
def no_leftover_mounts(tmp_path: Path) -> Iterator[None]:
    before = set(_mount_children())
    yield
    assert wait_until(lambda: set(_mount_children()) <= before, 15), "a mount process was left running"
    with open("/proc/self/mountinfo") as f:
        assert str(tmp_path) not in f.read(), "a mount was left behind"


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_bucket_is_fuse_mounted_and_shell_commands_see_its_files(moto: MotoServer, tmp_path: Path) -> None:
    bucket = _s3(moto)
    wd = tmp_path / "wd"
    sandbox = LocalSandbox(working_directory=str(wd))
    ws = Workspace(sandbox=sandbox, mounts={"/bucket": bucket})
    await bucket.write_file("docs/a.txt", "alpha\n")
    async with ws:
        entry = sandbox.mounts.entries["/bucket"]
        assert (entry.state, entry.error) == ("mounted", None)
        assert is_mounted(str(wd / "bucket"))
        result = await sandbox.execute_command("ls bucket/docs && cat bucket/docs/a.txt")
        assert (result.exit_code, result.stdout) == (0, "a.txt\nalpha\n")
        # Written by a command: in the bucket when the command's close() returned.
        result = await sandbox.execute_command("echo beta > bucket/docs/b.txt && echo more >> bucket/docs/a.txt")
        assert result.exit_code == 0, result.stderr
        assert await bucket.read_file("docs/b.txt", encoding="utf-8") == "beta\n"
        assert await bucket.read_file("docs/a.txt", encoding="utf-8") == "alpha\nmore\n"
        # Written through the API: visible to the next command at once (no TTL wait).
        await bucket.write_file("docs/a.txt", "replaced\n")
        await bucket.write_file("docs/c.txt", "gamma\n")
        result = await sandbox.execute_command("cat bucket/docs/a.txt bucket/docs/c.txt && ls bucket/docs")
        assert result.stdout == "replaced\ngamma\na.txt\nb.txt\nc.txt\n"
        await bucket.delete_file("docs/c.txt")
        result = await sandbox.execute_command("ls bucket/docs")
        assert result.stdout == "a.txt\nb.txt\n"
        assert ws.get_instructions().endswith(f"  - {wd}/bucket: s3 (read-write)")
    assert not is_mounted(str(wd / "bucket"))
    assert not os.path.exists(wd / "bucket")  # the empty mount point made for it is gone too


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_read_only_bucket_refuses_writes_with_erofs(moto: MotoServer, tmp_path: Path) -> None:
    writer = _s3(moto)
    await writer.write_file("a.txt", "data\n")
    bucket = FsspecFilesystem(writer.fs, root=writer.root, read_only=True)
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    async with Workspace(sandbox=sandbox, mounts={"/ro": bucket}):
        result = await sandbox.execute_command("cat ro/a.txt; echo x > ro/b.txt; rm ro/a.txt; mkdir ro/d")
        assert result.stdout == "data\n"
        assert result.stderr.count("Read-only file system") == 3, result.stderr
        assert await writer.exists("a.txt")
        assert not await writer.exists("b.txt")
        assert not await writer.exists("d")


@needs_fuse
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_read_only_local_directory_is_fuse_mounted_not_linked(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "f.txt").write_text("local\n")
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    async with Workspace(sandbox=sandbox, mounts={"/src": LocalFilesystem(base, read_only=True)}):
        host = tmp_path / "wd" / "src"
        assert not os.path.islink(host)
        assert is_mounted(str(host))
        result = await sandbox.execute_command("cat src/f.txt && touch src/new")
        assert result.stdout == "local\n"
        assert "Read-only file system" in result.stderr
        assert sorted(os.listdir(base)) == ["f.txt"]


@needs_fuse
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_memory_filesystem_is_served_in_process(tmp_path: Path) -> None:
    memory = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")
    await memory.write_file("m.txt", "in memory\n")
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    async with Workspace(sandbox=sandbox, mounts={"/mem": memory}):
        result = await sandbox.execute_command("cat mem/m.txt && echo new > mem/n.txt")
        assert result.stdout == "in memory\n"
        assert await memory.read_file("n.txt", encoding="utf-8") == "new\n"


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_missing_bucket_is_an_error_state_and_leaves_nothing(moto: MotoServer, tmp_path: Path) -> None:
    missing = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root="no-such-bucket-here/x")
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    async with Workspace(sandbox=sandbox, mounts={"/gone": missing}) as ws:
        entry = sandbox.mounts.entries["/gone"]
        assert entry.state == "error"
        assert "no-such-bucket-here" in str(entry.error)
        assert not os.path.exists(tmp_path / "wd" / "gone")
        assert "Workspace-only filesystems" in ws.get_instructions()


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_stop_unmounts_and_the_next_command_mounts_again(moto: MotoServer, tmp_path: Path) -> None:
    bucket = _s3(moto)
    await bucket.write_file("x.txt", "x\n")
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    ws = Workspace(sandbox=sandbox, mounts={"/b": bucket})
    await ws.init()
    try:
        await ws.stop()
        assert sandbox.status == "stopped"
        assert not is_mounted(str(tmp_path / "wd" / "b"))
        assert _state(sandbox, "/b") == "pending"
        result = await sandbox.execute_command("cat b/x.txt")  # restarts the sandbox: mounts again
        assert result.stdout == "x\n"
        assert _state(sandbox, "/b") == "mounted"
    finally:
        await ws.destroy()


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_isolated_commands_see_mounts_and_read_only_holds(moto: MotoServer, tmp_path: Path) -> None:
    if not LocalSandbox.detect_isolation()["available"]:
        pytest.skip("bubblewrap is not available")
    dirs = _fs_dirs(tmp_path)
    rw = _s3(moto)
    writer = _s3(moto)
    await writer.write_file("r.txt", "read me\n")
    ro = FsspecFilesystem(writer.fs, root=writer.root, read_only=True)
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"), isolation="bwrap")
    mounts = {"/rw": rw, "/ro": ro, "/local": LocalFilesystem(dirs["mA"])}
    async with Workspace(sandbox=sandbox, mounts=mounts):
        assert {p: e.state for p, e in sandbox.mounts.entries.items()} == dict.fromkeys(mounts, "mounted")
        result = await sandbox.execute_command(
            "cat ro/r.txt local/hello.txt && echo w > rw/w.txt && echo l > local/l.txt; echo no > ro/no.txt"
        )
        assert result.stdout == "read me\nhello from A\n"
        assert "Read-only file system" in result.stderr
        assert await rw.read_file("w.txt", encoding="utf-8") == "w\n"
        assert (dirs["mA"] / "l.txt").read_text() == "l\n"
        assert not await writer.exists("no.txt")


@needs_fuse
@pytest.mark.s3
async def test_killed_parent_takes_its_mounts_with_it(moto: MotoServer, tmp_path: Path) -> None:
    """kill -9 of the process that mounted: the child sees its pipe close, unmounts and ends;
    the mount point is usable again."""
    bucket = _s3(moto)
    await bucket.write_file("k.txt", "k\n")
    wd = tmp_path / "wd"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, anyio
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from agentvfs import FsspecFilesystem, Workspace
        from agentvfs.sandbox import LocalSandbox
        from agentvfs.testing import MotoServer
        import s3fs
        raw = s3fs.S3FileSystem(key="testing", secret="testing", use_listings_cache=False,
                                client_kwargs={{"endpoint_url": {moto.endpoint_url!r}}})
        fs = FsspecFilesystem(raw, root={bucket.root!r})
        async def main():
            sandbox = LocalSandbox(working_directory={str(wd)!r})
            ws = Workspace(sandbox=sandbox, mounts={{"/b": fs}})
            await ws.init()
            print(sandbox.mounts.entries["/b"].state, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        anyio.run(main)
        """
    )
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.strip() == "mounted", done.stderr
    assert wait_until(lambda: not is_mounted(str(wd / "b")), 15)
    assert wait_until(lambda: not _mount_children(), 15)
    # And the same place can be mounted again right away.
    sandbox = LocalSandbox(working_directory=str(wd))
    async with Workspace(sandbox=sandbox, mounts={"/b": bucket}):
        assert (await sandbox.execute_command("cat b/k.txt")).stdout == "k\n"


@needs_fuse
@pytest.mark.s3
@pytest.mark.usefixtures("no_leftover_mounts")
async def test_killed_mount_process_leaves_no_dead_mount(moto: MotoServer, tmp_path: Path) -> None:
    bucket = _s3(moto)
    sandbox = LocalSandbox(working_directory=str(tmp_path / "wd"))
    ws = Workspace(sandbox=sandbox, mounts={"/b": bucket})
    await ws.init()
    try:
        (child,) = [pid for pid in _mount_children() if pid in _children_of(os.getpid())]
        os.kill(child, signal.SIGKILL)
        # auto_unmount: the kernel mount goes away with its server.
        assert wait_until(lambda: not is_mounted(str(tmp_path / "wd" / "b")), 15)
    finally:
        await ws.destroy()
    assert not is_mounted(str(tmp_path / "wd" / "b"))

