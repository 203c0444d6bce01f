"""Mount lifecycle, durability, coherence and read-only behaviour, through real FUSE mounts."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from _mounted import wait_until
from agentvfs import FsspecFilesystem
from agentvfs.errors import MountError
from agentvfs.mounts import (
    Mount,
    MountOptions,
    cleanup_stale_mount,
    fuse_available,
    is_mounted,
    mount,
)
from agentvfs.testing import Harness, MotoServer, local_harness
from conftest import memory_harness, s3_harness

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield os.fspath(point)
    if is_mounted(os.fspath(point)):  # a failed test must not leave a mount behind
        subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


class _FailingUploads(FsspecFilesystem):
    """A filesystem whose uploads fail while ``fail`` is set (a bucket refusing writes)."""

    fail = True

    async def upload_file(self, local_path: str, path: str) -> None:
        if self.fail:
            raise OSError(errno.EIO, f"injected upload failure for {path}")
        await super().upload_file(local_path, path)

    async def publish_file(self, local_path: str, path: str, **condition: Any) -> str | None:
        if self.fail:
            raise OSError(errno.EIO, f"injected upload failure for {path}")
        return await super().publish_file(local_path, path, **condition)


# -- read-only ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "filesystem"])
def test_read_only_refuses_every_write_with_erofs(mnt: str, how: str) -> None:
    h = memory_harness()
    h.put("keep.txt", b"original")
    h.put("d/inner.txt", b"inner")
    fs = h.reopen(read_only=True) if how == "filesystem" else h.fs
    with Mount(fs, mnt, read_only=True if how == "flag" else None) as handle:
        assert handle.read_only
        attempts: list[tuple[str, Any]] = [
            ("open w", lambda: open(f"{mnt}/new.txt", "w")),
            ("open a", lambda: open(f"{mnt}/keep.txt", "a")),
            ("open r+", lambda: open(f"{mnt}/keep.txt", "r+")),
            ("truncate", lambda: os.truncate(f"{mnt}/keep.txt", 0)),
            ("unlink", lambda: os.unlink(f"{mnt}/keep.txt")),
            ("mkdir", lambda: os.mkdir(f"{mnt}/newdir")),
            ("rmdir", lambda: os.rmdir(f"{mnt}/d")),
            ("rename", lambda: os.rename(f"{mnt}/keep.txt", f"{mnt}/moved.txt")),
            ("chmod", lambda: os.chmod(f"{mnt}/keep.txt", 0o600)),
            ("utime", lambda: os.utime(f"{mnt}/keep.txt", (1, 1))),
            ("symlink", lambda: os.symlink("keep.txt", f"{mnt}/link")),
            ("link", lambda: os.link(f"{mnt}/keep.txt", f"{mnt}/hard")),
            ("mkfifo", lambda: os.mkfifo(f"{mnt}/fifo")),
        ]
        for what, attempt in attempts:
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS, what
        with open(f"{mnt}/keep.txt", "rb") as f:
            assert f.read() == b"original"
        assert sorted(os.listdir(mnt)) == ["d", "keep.txt"]
    assert h.get("keep.txt") == b"original"
    assert h.get("d/inner.txt") == b"inner"
    assert h.get("new.txt") is None and h.get("moved.txt") is None


def test_read_only_filesystem_cannot_mount_read_write(mnt: str) -> None:
    fs = memory_harness().reopen(read_only=True)
    with pytest.raises(MountError, match="read-only"):
        Mount(fs, mnt, read_only=False)


# -- durability ---------------------------------------------------------------------------------


def test_upload_failure_is_eio_at_close_and_never_retried_behind_the_writer(
    mnt: str, caplog: pytest.LogCaptureFixture
) -> None:
    h = memory_harness()
    h.put("f.txt", b"old content")
    fs = _FailingUploads(h.fs.fs, root=h.fs.root)  # type: ignore[attr-defined]
    handle = Mount(fs, mnt).start()
    try:
        f = open(f"{mnt}/f.txt", "r+b")
        f.write(b"NEW")
        with pytest.raises(OSError) as info:
            f.close()
        assert info.value.errno == errno.EIO
        assert h.get("f.txt") == b"old content"  # the failed write lost nothing
        assert any("upload of /f.txt failed" in r.getMessage() for r in caplog.records)
        # Its writer was told: the data goes to the recovery area, and the mount shows what
        # storage holds (what the next mount will show), even once storage is back.
        assert wait_until(lambda: len(handle.kept) == 1)
        kept = handle.kept[0]
        assert kept.path == "f.txt" and "upload failed" in kept.reason
        assert open(kept.data, "rb").read() == b"NEW content"
        fs.fail = False
        assert wait_until(lambda: open(f"{mnt}/f.txt", "rb").read() == b"old content")
        assert h.get("f.txt") == b"old content"
        # fsync reports a failure as well; the writer's own next fsync tries again.
        fs.fail = True
        fd = os.open(f"{mnt}/f.txt", os.O_WRONLY)
        os.pwrite(fd, b"N", 0)
        with pytest.raises(OSError) as info:
            os.fsync(fd)
        assert info.value.errno == errno.EIO
        fs.fail = False
        os.fsync(fd)
        assert h.get("f.txt") == b"Nld content"
        os.close(fd)
    finally:
        fs.fail = False
        handle.close()


def test_unmount_keeps_uploads_that_still_fail(mnt: str) -> None:
    h = memory_harness()
    fs = _FailingUploads(h.fs.fs, root=h.fs.root)  # type: ignore[attr-defined]
    handle = Mount(fs, mnt).start()
    fd = os.open(f"{mnt}/pending.txt", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"data that cannot be uploaded")
    with pytest.raises(OSError):
        os.fsync(fd)
    with pytest.raises(OSError):
        os.close(fd)  # its close tries again, for its writer, and fails again
    # The kernel sends the last release after close(2) returns: it keeps the file in the
    # recovery area, or, when the unmount comes first, the unmount does and says so.
    told: MountError | None = None
    try:
        handle.close()
    except MountError as exc:
        told = exc
    if told is not None:
        assert "pending.txt" in str(told) and "upload failed" in str(told)
        kept_entries = told.details["kept"]
    else:
        kept_entries = [entry.to_dict() for entry in handle.kept]
    # Nothing was thrown away, and nothing was uploaded behind the writer's back.
    (kept,) = kept_entries
    assert kept["path"] == "pending.txt" and "upload failed" in kept["reason"]
    assert open(kept["data"], "rb").read() == b"data that cannot be uploaded"
    assert h.get("pending.txt") is None
    assert not is_mounted(mnt)


def test_unmount_waits_for_writers_then_keeps_what_is_still_open(mnt: str) -> None:
    h = memory_harness()
    h.put("open.txt", b"the old version")
    handle = Mount(h.fs, mnt, options={"stop_timeout": 1.5}).start()
    # A writer that closes while the unmount waits: its file is published whole.
    late = open(f"{mnt}/late.txt", "wb")
    late.write(b"closed in time")
    timer = threading.Timer(0.5, late.close)
    timer.start()
    # A writer that never closes: its half-written file is not published over the old one.
    fd = os.open(f"{mnt}/open.txt", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"half of the ne")
    started = time.monotonic()
    with pytest.raises(MountError, match=r"open\.txt.*still open for writing") as info:
        handle.close()
    assert 1.4 < time.monotonic() - started < 10
    timer.join()
    assert h.get("late.txt") == b"closed in time"
    assert h.get("open.txt") == b"the old version"
    (kept,) = info.value.details["kept"]
    assert kept["path"] == "open.txt" and open(kept["data"], "rb").read() == b"half of the ne"
    with pytest.raises(OSError):
        os.close(fd)


def test_staging_budget_full_is_enospc(mnt: str) -> None:
    h = memory_harness()
    h.put("big.bin", b"x" * 1000)
    with Mount(h.fs, mnt, options={"staging_limit": 256 * 1024, "writeback_cache": False}):
        held = os.open(f"{mnt}/held.bin", os.O_CREAT | os.O_RDWR, 0o644)
        os.pwrite(held, b"h" * (200 * 1024), 0)  # staged while open: takes most of the budget
        fd = os.open(f"{mnt}/big.bin", os.O_RDWR)
        with pytest.raises(OSError) as info:
            os.pwrite(fd, b"y" * (100 * 1024), 0)
        assert info.value.errno == errno.ENOSPC
        # A single file larger than the whole staging area is "too large", not "full".
        with pytest.raises(OSError) as info:
            os.ftruncate(fd, 1 << 40)
        assert info.value.errno == errno.EFBIG
        os.close(fd)
        assert h.get("big.bin") == b"x" * 1000
        os.close(held)
        assert h.get("held.bin") == b"h" * (200 * 1024)
        # Closed files leave the staging area: the budget is free again.
        with open(f"{mnt}/big.bin", "r+b") as f:
            f.write(b"y" * (100 * 1024))
        assert h.get("big.bin") == b"y" * (100 * 1024)
        assert os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize <= 256 * 1024


def test_write_is_in_storage_when_close_returns(mnt: str) -> None:
    h = memory_harness()
    with Mount(h.fs, mnt):
        with open(f"{mnt}/a.txt", "wb") as f:
            f.write(b"first")
        assert h.get("a.txt") == b"first"
        with open(f"{mnt}/a.txt", "ab") as f:
            f.write(b" then appended")
        assert h.get("a.txt") == b"first then appended"
        subprocess.run(["sh", "-c", f"echo shell >> {mnt}/a.txt"], check=True)
        assert h.get("a.txt") == b"first then appended" + b"shell\n"


# -- coherence ----------------------------------------------------------------------------------


def test_api_changes_are_visible_in_the_mount_at_once(mnt: str) -> None:
    h = memory_harness()
    h.put("doc.txt", b"version one")
    fs = h.fs
    # A long TTL: only invalidation can make the changes visible in time.
    with Mount(fs, mnt, options={"metadata_ttl": 60}):
        assert open(f"{mnt}/doc.txt", "rb").read() == b"version one"
        assert not os.path.exists(f"{mnt}/new.txt")
        anyio.run(fs.write_file, "doc.txt", b"version two, longer")
        assert open(f"{mnt}/doc.txt", "rb").read() == b"version two, longer"
        assert os.stat(f"{mnt}/doc.txt").st_size == len(b"version two, longer")
        anyio.run(fs.write_file, "new.txt", b"created by the API")
        assert open(f"{mnt}/new.txt", "rb").read() == b"created by the API"
        anyio.run(fs.delete_file, "doc.txt")
        assert not os.path.exists(f"{mnt}/doc.txt")
        anyio.run(fs.mkdir, "sub/dir")
        assert os.path.isdir(f"{mnt}/sub/dir")
        anyio.run(fs.move_file, "new.txt", "sub/dir/moved.txt")
        assert sorted(os.listdir(mnt)) == ["sub"]
        assert open(f"{mnt}/sub/dir/moved.txt", "rb").read() == b"created by the API"


def test_storage_changes_are_visible_within_the_ttl(mnt: str) -> None:
    h = memory_harness()
    h.put("ext.txt", b"short")
    with Mount(h.fs, mnt, options={"metadata_ttl": 0.3}):
        assert open(f"{mnt}/ext.txt", "rb").read() == b"short"
        h.put("ext.txt", b"much longer content from another writer")
        h.put("other.txt", b"new")
        time.sleep(0.4)
        assert open(f"{mnt}/ext.txt", "rb").read() == b"much longer content from another writer"
        assert sorted(os.listdir(mnt)) == ["ext.txt", "other.txt"]


@pytest.mark.anyio
async def test_mount_from_async_code_and_read_it_in_the_same_process(mnt: str) -> None:
    h = memory_harness()
    h.put("x.txt", b"served to myself")
    async with mount(h.fs, mnt) as handle:
        assert handle.mounted
        # Blocking calls on the caller's loop: the FUSE server has its own thread.
        with open(f"{mnt}/x.txt", "rb") as f:
            assert f.read() == b"served to myself"
        await h.fs.write_file("y.txt", b"api")
        assert os.listdir(mnt) == ["x.txt", "y.txt"]
    assert not is_mounted(mnt)


# -- lifecycle ----------------------------------------------------------------------------------


def test_one_session_per_process(mnt: str, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with Mount(memory_harness().fs, mnt), pytest.raises(MountError, match=r"one FUSE session per process"):
        Mount(memory_harness().fs, other).start()
    assert not is_mounted(mnt)


def test_missing_mountpoint_is_a_mount_error(tmp_path: Path) -> None:
    with pytest.raises(MountError, match="does not exist; create the directory first"):
        Mount(memory_harness().fs, tmp_path / "absent").start()
    (tmp_path / "file").write_text("x")
    with pytest.raises(MountError, match="not a directory"):
        Mount(memory_harness().fs, tmp_path / "file").start()


def test_unknown_option_is_refused() -> None:
    with pytest.raises(Exception, match="Unknown mount option 'bogus'"):
        MountOptions.from_value({"bogus": 1})
    with pytest.raises(Exception, match="metadata_ttl"):
        MountOptions.from_value({"metadata_ttl": "soon"})


_CHILD = textwrap.dedent(
    """
    import sys, time
    from agentvfs import FsspecFilesystem
    from agentvfs.mounts import Mount
    fs = FsspecFilesystem("memory://killed")
    Mount(fs, sys.argv[1]).start()
    print("ready", flush=True)
    time.sleep(600)
    """
)

_RAW_CHILD = textwrap.dedent(
    """
    import sys, pyfuse3, trio
    pyfuse3.init(pyfuse3.Operations(), sys.argv[1], {"fsname=stale"})
    print("ready", flush=True)
    trio.run(pyfuse3.main)
    """
)


def _spawn(code: str, mountpoint: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", code, mountpoint], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_kill_9_leaves_the_mount_point_usable(mnt: str) -> None:
    child = _spawn(_CHILD, mnt)
    assert is_mounted(mnt)
    child.send_signal(signal.SIGKILL)
    child.wait()
    # auto_unmount: fusermount3 notices the dead server and unmounts. On a loaded machine it
    # now and then does not (libfuse's helper exits without unmounting): the next mount at
    # this place then removes the dead mount itself, so the mount point stays usable.
    if wait_until(lambda: not is_mounted(mnt), timeout=10):
        assert os.listdir(mnt) == []
    with Mount(memory_harness().fs, mnt):
        assert os.listdir(mnt) == []
    assert not is_mounted(mnt)


def test_a_stale_mount_is_cleaned_before_mounting(mnt: str) -> None:
    child = _spawn(_RAW_CHILD, mnt)  # no auto_unmount: killing it leaves a dead mount
    child.send_signal(signal.SIGKILL)
    child.wait()
    with pytest.raises(OSError) as info:
        os.listdir(mnt)
    assert info.value.errno == errno.ENOTCONN
    h = memory_harness()
    h.put("fresh.txt", b"ok")
    with Mount(h.fs, mnt):
        assert os.listdir(mnt) == ["fresh.txt"]


def test_a_live_mount_is_not_taken_over(mnt: str) -> None:
    child = _spawn(_CHILD, mnt)
    try:
        with pytest.raises(MountError, match="already in use"):
            cleanup_stale_mount(mnt)
    finally:
        child.terminate()
        child.wait()
        wait_until(lambda: not is_mounted(mnt))


def test_cli_mounts_until_sigterm(tmp_path: Path, mnt: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("from disk\n")
    exe = os.path.join(os.path.dirname(sys.executable), "agentvfs")
    child = subprocess.Popen([exe, "mount", os.fspath(data), mnt, "-o", "metadata_ttl=2"], stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: is_mounted(mnt))
        assert open(f"{mnt}/hello.txt").read() == "from disk\n"
        with open(f"{mnt}/out.txt", "w") as f:
            f.write("through the mount\n")
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert not is_mounted(mnt)
    assert (data / "out.txt").read_text() == "through the mount\n"
    assert child.stderr is not None
    assert "unmounted" in child.stderr.read()


def test_cli_reports_bad_options(mnt: str) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "agentvfs")
    done = subprocess.run([exe, "mount", "memory://x", mnt, "-o", "metadata_ttl=-1"], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "metadata_ttl" in done.stderr


# -- rename limits on storage without atomic rename ------------------------------------------------


@pytest.mark.s3
def test_directory_rename_beyond_the_limit_is_exdev_and_mv_copies(moto: MotoServer, mnt: str) -> None:
    h: Harness = s3_harness(moto)
    for i in range(3):
        h.put(f"big/f{i}.txt", f"{i}".encode())
    h.put("small/only.txt", b"one")
    with Mount(h.fs, mnt, options={"rename_dir_limit": 2}):
        os.rename(f"{mnt}/small", f"{mnt}/small2")
        assert h.get("small2/only.txt") == b"one" and h.get("small/only.txt") is None
        with pytest.raises(OSError) as info:
            os.rename(f"{mnt}/big", f"{mnt}/big2")
        assert info.value.errno == errno.EXDEV
        subprocess.run(["mv", f"{mnt}/big", f"{mnt}/big2"], check=True)
        assert sorted(os.listdir(f"{mnt}/big2")) == ["f0.txt", "f1.txt", "f2.txt"]
    assert h.get("big2/f2.txt") == b"2" and h.get("big/f2.txt") is None


def test_xattrs_are_refused(mnt: str) -> None:
    h = memory_harness()
    h.put("x.txt", b"x")
    with Mount(h.fs, mnt):
        with pytest.raises(OSError) as info:
            os.setxattr(f"{mnt}/x.txt", "user.k", b"v")
        assert info.value.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)
        with pytest.raises(OSError) as info:
            os.getxattr(f"{mnt}/x.txt", "user.k")
        assert info.value.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA)


def test_no_unmount_helper_outlives_its_mount(mnt: str) -> None:
    def helpers() -> int:
        out = subprocess.run(["ps", "-eo", "ppid,args"], capture_output=True, text=True, check=True).stdout
        return sum(1 for line in out.splitlines() if "fusermount" in line and line.split()[0] == str(os.getpid()))

    before = helpers()
    for _ in range(3):
        with Mount(memory_harness().fs, mnt):
            assert helpers() == before + 1  # auto_unmount's guard while mounted
    assert helpers() == before


def test_an_open_reader_sees_what_is_written_through_the_mount(tmp_path: Path, mnt: str) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "shared.txt").write_bytes(b"first version")
    with Mount(local_harness(os.fspath(base)).fs, mnt):
        reader = os.open(f"{mnt}/shared.txt", os.O_RDONLY)
        assert os.pread(reader, 100, 0) == b"first version"
        with open(f"{mnt}/shared.txt", "r+b") as writer:
            writer.write(b"FIRST")
        # The writer's copy was published as a new file: the reader follows it.
        assert os.pread(reader, 100, 0) == b"FIRST version"
        assert (base / "shared.txt").read_bytes() == b"FIRST version"
        os.close(reader)


@pytest.mark.s3
def test_cli_mounts_a_bucket_with_storage_options(moto: MotoServer, mnt: str, tmp_path: Path) -> None:
    h = s3_harness(moto)
    h.put("seed.txt", b"from the bucket\n")
    root = str(h.fs.root)  # type: ignore[attr-defined]
    exe = os.path.join(os.path.dirname(sys.executable), "agentvfs")
    # Credentials from files (KEY=@FILE): nothing secret on the command line.
    (tmp_path / "key").write_text("testing\n")
    (tmp_path / "secret").write_text("testing\n")
    argv = [
        exe, "mount", f"s3://{root}", mnt,
        "-o", f"endpoint_url={moto.endpoint_url}", "-o", f"key=@{tmp_path / 'key'}",
        "-o", f"secret=@{tmp_path / 'secret'}",
        "-o", '{"verify": false}'.join(("client_kwargs=", "")),
        "-o", '{"region_name": "us-east-1"}'.join(("config_kwargs=", "")),
        "-o", "metadata_ttl=0.5",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert wait_until(lambda: is_mounted(mnt), timeout=30)
        with open(f"/proc/{child.pid}/cmdline", "rb") as f:
            assert b"testing" not in f.read()
        with open(f"{mnt}/seed.txt", "rb") as f:
            assert f.read() == b"from the bucket\n"
        subprocess.run(["sh", "-c", f"echo written by a shell > {mnt}/out.txt"], check=True)
        assert h.get("out.txt") == b"written by a shell\n"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert not is_mounted(mnt)


def test_cli_warns_of_credentials_on_the_command_line(tmp_path: Path) -> None:
    from agentvfs.cli import _storage_option

    (tmp_path / "s").write_text("from-a-file\n")
    assert _storage_option(f"secret=@{tmp_path / 's'}") == ("secret", "from-a-file")
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read the value from"):
        _storage_option(f"secret=@{tmp_path / 'missing'}")
    done = subprocess.run(
        [sys.executable, "-c", "from agentvfs.cli import _storage_option as o; o('secret=abc'); o('token=x'); o('anon=true')"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2 and "KEY=@FILE" in warnings[0] and "-o secret=..." in warnings[0]
    assert "abc" not in done.stderr


def test_mounting_a_bucket_that_does_not_exist_fails_cleanly(moto: MotoServer, mnt: str) -> None:
    fs = FsspecFilesystem(moto.s3fs(), root="no-such-bucket-here/prefix")
    with pytest.raises(MountError, match=r"Bucket not found: s3://no-such-bucket-here"):
        Mount(fs, mnt).start()
    assert not is_mounted(mnt)
    with Mount(memory_harness().fs, mnt):  # the session was given back
        assert os.listdir(mnt) == []


# -- safe defaults ------------------------------------------------------------------------------


def test_a_mount_point_must_be_an_empty_directory_unless_nonempty(mnt: str, tmp_path: Path) -> None:
    h = memory_harness()
    Path(mnt, "project.txt").write_text("my work")
    with pytest.raises(MountError, match=r"not empty.*project\.txt.*nonempty"):
        Mount(h.fs, mnt).start()
    assert not is_mounted(mnt)
    with Mount(h.fs, mnt, options={"nonempty": True}):
        assert os.listdir(mnt) == []  # hidden while mounted
    assert Path(mnt, "project.txt").read_text() == "my work"
    with pytest.raises(MountError, match=r"does not exist"):
        Mount(h.fs, os.fspath(tmp_path / "nope")).start()


def test_only_the_mounting_user_by_default_and_df_shows_room(mnt: str) -> None:
    h = memory_harness()
    with Mount(h.fs, mnt, options={"staging_limit": 64 << 20}):
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            (line,) = [row for row in f if f" {mnt} " in row]
        assert "allow_other" not in line
        st = os.statvfs(mnt)
        # The staging budget as the disk: nothing staged, so nothing used.
        assert st.f_bavail * st.f_frsize == 64 << 20 == st.f_blocks * st.f_frsize
        df = subprocess.run(["df", "--output=pcent", mnt], capture_output=True, text=True, check=True).stdout
        assert df.split()[-1] == "0%"
    with Mount(h.fs, mnt, options={"allow_other": True}):
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            (line,) = [row for row in f if f" {mnt} " in row]
        assert "allow_other" in line


def test_set_id_bits_are_shown_but_not_honoured_unless_asked(mnt: str) -> None:
    """Modes come from storage (object metadata whoever can write the bucket sets): a mount is
    ``nosuid`` unless ``suid=true``, so a set-user-ID bit there does not make a root program."""
    h = memory_harness()
    h.put("tool", b"#!/bin/sh\n")

    def mount_flags() -> list[str]:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            (line,) = [row for row in f if f" {mnt} " in row]
        return line.split()[5].split(",")  # the per-mount flags

    with Mount(h.fs, mnt):
        os.chmod(f"{mnt}/tool", 0o4755)
        assert os.stat(f"{mnt}/tool").st_mode & 0o7777 == 0o4755
        assert "nosuid" in mount_flags()
    with Mount(h.fs, mnt, options={"suid": True}):
        assert "nosuid" not in mount_flags()


# -- a mount served by a child process --------------------------------------------------------------


def test_a_mount_process_outlives_the_thread_that_started_it(tmp_path: Path, mnt: str) -> None:
    """The thread that starts a child mount is often a short-lived worker (anyio's end with
    their event loop): the mount must stay while the process that started it lives."""
    from agentvfs.mounts import ProcessMount

    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("kept")
    started: list[ProcessMount] = []
    worker = threading.Thread(target=lambda: started.append(ProcessMount(FsspecFilesystem(f"file://{data}"), mnt).start()))
    worker.start()
    worker.join()
    (handle,) = started
    try:
        time.sleep(1.5)  # three of the child's parent checks
        assert handle.mounted
        assert Path(mnt, "f.txt").read_text() == "kept"
    finally:
        handle.close()
    assert not is_mounted(mnt)


PARENT = """
import sys, time
from agentvfs import FsspecFilesystem
from agentvfs.mounts import ProcessMount
handle = ProcessMount(FsspecFilesystem("file://" + sys.argv[1]), sys.argv[2]).start()
print(handle.pid, flush=True)
time.sleep(600)
"""


def test_a_mount_process_ends_with_its_parent(tmp_path: Path, mnt: str) -> None:
    """kill -9 of the process that started a child mount: the child unmounts and ends."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("x")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, os.fspath(data), mnt], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert is_mounted(mnt)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert wait_until(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child), timeout=20)
    assert wait_until(lambda: not is_mounted(mnt), timeout=10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_sigterm_to_a_mount_process_interrupts_only_its_wait_for_requests() -> None:
    """The child's SIGTERM handler raises only while the child waits for its parent's next
    message; anywhere else (a change being applied under a lock, the unmount publishing
    staged files) the signal is noted and acted on once that work is done."""
    from agentvfs.mounts._child import _Stop

    stop = _Stop()
    old = signal.signal(signal.SIGTERM, stop.on_signal)
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # busy: noted, nothing raised
        assert stop.requested
        with pytest.raises(KeyboardInterrupt), stop.interruptible():  # asked already: no wait begins
            pass
        stop.requested = False

        def wait_for_a_request() -> None:
            with stop.interruptible():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)

        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            wait_for_a_request()
        assert time.monotonic() - started < 4
        os.kill(os.getpid(), signal.SIGTERM)  # after the wait: noted again, not raised
        assert stop.requested
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_storm_of_sigterms_still_unmounts_a_mount_process_and_publishes(tmp_path: Path, mnt: str) -> None:
    from agentvfs.mounts import ProcessMount

    data = tmp_path / "data"
    data.mkdir()
    handle = ProcessMount(FsspecFilesystem(f"file://{data}"), mnt).start()
    try:
        Path(mnt, "written.txt").write_text("through the mount\n")
        pid = handle.pid
        assert pid is not None and handle._proc is not None
        for _ in range(200):
            if handle._proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.002)
        assert handle._proc.wait(timeout=30) == 0
    finally:
        if handle._proc is not None and handle._proc.poll() is None:
            handle._proc.kill()
    assert wait_until(lambda: not is_mounted(mnt), timeout=10)
    assert (data / "written.txt").read_text() == "through the mount\n"
