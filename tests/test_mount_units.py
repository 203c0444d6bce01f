"""Pieces of the mount layer that need no FUSE: options and the read-ahead layout."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentvfs import LocalFilesystem
from agentvfs.errors import WorkspaceError
from agentvfs.mounts import MountOptions, _helper
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
    version = _helper.libfuse_version()
    assert re.fullmatch(r"3\.\d+\.\d+", version)
    reason = _helper.passthrough_unavailable_reason()
    # Either usable, or a sentence naming what is missing.
    assert reason is None or len(reason) > 10
    if reason is None:
        assert _helper.HELPER is not None and _helper.HELPER.supports_passthrough
    if int(version.split(".")[1]) < 17:
        assert reason is not None and "older than 3.17" in reason


def test_the_helper_library_is_built_for_the_libfuse_pyfuse3_links() -> None:
    """Wherever the ``fuse`` extra installed (pyfuse3 compiles against libfuse3), the helper
    library builds: kept beside the package, for pyfuse3's very libfuse."""
    assert _helper.unavailable_reason() is None
    helper = _helper.HELPER
    assert helper is not None
    built = Path(helper.path)
    if os.access(_helper._BUILT.parent, os.W_OK):
        assert built.parent == _helper._BUILT and _helper._trusted(built)
    elif built.parent == _helper._BUILT:  # built by the installation's owner: used as it is
        assert _helper._trusted(built)
    else:  # a user who may not write the installation: built for the process alone
        assert not built.exists()
    minor = int(_helper.libfuse_version().split(".")[1])
    assert helper.supports_passthrough == (minor >= 17)


#: Loads a copy of ``_helper.py`` (argv[1]) on its own, as agentvfs.mounts does at import.
_STANDALONE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("helper_copy", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
helper = module.HELPER
print(json.dumps({"path": helper.path if helper else None, "reason": module.unavailable_reason(),
                  "exists": bool(helper) and __import__("os").path.exists(helper.path)}))
"""


def _load_copy(where: Path, env: dict[str, str] | None = None, *, fresh: bool = True) -> dict[str, object]:
    """Load a copy of the helper module placed in ``where`` (``fresh``: copied there now)
    in a new interpreter."""
    where.mkdir(exist_ok=True)
    for name in ("_helper.py", "_helper.c") if fresh else ():
        shutil.copy(Path(_helper.__file__).with_name(name), where / name)
    done = subprocess.run(
        [sys.executable, "-c", _STANDALONE, os.fspath(where / "_helper.py")],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_helper_library_is_kept_beside_the_module_and_reused(tmp_path: Path) -> None:
    first = _load_copy(tmp_path / "pkg")
    assert first["reason"] is None and Path(str(first["path"])).parent == tmp_path / "pkg" / "_built"
    built = Path(str(first["path"]))
    stamp = built.stat().st_mtime_ns
    second = _load_copy(tmp_path / "pkg")
    assert second["path"] == first["path"] and built.stat().st_mtime_ns == stamp  # not built again
    # A new source is a new build (the name holds a hash of it).
    (tmp_path / "pkg" / "_helper.c").write_text((tmp_path / "pkg" / "_helper.c").read_text() + "\n/* changed */\n")
    third = _load_copy(tmp_path / "pkg", fresh=False)
    assert third["reason"] is None and third["path"] != first["path"]


def test_a_helper_library_others_could_replace_is_never_loaded(tmp_path: Path) -> None:
    """A directory others may write (here group-writable) could have its library swapped:
    the module builds one for this process alone, in a private directory gone once loaded."""
    where = tmp_path / "shared"
    where.mkdir()
    where.chmod(0o775)
    got = _load_copy(where)
    assert got["reason"] is None and got["path"] is not None
    assert not Path(str(got["path"])).is_relative_to(where) and not got["exists"]
    assert not list(where.rglob("*.so"))


def test_without_a_compiler_the_helper_says_what_to_install(tmp_path: Path) -> None:
    got = _load_copy(tmp_path / "pkg", env={"PATH": os.fspath(tmp_path / "empty"), "CC": ""})
    assert got["path"] is None
    assert "no C compiler was found" in str(got["reason"]) and "gcc" in str(got["reason"])


def test_without_matching_headers_the_helper_names_the_package() -> None:
    with pytest.raises(_helper.HelperUnavailable, match=r"headers of libfuse 3\.99 .*libfuse3-dev"):
        _helper._headers("/nonexistent/lib/libfuse3.so.3", 99)


def test_passthrough_is_asked_only_for_local_disk_without_writeback(tmp_path: Path) -> None:
    local = LocalFilesystem(base_path=str(tmp_path))
    cases = [
        (local, MountOptions(), _helper.HELPER if _helper.passthrough_unavailable_reason() is None else None),
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
