"""The codec between POSIX attributes and object metadata (s3fs-fuse's, rclone's and
gcsfuse's names), and what S3 and GCS keep of it through the filesystem layer."""

from __future__ import annotations

import stat

import pytest

from agentvfs.vfs import PosixAttributes, foreign_metadata
from agentvfs.vfs._posix import attributes_from_metadata, metadata_for
from conftest import harness_for

pytestmark = pytest.mark.anyio

SCRIPT = PosixAttributes(
    mode=stat.S_IFREG | 0o755, uid=1000, gid=100, atime_ns=1_000_000_000, mtime_ns=1_700_000_000_250_000_000,
    ctime_ns=1_700_000_001_000_000_001,
)  # fmt: skip


def test_s3_metadata_uses_s3fs_fuse_names_and_formats() -> None:
    meta = metadata_for(SCRIPT, "s3")
    assert meta == {
        "mode": "33261", "uid": "1000", "gid": "100", "atime": "1", "mtime": "1700000000.250000000",
        "ctime": "1700000001.000000001",
    }  # fmt: skip
    assert attributes_from_metadata(meta) == SCRIPT


def test_gcs_metadata_adds_gcsfuse_names_and_rfc3339_times() -> None:
    link = PosixAttributes(mode=stat.S_IFLNK | 0o777, mtime_ns=1_700_000_000_000_000_123, target="../t")
    meta = metadata_for(link, "gcs")
    assert meta["gcsfuse_symlink_target"] == "../t"
    assert meta["mtime"] == meta["gcsfuse_mtime"] == "2023-11-14T22:13:20.000000123Z"
    back = attributes_from_metadata(meta)
    assert back is not None
    assert (back.kind, back.target, back.mtime_ns) == (stat.S_IFLNK, "../t", 1_700_000_000_000_000_123)


@pytest.mark.parametrize(
    ("meta", "mtime_ns"),
    [
        ({"mtime": "1600000000"}, 1_600_000_000_000_000_000),  # s3fs-fuse, whole seconds
        ({"mtime": "1600000000.123456789"}, 1_600_000_000_123_456_789),  # s3fs-fuse, rclone on S3
        ({"mtime": "2020-09-13T12:26:40.5Z"}, 1_600_000_000_500_000_000),  # rclone on GCS
        ({"gcsfuse_mtime": "2020-09-13T12:26:40.000000001Z"}, 1_600_000_000_000_000_001),
        ({"X-Amz-Meta-Mtime": "1600000000"}, None),  # not a key the stores give back
        ({"mtime": "yesterday"}, None),
    ],
)
def test_modification_times_of_every_peer_are_read(meta: dict[str, str], mtime_ns: int | None) -> None:
    attrs = attributes_from_metadata(meta)
    assert (attrs.mtime_ns if attrs is not None else None) == mtime_ns


def test_metadata_without_attributes_and_foreign_keys() -> None:
    assert attributes_from_metadata({}) is None
    assert attributes_from_metadata({"owner-team": "infra"}) is None
    assert attributes_from_metadata({"mode": "0"}) is None
    meta = metadata_for(SCRIPT, "s3", keep={"owner-team": "infra", "mode": "1"})
    assert meta["owner-team"] == "infra" and meta["mode"] == "33261"
    assert foreign_metadata(meta) == {"owner-team": "infra"}


@pytest.mark.parametrize(
    "meta",
    [
        {"mode": "9" * 400, "uid": "-1", "gid": "99999999999999999999999", "mtime": "9" * 60},
        {"mode": "33188x", "uid": "1e3", "mtime": "1" * 100},
        {"mode": "4294967295", "mtime": "99999-01-01T00:00:00Z"},
        {"mode": "²", "uid": "٣", "mtime": "١٧٠٠٠٠٠٠٠٠"},  # digits, to str.isdigit()
        {"mtime": "9999-12-31T23:59:59Z"},  # past what a nanosecond time holds
    ],
)
def test_hostile_metadata_reads_as_absent(meta: dict[str, str]) -> None:
    """Anyone who can write the bucket writes the metadata: nothing out of range is taken."""
    assert attributes_from_metadata(meta) is None


def test_an_unknown_file_type_reads_as_a_regular_file() -> None:
    attrs = attributes_from_metadata({"mode": str(0o170000 | 0o640)})
    assert attrs is not None and (attrs.kind, attrs.perm) == (stat.S_IFREG, 0o640)


def test_an_s3fs_symlink_takes_its_target_from_the_content() -> None:
    attrs = attributes_from_metadata({"mode": str(stat.S_IFLNK | 0o777)}, content=b"target/file")
    assert attrs is not None and attrs.target == "target/file"


@pytest.mark.parametrize("backend", [pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)])
async def test_object_stores_keep_attributes_and_special_files(
    backend: str, request: pytest.FixtureRequest, tmp_path: object
) -> None:
    h = harness_for(backend, request, tmp_path)
    fs = h.fs
    assert fs.attribute_storage == "metadata"  # type: ignore[attr-defined]
    await fs.write_file("run.sh", b"#!/bin/sh\n")
    await fs.set_attributes("run.sh", SCRIPT)  # type: ignore[attr-defined]
    st = await fs.stat("run.sh")
    assert (st.mode, st.uid, st.gid, st.mtime_ns) == (0o755, 1000, 100, SCRIPT.mtime_ns)
    assert await fs.read_file("run.sh") == b"#!/bin/sh\n"  # the data stayed
    link = PosixAttributes(mode=stat.S_IFLNK | 0o777, mtime_ns=1, target="run.sh")
    await fs.make_special("ln", link)  # type: ignore[attr-defined]
    st = await fs.stat("ln")
    assert st.file_kind == stat.S_IFLNK and st.type == "file"
    assert await fs.read_file("ln") == b"run.sh"  # s3fs-fuse's form: the target is the content
    with pytest.raises(FileExistsError):
        await fs.make_special("ln", link)  # type: ignore[attr-defined]
    await fs.make_special("fifo", PosixAttributes(mode=stat.S_IFIFO | 0o600))  # type: ignore[attr-defined]
    assert (await fs.stat("fifo")).file_kind == stat.S_IFIFO
