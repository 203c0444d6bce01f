"""Every benchmark target does the same operations the same way: one test over all of them."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from agentvfs.bench._targets import Boto3Target, FsspecTarget, PathTarget, Target
from agentvfs.testing import MotoServer
from conftest import S3_BUCKET, unique


@pytest.fixture(params=["path", "fsspec", pytest.param("boto3", marks=pytest.mark.s3)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "path":
        yield PathTarget("local disk", "local", str(tmp_path))
    elif request.param == "fsspec":
        root = f"/{unique('targets')}"
        fs = fsspec.filesystem("memory", skip_instance_cache=True)
        yield FsspecTarget("direct", "memory", fs, root)
        fs.rm(root, recursive=True)
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        yield Boto3Target("boto3", "s3", moto.boto3_client(), S3_BUCKET, unique("targets"))


def test_every_operation_does_what_it_says(target: Target) -> None:
    block = os.urandom(64 << 10)
    target.makedirs("d")
    assert target.write_file("d/big.bin", block, 4) > 0
    assert target.sha256("d/big.bin") == hashlib.sha256(block * 4).hexdigest()
    assert target.read_file("d/big.bin", len(block) * 4) > 0
    with pytest.raises(OSError, match="expected"):
        target.read_file("d/big.bin", 1)  # a wrong byte count is an error, not a figure
    times = target.read_ranges("d/big.bin", [0, 1000, 100_000], 4096)
    assert len(times) == 3 and all(t > 0 for t in times)
    target.write_ranges("d/big.bin", [10, 200_000], b"\xa5" * 100)
    data = target.read_all("d/big.bin")
    assert data[10:110] == b"\xa5" * 100 and data[200_000:200_100] == b"\xa5" * 100
    assert data[:10] == (block * 4)[:10] and len(data) == len(block) * 4
    names = [f"f{i}" for i in range(20)]
    target.makedirs("many")
    assert target.create_files("many", names, b"x" * 10) > 0
    assert target.stat_files("many", names) > 0
    assert target.list_long("many", 20, timeout=60) > 0
    with pytest.raises(OSError, match="expected 21"):
        target.list_long("many", 21, timeout=60)
    assert target.unlink_files("many", names) > 0
    target.remove("d")
    missing = (FileNotFoundError, *([target.client.exceptions.NoSuchKey] if isinstance(target, Boto3Target) else []))
    with pytest.raises(missing):
        target.read_all("d/big.bin")


def test_the_mount_layer_is_described_without_credentials() -> None:
    from agentvfs.bench._backends import Backend
    from agentvfs.bench._layers import layers_for

    backend = Backend("s3", "s3", "bucket/x", options={"endpoint_url": "http://127.0.0.1:9", "key": "AK", "secret": "SK"})
    specs, _ = layers_for(backend, peers=False)
    (mount,) = [spec for spec in specs if spec.name == "agentvfs"]
    assert mount.how.startswith("agentvfs mount s3://bucket/x MNT -o endpoint_url=http://127.0.0.1:9")
    assert "-o -o" not in mount.how and "AK" not in mount.how and "SK" not in mount.how
