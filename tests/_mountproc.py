"""Storage and mount processes for the tests of mounts across their lifecycle: a storage
location read and written directly (a local directory or a prefix of the session's moto
bucket), ``agentvfs mount`` processes on it, and ``agentvfs recover``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from _mounted import wait_until
from agentvfs.mounts import is_mounted
from agentvfs.testing import FakeGcsServer, MotoServer
from conftest import GCS_BUCKET, S3_BUCKET, unique

__all__ = ["CLI", "Storage", "cli_env", "mount_point", "recover", "start_mount", "stop_mount", "wait_unmounted"]

CLI = [sys.executable, "-c", "import sys; from agentvfs.cli import main; sys.exit(main())"]


def mount_point(tmp_path: Path) -> Iterator[str]:
    """An empty mount point, unmounted after the test whatever happened (for a fixture)."""
    point = tmp_path / "mnt"
    point.mkdir()
    yield os.fspath(point)
    if is_mounted(os.fspath(point)):
        subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


class Storage:
    """One storage location, as URL and options for the CLI, and read directly."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.options: list[str] = []
        if kind == "local":
            self.dir = tmp_path / "store"
            self.dir.mkdir()
            self.url = os.fspath(self.dir)
        elif kind == "gcs":
            fake_gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
            self.raw = fake_gcs.gcsfs()
            self.prefix = f"{GCS_BUCKET}/{unique('crash')}"
            self.url = f"gcs://{self.prefix}"
            self.options = ["-o", f"endpoint_url={fake_gcs.endpoint_url}", "-o", "token=anon", "-o", "project=test"]
        else:
            moto: MotoServer = request.getfixturevalue("moto")
            self.moto = moto
            self.raw = moto.s3fs(use_listings_cache=False)
            self.prefix = f"{S3_BUCKET}/{unique('crash')}"
            self.url = f"s3://{self.prefix}"
            self.options = ["-o", f"endpoint_url={moto.endpoint_url}"]
        #: The storage as its mounts file it in the recovery area (a directory as file://).
        self.recovery_url = f"file://{self.dir}" if kind == "local" else self.url

    def put(self, path: str, data: bytes) -> None:
        if self.kind == "local":
            (self.dir / path).parent.mkdir(parents=True, exist_ok=True)
            (self.dir / path).write_bytes(data)
        else:
            self.raw.pipe_file(f"{self.prefix}/{path}", data)

    def get(self, path: str) -> bytes | None:
        try:
            return (self.dir / path).read_bytes() if self.kind == "local" else bytes(self.raw.cat_file(f"{self.prefix}/{path}"))
        except FileNotFoundError:
            return None

    def etag(self, path: str) -> str | None:
        if self.kind == "local":
            return None
        info = self.raw.info(f"{self.prefix}/{path}")
        return str(info["generation"] if self.kind == "gcs" else info["ETag"]).strip('"')


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_CA_BUNDLE", None)
    # A mount that does not stop is made to print every thread's stack (SIGABRT, stop_mount).
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def start_mount(
    storage: Storage, mnt: str, state: Path, *extra: str, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """An ``agentvfs mount`` process serving ``storage`` at ``mnt`` (``env``: more of its
    environment), once the mount answers."""
    args = [*CLI, "mount", storage.url, mnt, *storage.options, "-o", f"state_dir={state}", *extra]
    # passthrough off: a local mount then stages its writes (what a crash can catch mid-way).
    args += ["-o", "passthrough=false"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env={**cli_env(), **(env or {})})
    assert wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=30), log.read_text()
    assert proc.poll() is None, log.read_text()
    return proc


def stop_mount(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """SIGTERM a mount process and assert it exits 0 within ``timeout``. One that does not is
    aborted, so its log ends with the stack of each thread (``PYTHONFAULTHANDLER``): where it
    hung."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise AssertionError(f"the mount did not exit within {timeout} s of SIGTERM:\n{log.read_text(errors='replace')}") from None
    assert code == 0, log.read_text(errors="replace")


def recover(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "recover", "--state-dir", os.fspath(state), *args],
        capture_output=True, text=True, env=cli_env(), timeout=60, check=False,
    )  # fmt: skip


def wait_unmounted(mnt: str) -> None:
    """After a mount process was killed: wait for ``auto_unmount`` to remove its mount, or,
    where it lost a race with a writer still holding a file of the dead mount (``EBUSY``),
    remove the dead mount as the next mount at that place does."""
    from agentvfs.errors import MountError
    from agentvfs.mounts import cleanup_stale_mount

    # auto_unmount takes milliseconds once the process is gone; one that lost the race never
    # comes, so it is not waited for long.
    if not wait_until(lambda: not is_mounted(mnt), timeout=3):
        try:
            removed = cleanup_stale_mount(mnt)
        except MountError:  # auto_unmount came after all, between its checks: nothing to remove
            removed = False
        assert removed or not is_mounted(mnt)
