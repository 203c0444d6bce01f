"""The codec between POSIX attributes and object metadata (s3fs-fuse's, rclone's and
gcsfuse's names), what S3 and GCS keep of it through the filesystem layer, and local
disk, where the attributes are the file's own and its times part of its version."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentvfs.errors import PermissionDenied, StaleFileError
from agentvfs.vfs import (
    LocalFilesystem,
    PosixAttributes,
    Version,
    foreign_metadata,
    list_stats,
    make_hard_link,
    publish_file,
    rewrite_file,
)
from agentvfs.vfs._posix import attributes_from_metadata, metadata_for
from conftest import harness_for, memory_harness

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


# -- local disk: the attributes are the file's own, and part of its version ----------------


async def test_local_disk_publishes_a_file_with_its_attributes_and_their_version(tmp_path: Path) -> None:
    fs = LocalFilesystem(os.fspath(tmp_path / "root"))
    staged = tmp_path / "staged"
    staged.write_bytes(b"#!/bin/sh\n")
    version = await publish_file(fs, os.fspath(staged), "bin/run.sh", create=True, attributes=SCRIPT)
    st = await fs.stat("bin/run.sh")
    on_disk = os.lstat(tmp_path / "root/bin/run.sh")
    # Set before the file took its name: the version returned is the file's, times and all.
    assert version is not None and version == st.etag
    assert (stat.S_IMODE(on_disk.st_mode), on_disk.st_mtime_ns, on_disk.st_atime_ns) == (
        0o755, SCRIPT.mtime_ns, SCRIPT.atime_ns,
    )  # fmt: skip
    if os.geteuid() == 0:
        assert (on_disk.st_uid, on_disk.st_gid) == (1000, 100)
    # The next publish over it is conditional on exactly that version.
    again = tmp_path / "again"
    again.write_bytes(b"#!/bin/sh\nexit 0\n")
    newer = await publish_file(fs, os.fspath(again), "bin/run.sh", expected=Version(version))
    assert newer is not None and newer != version
    with pytest.raises(StaleFileError):
        await publish_file(fs, os.fspath(again), "bin/run.sh", expected=Version(version))


async def test_local_disk_sets_times_only_on_the_version_expected(tmp_path: Path) -> None:
    fs = LocalFilesystem(os.fspath(tmp_path / "root"))
    await fs.write_file("f.txt", b"one")
    seen = await fs.stat("f.txt")
    times = (1_000_000_000, 1_600_000_000_000_000_007)
    version = fs.local_set_attributes("f.txt", times_ns=times, expected=Version.of(seen))
    assert version == (await fs.stat("f.txt")).etag != seen.etag
    assert os.lstat(tmp_path / "root/f.txt").st_mtime_ns == times[1]
    # The version seen before is gone: a change made on it is refused and changes nothing.
    with pytest.raises(StaleFileError):
        fs.local_set_attributes("f.txt", mode=0o600, times_ns=(5, 5), expected=Version.of(seen))
    left = os.lstat(tmp_path / "root/f.txt")
    assert (left.st_mtime_ns, stat.S_IMODE(left.st_mode)) == (times[1], 0o644 & ~_umask())
    # The async form checks and answers the same way.
    assert await fs.set_attributes("f.txt", SCRIPT, expected=Version(version)) == (await fs.stat("f.txt")).etag


async def test_local_disk_rewrites_a_hard_linked_file_in_place_only_over_its_version(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fs = LocalFilesystem(os.fspath(root))
    await fs.write_file("a.txt", b"shared\n")
    await make_hard_link(fs, "a.txt", "b.txt")
    seen = await fs.stat("a.txt")
    source = tmp_path / "new"
    source.write_bytes(b"shared, changed\n")
    version = await rewrite_file(fs, os.fspath(source), "a.txt", expected=Version.of(seen), attributes=SCRIPT)
    assert version == (await fs.stat("a.txt")).etag
    # One file with two names still: both show the new content and the times given.
    assert os.lstat(root / "a.txt").st_ino == os.lstat(root / "b.txt").st_ino
    assert (root / "b.txt").read_bytes() == b"shared, changed\n"
    assert os.lstat(root / "b.txt").st_mtime_ns == SCRIPT.mtime_ns
    # Over a version that is no longer there: refused, and the file is as it was.
    source.write_bytes(b"lost")
    with pytest.raises(StaleFileError):
        await rewrite_file(fs, os.fspath(source), "a.txt", expected=Version.of(seen))
    assert (root / "a.txt").read_bytes() == b"shared, changed\n"
    # Replaced by a rename since: the file at the name is not the one that was seen.
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"x" * 16)
    current = await fs.stat("a.txt")
    os.replace(replacement, root / "a.txt")
    with pytest.raises(StaleFileError):
        await rewrite_file(fs, os.fspath(source), "a.txt", expected=Version.of(current))
    assert (root / "a.txt").read_bytes() == b"x" * 16
    with pytest.raises(StaleFileError):
        await rewrite_file(fs, os.fspath(source), "gone.txt", expected=Version.of(current))


async def test_storage_without_hard_links_refuses_a_rewrite_in_place(tmp_path: Path) -> None:
    h = memory_harness()
    source = tmp_path / "new"
    source.write_bytes(b"data")
    await h.fs.write_file("f.txt", b"old")
    with pytest.raises(PermissionDenied, match="no hard links"):
        await rewrite_file(h.fs, os.fspath(source), "f.txt")
    assert await h.fs.read_file("f.txt") == b"old"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("backend", [pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)])
async def test_a_directory_just_listed_is_statted_by_its_marker_alone(
    backend: str, request: pytest.FixtureRequest, tmp_path: object
) -> None:
    # A mount stats every directory new to it right after listing its parent: the listing
    # already says "directory" (a prefix, which shadows a key of the same name), so only
    # the marker, which holds the attributes, is asked for.
    h = harness_for(backend, request, tmp_path)
    fs = h.fs
    h.put("plain/x.txt", b"1")
    h.put("kept/y.txt", b"2")
    h.put("both/z.txt", b"3")
    h.put("both", b"a key beside the prefix")
    kept = PosixAttributes(mode=stat.S_IFDIR | 0o700, uid=1000, gid=100, mtime_ns=1_700_000_000_000_000_000)
    await fs.set_attributes("kept", kept)  # type: ignore[attr-defined]
    backend_ = fs.backend  # type: ignore[attr-defined]
    asked: list[str] = []
    if backend == "s3":
        head = backend_._head_object

        def counted(bucket: str, key: str) -> dict[str, object]:
            asked.append(key.rsplit("/", 2)[-2] + "/" if key.endswith("/") else key.rsplit("/", 1)[-1])
            return head(bucket, key)  # type: ignore[no-any-return]

        backend_._head_object = counted
    listed = {st.name: st for st in await list_stats(fs, "")}
    assert {n: listed[n].type for n in ("plain", "kept", "both")} == dict.fromkeys(("plain", "kept", "both"), "directory")
    for name in ("plain", "kept", "both"):
        st = await fs.stat(name)
        assert st.type == "directory", name
    assert (await fs.stat("kept")).mode == 0o700
    assert (await fs.stat("kept")).uid == 1000
    if backend == "s3":
        # The marker of each, and nothing else: no HEAD of the name as a file, no listing below.
        assert sorted(asked) == ["both/", "kept/", "kept/", "kept/", "plain/"], asked
        # Only just after the listing: another client may remove a prefix at any time.
        from agentvfs.vfs import _object_store

        asked.clear()
        original = _object_store._LISTED_DIR_AGE
        _object_store._LISTED_DIR_AGE = 0.0
        try:
            assert (await fs.stat("plain")).type == "directory"
        finally:
            _object_store._LISTED_DIR_AGE = original
        assert asked == ["plain", "plain/"], asked
