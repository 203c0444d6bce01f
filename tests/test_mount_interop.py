"""Another tool on the same bucket: s3fs-fuse and an agentvfs mount on one moto S3 prefix,
in both directions. What one writes (modes, owners, modification times, symbolic links,
FIFOs) the other shows; a rewrite by agentvfs keeps every metadata key it does not own."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _mounted import wait_until
from _mountproc import Storage, cli_env, mount_point, start_mount, stop_mount
from agentvfs.mounts import fuse_available, is_mounted

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"),
    pytest.mark.skipif(shutil.which("s3fs") is None, reason="s3fs-fuse is not installed (scripts/setup.sh test installs it)"),
]

ROOT = os.geteuid() == 0


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    yield from mount_point(tmp_path)


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[str]:
    point = tmp_path / "s3fs"
    point.mkdir()
    yield os.fspath(point)
    if is_mounted(os.fspath(point)):
        subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


def _s3fs(storage: Storage, point: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """s3fs-fuse on the storage's prefix (its own caches off, so it asks S3 each time)."""
    bucket, _, prefix = storage.prefix.partition("/")
    secret = tmp_path / "s3fs-passwd"
    secret.write_text("testing:testing\n")
    secret.chmod(0o600)
    log = open(tmp_path / "s3fs.log", "ab")
    proc = subprocess.Popen(
        [
            "s3fs", f"{bucket}:/{prefix}", point, "-f",
            "-o", f"url={storage.moto.endpoint_url}", "-o", "use_path_request_style",
            "-o", f"passwd_file={secret}", "-o", "endpoint=us-east-1", "-o", "dbglevel=warn",
            "-o", "stat_cache_expire=1",
        ],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    assert wait_until(lambda: is_mounted(point) or proc.poll() is not None, timeout=30)
    assert proc.poll() is None, (tmp_path / "s3fs.log").read_text()
    return proc


def _stop_s3fs(proc: subprocess.Popen[bytes], point: str) -> None:
    subprocess.run(["fusermount3", "-u", point], check=False)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _metadata(storage: Storage, name: str) -> dict[str, str]:
    bucket, _, prefix = storage.prefix.partition("/")
    out = storage.raw.call_s3("head_object", Bucket=bucket, Key=f"{prefix}/{name}")
    return {str(k): str(v) for k, v in out["Metadata"].items()}


def test_s3fs_fuse_sees_what_agentvfs_wrote(
    mnt: str, peer: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("s3", tmp_path, request)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        (m / "run.sh").write_text("#!/bin/sh\necho from s3fs\n")
        os.chmod(m / "run.sh", 0o755)
        (m / "secret").write_text("s\n")
        os.chmod(m / "secret", 0o600)
        os.utime(m / "secret", ns=(1_700_000_000_000_000_000, 1_700_000_000_250_000_000))
        if ROOT:
            os.chown(m / "secret", 1234, 5678)
        os.symlink("run.sh", m / "link")
        os.mkfifo(m / "pipe", 0o640)
    finally:
        stop_mount(proc, log)
    s3fs = _s3fs(storage, peer, tmp_path)
    try:
        p = Path(peer)
        assert stat.S_IMODE(os.stat(p / "run.sh").st_mode) == 0o755
        assert subprocess.run([p / "run.sh"], capture_output=True, check=True).stdout == b"from s3fs\n"
        secret = os.stat(p / "secret")
        assert stat.S_IMODE(secret.st_mode) == 0o600
        assert secret.st_mtime_ns == 1_700_000_000_250_000_000
        if ROOT:
            assert (secret.st_uid, secret.st_gid) == (1234, 5678)
        assert os.readlink(p / "link") == "run.sh"
        assert (p / "link").read_text().startswith("#!/bin/sh")
        assert stat.S_ISFIFO(os.lstat(p / "pipe").st_mode)
        assert stat.S_IMODE(os.lstat(p / "pipe").st_mode) == 0o640
    finally:
        _stop_s3fs(s3fs, peer)


def test_agentvfs_sees_what_s3fs_fuse_wrote_and_keeps_its_metadata(
    mnt: str, peer: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("s3", tmp_path, request)
    s3fs = _s3fs(storage, peer, tmp_path)
    try:
        p = Path(peer)
        (p / "tool.sh").write_text("#!/bin/sh\necho tool\n")
        os.chmod(p / "tool.sh", 0o750)
        os.utime(p / "tool.sh", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        if ROOT:
            os.chown(p / "tool.sh", 4321, 8765)
        os.symlink("tool.sh", p / "alias")
        os.mkfifo(p / "queue", 0o600)
    finally:
        _stop_s3fs(s3fs, peer)
    # A key another tool keeps with the object, beside s3fs-fuse's own.
    bucket, _, prefix = storage.prefix.partition("/")
    key = f"{prefix}/tool.sh"
    storage.raw.call_s3(
        "copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
        MetadataDirective="REPLACE", Metadata={**_metadata(storage, "tool.sh"), "owner-team": "infra"},
    )  # fmt: skip
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        m = Path(mnt)
        tool = os.lstat(m / "tool.sh")
        assert stat.S_IMODE(tool.st_mode) == 0o750
        assert tool.st_mtime_ns == 1_600_000_000_000_000_000
        if ROOT:
            assert (tool.st_uid, tool.st_gid) == (4321, 8765)
        assert subprocess.run([m / "tool.sh"], capture_output=True, check=True).stdout == b"tool\n"
        assert os.readlink(m / "alias") == "tool.sh"
        assert stat.S_ISFIFO(os.lstat(m / "queue").st_mode)
        # A rewrite and a chmod through agentvfs keep the other tool's key and s3fs's mode.
        with open(m / "tool.sh", "a") as f:
            f.write("echo more\n")
        time.sleep(0.1)
        kept = _metadata(storage, "tool.sh")
        assert kept.get("owner-team") == "infra"
        assert int(kept["mode"]) == stat.S_IFREG | 0o750
        os.chmod(m / "tool.sh", 0o700)
    finally:
        stop_mount(proc, log)
    kept = _metadata(storage, "tool.sh")
    assert (kept.get("owner-team"), int(kept["mode"])) == ("infra", stat.S_IFREG | 0o700)
    assert storage.get("tool.sh") == b"#!/bin/sh\necho tool\necho more\n"
    s3fs = _s3fs(storage, peer, tmp_path)
    try:
        assert stat.S_IMODE(os.stat(Path(peer) / "tool.sh").st_mode) == 0o700
    finally:
        _stop_s3fs(s3fs, peer)


@pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone is not installed (scripts/setup.sh test installs it)")
def test_rclone_and_agentvfs_read_each_others_modification_times(
    mnt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage("s3", tmp_path, request)
    remote = (
        f":s3,provider=Other,endpoint='{storage.moto.endpoint_url}',access_key_id=testing,"
        f"secret_access_key=testing:{storage.prefix}"
    )
    env = {**cli_env(), "TZ": "UTC"}  # rclone lists times in local time
    local = tmp_path / "from-rclone.txt"
    local.write_text("rclone\n")
    os.utime(local, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    subprocess.run(["rclone", "copyto", os.fspath(local), f"{remote}/from-rclone.txt"], env=env, check=True)
    log = tmp_path / "mount.log"
    proc = start_mount(storage, mnt, tmp_path / "state", log=log)
    try:
        assert os.stat(f"{mnt}/from-rclone.txt").st_mtime_ns == 1_600_000_000_123_456_789
        Path(mnt, "from-agentvfs.txt").write_text("agentvfs\n")
        os.utime(f"{mnt}/from-agentvfs.txt", ns=(1_700_000_000_000_000_000, 1_700_000_000_250_000_000))
    finally:
        stop_mount(proc, log)
    listed = subprocess.run(["rclone", "lsl", remote], env=env, capture_output=True, text=True, check=True).stdout
    assert "2023-11-14 22:13:20.250000000 from-agentvfs.txt" in listed
