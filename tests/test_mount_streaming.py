"""Streamed uploads: a large file written in order goes up in parts while it is written."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from _mounted import wait_until
from agentvfs import FsspecFilesystem
from agentvfs.mounts import Mount, fuse_available, is_mounted
from agentvfs.testing import Harness, MotoServer
from conftest import S3_BUCKET, s3_harness

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(fuse_available() is not None, reason=f"FUSE unavailable: {fuse_available()}"),
]

MiB = 1024 * 1024
OPTIONS = {"stream_threshold": MiB, "stream_part_size": 5 * MiB}


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[str]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield os.fspath(point)
    if is_mounted(os.fspath(point)):
        subprocess.run(["fusermount3", "-uz", os.fspath(point)], check=False)


def _uploads(client: Any, prefix: str) -> list[dict[str, Any]]:
    found = client.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=prefix).get("Uploads", [])
    return list(found)


def _parts(client: Any, upload: dict[str, Any]) -> int:
    listed = client.list_parts(Bucket=S3_BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    return len(listed.get("Parts", []))


def _prefix(h: Harness) -> str:
    return str(h.fs.root).split("/", 1)[1]  # type: ignore[attr-defined]


def test_a_large_file_written_in_order_is_uploaded_while_written(moto: MotoServer, mnt: str) -> None:
    h = s3_harness(moto)
    client = moto.boto3_client()
    chunk = os.urandom(MiB)
    with Mount(h.fs, mnt, options=OPTIONS):
        fd = os.open(f"{mnt}/big.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        for _ in range(12):
            os.write(fd, chunk)
        # Parts reach storage before close, but nothing is visible under the name yet.
        assert wait_until(lambda: any(_parts(client, u) >= 2 for u in _uploads(client, _prefix(h))))
        assert h.get("big.bin") is None
        os.close(fd)
        assert h.get("big.bin") == chunk * 12
        assert _uploads(client, _prefix(h)) == []
        with open(f"{mnt}/big.bin", "rb") as f:
            assert f.read() == chunk * 12


def test_an_overwrite_behind_the_stream_falls_back_to_a_whole_upload(moto: MotoServer, mnt: str) -> None:
    h = s3_harness(moto)
    client = moto.boto3_client()
    data = bytearray(os.urandom(12 * MiB))
    with Mount(h.fs, mnt, options=OPTIONS):
        fd = os.open(f"{mnt}/edited.bin", os.O_CREAT | os.O_RDWR, 0o644)
        for i in range(12):
            os.write(fd, data[i * MiB : (i + 1) * MiB])
        assert wait_until(lambda: any(_parts(client, u) >= 1 for u in _uploads(client, _prefix(h))))
        os.pwrite(fd, b"EDIT", 10)  # rewrites bytes already sent
        data[10:14] = b"EDIT"
        os.ftruncate(fd, 11 * MiB)
        del data[11 * MiB :]
        os.close(fd)
        assert h.get("edited.bin") == bytes(data)
        assert wait_until(lambda: _uploads(client, _prefix(h)) == [])


def test_a_write_into_a_part_still_in_flight_is_not_lost(moto: MotoServer, mnt: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The first part is read from the staged copy, then held before it reaches storage; a
    # write into its range meanwhile must break the stream, or the old bytes win.
    h = s3_harness(moto)
    fs = h.fs
    assert isinstance(fs, FsspecFilesystem)
    held, release = threading.Event(), threading.Event()
    open_upload = fs.open_upload

    class Holding:
        def __init__(self, upload: Any) -> None:
            self.upload, self.first = upload, True

        async def write(self, data: bytes) -> None:
            if self.first:
                self.first = False
                held.set()
                await trio.to_thread.run_sync(release.wait)
            await self.upload.write(data)

        async def commit(self) -> None:
            await self.upload.commit()

        async def abort(self) -> None:
            await self.upload.abort()

    async def holding_upload(path: str, *, part_size: int, **attributes: Any) -> Any:
        upload = await open_upload(path, part_size=part_size, **attributes)
        return None if upload is None else Holding(upload)

    monkeypatch.setattr(fs, "open_upload", holding_upload)
    data = bytearray(os.urandom(12 * MiB))
    with Mount(fs, mnt, options=OPTIONS):
        fd = os.open(f"{mnt}/raced.bin", os.O_CREAT | os.O_RDWR, 0o644)
        for i in range(6):
            os.write(fd, data[i * MiB : (i + 1) * MiB])
        assert held.wait(10), "the first part was never sent"
        os.pwrite(fd, b"RACE", 1000)  # inside the part in flight, beyond nothing sent yet
        data[1000:1004] = b"RACE"
        release.set()
        for i in range(6, 12):
            os.write(fd, data[i * MiB : (i + 1) * MiB])
        os.close(fd)
        assert h.get("raced.bin") == bytes(data)


def test_unlinking_a_file_being_streamed_leaves_no_upload(moto: MotoServer, mnt: str) -> None:
    h = s3_harness(moto)
    client = moto.boto3_client()
    with Mount(h.fs, mnt, options=OPTIONS):
        fd = os.open(f"{mnt}/gone.bin", os.O_CREAT | os.O_WRONLY, 0o644)
        for _ in range(11):
            os.write(fd, os.urandom(MiB))
        assert wait_until(lambda: any(_parts(client, u) >= 1 for u in _uploads(client, _prefix(h))))
        os.unlink(f"{mnt}/gone.bin")
        os.write(fd, b"still writable")
        os.close(fd)
        assert wait_until(lambda: _uploads(client, _prefix(h)) == [])
        assert h.get("gone.bin") is None
        with pytest.raises(OSError) as info:
            os.stat(f"{mnt}/gone.bin")
        assert info.value.errno == errno.ENOENT


def test_small_files_go_up_in_one_request_at_close(moto: MotoServer, mnt: str) -> None:
    h = s3_harness(moto)
    client = moto.boto3_client()
    with Mount(h.fs, mnt, options={"stream_threshold": 64 * MiB}):
        with open(f"{mnt}/small.bin", "wb") as f:
            f.write(os.urandom(3 * MiB))
            assert _uploads(client, _prefix(h)) == []
        assert h.get("small.bin") is not None
