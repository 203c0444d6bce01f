"""Streamed uploads: a large file written in order goes up in parts while it is written."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _mounted import wait_until
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
