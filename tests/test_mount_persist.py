"""What a mount of a local directory keeps on the disk: modes, owners and times set through
the mount are the files' own, so a new mount process (and anyone reading the directory) sees
them. Real mounts, with and without FUSE passthrough."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from _mountproc import Storage, mount_point, start_mount, stop_mount
from agentvfs.mounts import fuse_available

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}")

ROOT = os.geteuid() == 0


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    yield from mount_point(tmp_path)


def _archive(path: Path) -> None:
    """A tar with a 0755 script, a 0600 secret and a 0700 directory, fixed times and owners."""
    with tarfile.open(path, "w") as tar:
        for name, mode, data, kind in [
            ("tool", 0o700, b"", tarfile.DIRTYPE),
            ("tool/run.sh", 0o755, b"#!/bin/sh\necho ran\n", tarfile.REGTYPE),
            ("tool/secret", 0o600, b"s3cr3t\n", tarfile.REGTYPE),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = kind, mode, len(data)
            info.mtime = 1_600_000_000
            info.uid = info.gid = 4321
            tar.addfile(info, io.BytesIO(data) if data else None)


@pytest.mark.parametrize("passthrough", ["true", "false"])
def test_modes_owners_and_times_reach_the_disk_and_the_next_mount(
    passthrough: str, mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("local", tmp_path, request)
    archive = tmp_path / "t.tar"
    _archive(archive)
    log = tmp_path / "mount.log"
    first = start_mount(storage, mnt, tmp_path / "state", "-o", f"passthrough={passthrough}", log=log)
    try:
        # tar as root restores modes, owners and times (chmod, chown, utimensat).
        subprocess.run(["tar", "-xf", os.fspath(archive), "-C", mnt, "--same-owner", "-p"], check=True)
        Path(mnt, "made.txt").write_text("x")
        os.chmod(f"{mnt}/made.txt", 0o640)
        os.utime(f"{mnt}/made.txt", ns=(1_500_000_000_000_000_000, 1_500_000_000_123_456_789))
        os.mkdir(f"{mnt}/private", 0o700)
        if ROOT:
            os.chown(f"{mnt}/made.txt", 1234, 5678)
    finally:
        stop_mount(first, log)
    disk = storage.dir

    def on_disk(name: str) -> os.stat_result:
        return os.lstat(disk / name)

    assert stat.S_IMODE(on_disk("tool").st_mode) == 0o700
    assert stat.S_IMODE(on_disk("tool/run.sh").st_mode) == 0o755
    assert stat.S_IMODE(on_disk("tool/secret").st_mode) == 0o600
    assert on_disk("tool/run.sh").st_mtime == 1_600_000_000
    assert stat.S_IMODE(on_disk("made.txt").st_mode) == 0o640
    assert on_disk("made.txt").st_mtime_ns == 1_500_000_000_123_456_789
    assert stat.S_IMODE(on_disk("private").st_mode) == 0o700
    if ROOT:
        assert (on_disk("tool/run.sh").st_uid, on_disk("tool/run.sh").st_gid) == (4321, 4321)
        assert (on_disk("made.txt").st_uid, on_disk("made.txt").st_gid) == (1234, 5678)
    # A new mount process shows what the disk holds, and a script keeps its +x.
    second = start_mount(storage, mnt, tmp_path / "state", "-o", f"passthrough={passthrough}", log=log)
    try:
        for name in ("tool", "tool/run.sh", "tool/secret", "made.txt", "private"):
            seen, kept = os.lstat(f"{mnt}/{name}"), on_disk(name)
            assert stat.S_IMODE(seen.st_mode) == stat.S_IMODE(kept.st_mode), name
            assert (seen.st_uid, seen.st_gid) == (kept.st_uid, kept.st_gid), name
            assert seen.st_mtime_ns == kept.st_mtime_ns, name
        assert subprocess.run([f"{mnt}/tool/run.sh"], capture_output=True, check=True).stdout == b"ran\n"
        # Rewriting a file keeps its mode and owner on the disk.
        with open(f"{mnt}/tool/run.sh", "a") as f:
            f.write("echo again\n")
    finally:
        stop_mount(second, log)
    assert stat.S_IMODE(on_disk("tool/run.sh").st_mode) == 0o755
    if ROOT:
        assert on_disk("tool/run.sh").st_uid == 4321
    assert (disk / "tool/run.sh").read_text().endswith("echo again\n")


@pytest.mark.skipif(not ROOT, reason="a chown to another user needs root")
def test_a_file_renamed_while_written_keeps_its_owner_and_mode_on_disk(
    mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("local", tmp_path, request)
    log = tmp_path / "mount.log"
    # Without passthrough, writes are staged and the rename publishes the staged copy.
    proc = start_mount(storage, mnt, tmp_path / "state", "-o", "passthrough=false", log=log)
    try:
        Path(mnt, "f.txt").write_text("one\n")
        os.chown(f"{mnt}/f.txt", 1234, 5678)
        os.chmod(f"{mnt}/f.txt", 0o750)
        with open(f"{mnt}/f.txt", "a") as f:
            f.write("two\n")
            f.flush()
            os.rename(f"{mnt}/f.txt", f"{mnt}/g.txt")
    finally:
        stop_mount(proc, log)
    kept = os.lstat(storage.dir / "g.txt")
    assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (1234, 5678, 0o750)
    assert (storage.dir / "g.txt").read_text() == "one\ntwo\n"
    assert not (storage.dir / "f.txt").exists()
