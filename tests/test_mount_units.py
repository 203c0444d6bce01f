"""Pieces of the mount layer that need no FUSE: options and the read-ahead layout."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from agentvfs import LocalFilesystem
from agentvfs.errors import WorkspaceError
from agentvfs.mounts import MountOptions, _passthrough
from agentvfs.mounts._ops import MountOperations
from agentvfs.mounts._options import parse_option_strings
from agentvfs.mounts._readahead import _PartLayout
from conftest import memory_harness

MiB = 1024 * 1024


def test_parts_start_small_and_double_up_to_the_part_size() -> None:
    layout = _PartLayout(16 * MiB)
    sizes = [b - a for a, b in (layout.bounds(i) for i in range(7))]
    assert sizes == [1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 16 * MiB, 16 * MiB]
    assert layout.bounds(0)[0] == 0
    for i in range(50):
        assert layout.bounds(i)[1] == layout.bounds(i + 1)[0]  # no gap, no overlap


@pytest.mark.parametrize("part_size", [256 * 1024, MiB, 3 * MiB, 16 * MiB])
def test_every_offset_falls_in_the_part_that_holds_it(part_size: int) -> None:
    layout = _PartLayout(part_size)
    rng = random.Random(7)
    offsets = [0, 1, MiB - 1, MiB, 15 * MiB, 31 * MiB - 1] + [rng.randrange(1 << 40) for _ in range(2000)]
    for offset in offsets:
        start, stop = layout.bounds(layout.index_of(offset))
        assert start <= offset < stop


def test_options_from_strings_and_mappings() -> None:
    parsed = parse_option_strings(["metadata_ttl=2.5,allow_other=false", "debug", "staging_limit=0x1000"])
    options = MountOptions.from_value(parsed)
    assert options.metadata_ttl == 2.5
    assert options.allow_other is False
    assert options.debug is True
    assert options.staging_limit == 4096
    assert MountOptions.from_value({"part-size": 4 * MiB}).part_size == 4 * MiB
    assert MountOptions.from_value(None) == MountOptions()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"bogus": 1}, "Unknown mount option 'bogus'"),
        ({"metadata_ttl": -1}, "metadata_ttl"),
        ({"allow_other": "maybe"}, "allow_other"),
        ({"part_size": True}, "part_size"),
        ("metadata_ttl=1", "must be a mapping"),
    ],
)
def test_bad_options_name_what_is_wrong(given: object, message: str) -> None:
    with pytest.raises(WorkspaceError, match=message) as info:
        MountOptions.from_value(given)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_CONFIG"


def test_directory_nlink_follows_its_subdirectories_through_every_change() -> None:
    import stat

    from agentvfs.mounts._nodes import Node

    def node(ino: int, kind: int) -> Node:
        return Node(ino, kind, 0o755, uid=0, gid=0)

    root = node(1, stat.S_IFDIR)
    assert root.nlink == 2
    children = root.children
    assert children is not None
    children["a"] = node(2, stat.S_IFDIR)
    children["b"] = node(3, stat.S_IFDIR)
    children["f"] = node(4, stat.S_IFREG)
    assert root.nlink == 4
    children["b"] = node(5, stat.S_IFREG)  # replaced by a file
    assert root.nlink == 3
    assert children.pop("a").ino == 2 and root.nlink == 2
    assert children.pop("missing", None) is None and root.nlink == 2
    children.setdefault("c", node(6, stat.S_IFDIR))
    children.update({"d": node(7, stat.S_IFDIR)})
    assert root.nlink == 4
    del children["c"]
    assert root.nlink == 3
    # A listing replaces the entries wholesale: the count is taken from the new ones.
    root.children = {"x": node(8, stat.S_IFDIR), "y": node(9, stat.S_IFDIR), "z": node(10, stat.S_IFREG)}
    assert root.nlink == 4
    listed = root.children
    assert listed is not None
    listed.clear()
    assert root.nlink == 2
    with pytest.raises(KeyError):
        listed.pop("nothing")


def test_libfuse_version_and_passthrough_state_are_reported() -> None:
    assert re.fullmatch(r"3\.\d+\.\d+", _passthrough.libfuse_version())
    reason = _passthrough.unavailable_reason()
    # Either usable, or a sentence naming what is missing.
    assert (reason is None) == (_passthrough.LIBRARY is not None)
    assert reason is None or len(reason) > 10


def test_passthrough_is_asked_only_for_local_disk_without_writeback(tmp_path: Path) -> None:
    local = LocalFilesystem(base_path=str(tmp_path))
    cases = [
        (local, MountOptions(), _passthrough.LIBRARY),
        (local, MountOptions(passthrough=False), None),
        (local, MountOptions(writeback_cache=True), None),  # the kernel allows one of the two
        (memory_harness().fs, MountOptions(), None),  # no file on disk to pass through to
    ]
    for fs, options, expected in cases:
        ops = MountOperations(fs, options, read_only=False)
        try:
            assert ops.passthrough is expected
        finally:
            ops.close_staging()
