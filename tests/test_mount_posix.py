"""POSIX semantics through an agentvfs FUSE mount, modelled on pjdfstest.

Each test names the pjdfstest case it mirrors (github.com/pjd/pjdfstest, ``tests/<group>/<nn>.t``).
Every test runs on ``direct`` (a plain directory: the control that proves the test right) and on
each mount kind. Left out: cases about unprivileged users (EACCES, and EPERM from sticky or
immutable flags; the suite may run as root), ELOOP, ENOSPC, EFAULT, and PATH_MAX (the kernel
checks it before any filesystem sees the path).

Error tables run their operations in one mount and compare ``{operation: errno name}`` with
the expected table at once, so one failure shows every disagreeing operation.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from _mounted import KINDS, MountedRoot, open_mount, wait_until

Op = Callable[[Path], object]

NAME_255 = "n" * 255
NAME_256 = "n" * 256
# Multibyte names: NAME_MAX counts bytes, not characters.
WIDE_255 = "é" * 127 + "x"  # 254 + 1 bytes
WIDE_256 = "é" * 128  # 256 bytes


@pytest.fixture(params=KINDS)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MountedRoot]:
    with open_mount(request.param, tmp_path, request) as mounted_tree:
        yield mounted_tree


@pytest.fixture
def root(tree: MountedRoot) -> Path:
    return tree.root


#: Kinds whose storage has hard links (a plain directory, local disk).
LINKED_KINDS = ("direct", "local")


@pytest.fixture
def linked_root(tree: MountedRoot) -> Path:
    """The tree's root where storage keeps hard links; elsewhere ``link`` is EPERM
    (``test_link_is_eperm_where_storage_has_no_hard_links``)."""
    if tree.kind not in LINKED_KINDS:
        pytest.skip(f"{tree.kind} storage has no hard links: link(2) is EPERM there")
    return tree.root


# --------------------------------------------------------------------------------- helpers


def tick() -> None:
    """Let the clock move past coarse kernel timestamp granularity."""
    time.sleep(0.05)


def create(path: Path, data: bytes = b"", mode: int = 0o644) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def open_close(path: Path, flags: int, mode: int = 0o644) -> None:
    os.close(os.open(path, flags, mode))


def outcome(op: Op, root: Path) -> str:
    """``"ok"`` or the errno name the operation failed with."""
    try:
        op(root)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def check_table(root: Path, table: dict[str, tuple[Op, set[str]]]) -> None:
    """Run every operation of ``table`` and compare all outcomes at once."""
    got = {name: outcome(op, root) for name, (op, _) in table.items()}
    wrong = {
        name: f"got {got[name]}, want {'|'.join(sorted(allowed))}"
        for name, (_, allowed) in table.items()
        if got[name] not in allowed
    }
    assert not wrong, wrong


def basic_tree(root: Path) -> None:
    """``f`` (a file holding ``data``), ``d/`` holding ``g``, and the empty ``e/``."""
    create(root / "f", b"data")
    (root / "d").mkdir()
    create(root / "d" / "g", b"g")
    (root / "e").mkdir()


def with_umask(mask: int, call: Callable[[], object]) -> None:
    old = os.umask(mask)
    try:
        call()
    finally:
        os.umask(old)


# --------------------------------------------------------------------------- error tables


def test_enametoolong_256_byte_names(root: Path) -> None:
    """Mirrors pjdfstest open/02, mkdir/02, rmdir/02, unlink/02, rename/01, truncate/02,
    chmod/02, symlink/02, link/02, mkfifo/02: a 256-byte component is ENAMETOOLONG."""
    basic_tree(root)
    long = NAME_256
    table: dict[str, tuple[Op, set[str]]] = {
        "open/02 O_CREAT": (lambda r: open_close(r / long, os.O_CREAT | os.O_WRONLY), {"ENAMETOOLONG"}),
        "open/02 O_RDONLY": (lambda r: open_close(r / long, os.O_RDONLY), {"ENAMETOOLONG"}),
        "open/02 wide O_CREAT": (lambda r: open_close(r / WIDE_256, os.O_CREAT | os.O_WRONLY), {"ENAMETOOLONG"}),
        "mkdir/02": (lambda r: os.mkdir(r / long), {"ENAMETOOLONG"}),
        "mkdir/02 nested": (lambda r: os.mkdir(r / "d" / long), {"ENAMETOOLONG"}),
        "rmdir/02": (lambda r: os.rmdir(r / long), {"ENAMETOOLONG"}),
        "unlink/02": (lambda r: os.unlink(r / long), {"ENAMETOOLONG"}),
        "rename/01 from": (lambda r: os.rename(r / long, r / "x"), {"ENAMETOOLONG"}),
        "rename/01 to": (lambda r: os.rename(r / "f", r / long), {"ENAMETOOLONG"}),
        "truncate/02": (lambda r: os.truncate(r / long, 0), {"ENAMETOOLONG"}),
        "chmod/02": (lambda r: os.chmod(r / long, 0o600), {"ENAMETOOLONG"}),
        "symlink/02": (lambda r: os.symlink("f", r / long), {"ENAMETOOLONG"}),
        "link/02": (lambda r: os.link(r / "f", r / long), {"ENAMETOOLONG"}),
        "mkfifo/02": (lambda r: os.mkfifo(r / long), {"ENAMETOOLONG"}),
        "stat": (lambda r: os.stat(r / long), {"ENAMETOOLONG"}),
    }
    check_table(root, table)
    assert read(root / "f") == b"data"  # the refused rename left the source alone
    assert sorted(os.listdir(root)) == ["d", "e", "f"]


def test_enotdir_when_a_path_component_is_a_file(root: Path) -> None:
    """Mirrors pjdfstest open/01, mkdir/01, rmdir/01, unlink/01, rename/12, rename/13,
    truncate/01, chmod/01, symlink/01, link/01, mkfifo/01: ENOTDIR."""
    basic_tree(root)
    table: dict[str, tuple[Op, set[str]]] = {
        "open/01 O_CREAT": (lambda r: open_close(r / "f" / "x", os.O_CREAT | os.O_WRONLY), {"ENOTDIR"}),
        "open/01 O_RDONLY": (lambda r: open_close(r / "f" / "x", os.O_RDONLY), {"ENOTDIR"}),
        "open O_DIRECTORY on a file": (lambda r: open_close(r / "f", os.O_RDONLY | os.O_DIRECTORY), {"ENOTDIR"}),
        "mkdir/01": (lambda r: os.mkdir(r / "f" / "x"), {"ENOTDIR"}),
        "rmdir/01 component": (lambda r: os.rmdir(r / "f" / "x"), {"ENOTDIR"}),
        "rmdir/01 of a file": (lambda r: os.rmdir(r / "f"), {"ENOTDIR"}),
        "unlink/01": (lambda r: os.unlink(r / "f" / "x"), {"ENOTDIR"}),
        "rename/12 from": (lambda r: os.rename(r / "f" / "x", r / "y"), {"ENOTDIR"}),
        "rename/12 to": (lambda r: os.rename(r / "d" / "g", r / "f" / "y"), {"ENOTDIR"}),
        "rename/13 dir over file": (lambda r: os.rename(r / "e", r / "f"), {"ENOTDIR"}),
        "truncate/01": (lambda r: os.truncate(r / "f" / "x", 0), {"ENOTDIR"}),
        "chmod/01": (lambda r: os.chmod(r / "f" / "x", 0o600), {"ENOTDIR"}),
        "symlink/01": (lambda r: os.symlink("f", r / "f" / "x"), {"ENOTDIR"}),
        "link/01": (lambda r: os.link(r / "d" / "g", r / "f" / "x"), {"ENOTDIR"}),
        "mkfifo/01": (lambda r: os.mkfifo(r / "f" / "x"), {"ENOTDIR"}),
        "listdir of a file": (lambda r: os.listdir(r / "f"), {"ENOTDIR"}),
    }
    check_table(root, table)
    assert read(root / "f") == b"data"
    assert read(root / "d" / "g") == b"g"
    assert (root / "e").is_dir()


def test_enoent_for_missing_names(root: Path) -> None:
    """Mirrors pjdfstest open/04, mkdir/04, rmdir/04, unlink/04, rename/03, truncate/04,
    chmod/04, symlink/04, link/04, link/09, mkfifo/04: ENOENT."""
    basic_tree(root)
    table: dict[str, tuple[Op, set[str]]] = {
        "open/04 no O_CREAT": (lambda r: open_close(r / "missing", os.O_RDONLY), {"ENOENT"}),
        "open/04 O_CREAT, parent missing": (lambda r: open_close(r / "missing" / "x", os.O_CREAT | os.O_WRONLY), {"ENOENT"}),
        "mkdir/04": (lambda r: os.mkdir(r / "missing" / "x"), {"ENOENT"}),
        "rmdir/04": (lambda r: os.rmdir(r / "missing"), {"ENOENT"}),
        "unlink/04": (lambda r: os.unlink(r / "missing"), {"ENOENT"}),
        "unlink/04 in a dir": (lambda r: os.unlink(r / "d" / "missing"), {"ENOENT"}),
        "rename/03 from": (lambda r: os.rename(r / "missing", r / "x"), {"ENOENT"}),
        "rename/03 to, parent missing": (lambda r: os.rename(r / "f", r / "missing" / "x"), {"ENOENT"}),
        "truncate/04": (lambda r: os.truncate(r / "missing", 0), {"ENOENT"}),
        "chmod/04": (lambda r: os.chmod(r / "missing", 0o600), {"ENOENT"}),
        "utimensat": (lambda r: os.utime(r / "missing", ns=(1, 1)), {"ENOENT"}),
        "symlink/04": (lambda r: os.symlink("f", r / "missing" / "x"), {"ENOENT"}),
        "link/09 source": (lambda r: os.link(r / "missing", r / "x"), {"ENOENT"}),
        "link/04 parent": (lambda r: os.link(r / "f", r / "missing" / "x"), {"ENOENT"}),
        "mkfifo/04": (lambda r: os.mkfifo(r / "missing" / "x"), {"ENOENT"}),
        "readlink": (lambda r: os.readlink(r / "missing"), {"ENOENT"}),
        "listdir": (lambda r: os.listdir(r / "missing"), {"ENOENT"}),
    }
    check_table(root, table)
    assert read(root / "f") == b"data"
    assert sorted(os.listdir(root)) == ["d", "e", "f"]


def test_eexist_for_existing_names(root: Path) -> None:
    """Mirrors pjdfstest open/22 (O_CREAT|O_EXCL), mkdir/10, symlink/08, link/10, mkfifo/09:
    EEXIST, with the existing entry unchanged."""
    basic_tree(root)
    excl = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    table: dict[str, tuple[Op, set[str]]] = {
        "open/22 file": (lambda r: open_close(r / "f", excl), {"EEXIST"}),
        "open/22 dir": (lambda r: open_close(r / "e", excl), {"EEXIST"}),
        "open/22 O_TRUNC file": (lambda r: open_close(r / "f", excl | os.O_TRUNC), {"EEXIST"}),
        "mkdir/10 over file": (lambda r: os.mkdir(r / "f"), {"EEXIST"}),
        "mkdir/10 over dir": (lambda r: os.mkdir(r / "d"), {"EEXIST"}),
        "symlink/08 over file": (lambda r: os.symlink("x", r / "f"), {"EEXIST"}),
        "symlink/08 over dir": (lambda r: os.symlink("x", r / "e"), {"EEXIST"}),
        "link/10 over file": (lambda r: os.link(r / "d" / "g", r / "f"), {"EEXIST"}),
        "link/10 over dir": (lambda r: os.link(r / "f", r / "e"), {"EEXIST"}),
        "mkfifo/09 over file": (lambda r: os.mkfifo(r / "f"), {"EEXIST"}),
    }
    check_table(root, table)
    assert read(root / "f") == b"data"
    assert stat.S_ISREG(os.lstat(root / "f").st_mode)
    assert os.listdir(root / "e") == []


def test_eisdir_and_einval_refusals(root: Path) -> None:
    """Mirrors pjdfstest open/13 (EISDIR for a directory opened for writing), truncate/09,
    rename/14 (EISDIR), unlink/08 (EISDIR on Linux, EPERM allowed), rename/18 (EINVAL moving
    a directory into itself), rename/20 (ENOTEMPTY), rmdir/06 (ENOTEMPTY), rmdir/12 ('.' and
    '..'), truncate/13 and ftruncate/13 (EINVAL for a negative length)."""
    basic_tree(root)
    (root / "e" / "sub").mkdir()

    def read_dir_fd(r: Path) -> None:
        fd = os.open(r / "d", os.O_RDONLY)
        try:
            os.read(fd, 10)
        finally:
            os.close(fd)

    def ftruncate_negative(r: Path) -> None:
        fd = os.open(r / "f", os.O_RDWR)
        try:
            os.ftruncate(fd, -1)
        finally:
            os.close(fd)

    table: dict[str, tuple[Op, set[str]]] = {
        "open/13 O_WRONLY": (lambda r: open_close(r / "d", os.O_WRONLY), {"EISDIR"}),
        "open/13 O_RDWR": (lambda r: open_close(r / "d", os.O_RDWR), {"EISDIR"}),
        "open/13 O_CREAT|O_WRONLY": (lambda r: open_close(r / "d", os.O_CREAT | os.O_WRONLY), {"EISDIR"}),
        "open/13 O_RDONLY is fine": (lambda r: open_close(r / "d", os.O_RDONLY), {"ok"}),
        "read(2) of a directory fd": (read_dir_fd, {"EISDIR"}),
        "truncate/09": (lambda r: os.truncate(r / "d", 0), {"EISDIR"}),
        "rename/14 file over dir": (lambda r: os.rename(r / "f", r / "e"), {"EISDIR"}),
        "unlink/08": (lambda r: os.unlink(r / "d"), {"EISDIR", "EPERM"}),
        "rename/18 into itself": (lambda r: os.rename(r / "d", r / "d" / "inside"), {"EINVAL"}),
        "rename/18 into its child": (lambda r: os.rename(r / "e", r / "e" / "sub" / "x"), {"EINVAL"}),
        "rename/20 over non-empty dir": (lambda r: os.rename(r / "e", r / "d"), {"ENOTEMPTY", "EEXIST"}),
        "rmdir/06": (lambda r: os.rmdir(r / "d"), {"ENOTEMPTY", "EEXIST"}),
        "rmdir/12 '.'": (lambda r: os.rmdir(f"{r}/e/sub/."), {"EINVAL"}),
        "rmdir/12 '..'": (lambda r: os.rmdir(f"{r}/e/sub/.."), {"ENOTEMPTY", "EEXIST"}),
        "truncate/13": (lambda r: os.truncate(r / "f", -1), {"EINVAL"}),
        "ftruncate/13": (ftruncate_negative, {"EINVAL"}),
    }
    check_table(root, table)
    assert read(root / "f") == b"data"
    assert read(root / "d" / "g") == b"g"
    assert (root / "e" / "sub").is_dir()


# ---------------------------------------------------------------------------------- open


def test_open_02_names_of_255_bytes_work(root: Path) -> None:
    """Mirrors pjdfstest open/02, mkdir/02, rename/01 (the NAME_MAX side): 255 bytes is fine."""
    create(root / NAME_255, b"long")
    create(root / WIDE_255, b"wide")
    (root / "d").mkdir()
    os.mkdir(root / "d" / NAME_255)
    create(root / "d" / NAME_255 / NAME_255, b"deep")
    os.rename(root / "d" / NAME_255 / NAME_255, root / "d" / NAME_255 / ("m" * 255))
    os.symlink(NAME_255, root / ("s" * 255))
    assert read(root / NAME_255) == b"long"
    assert read(root / WIDE_255) == b"wide"
    assert read(root / ("s" * 255)) == b"long"
    assert os.listdir(root / "d" / NAME_255) == ["m" * 255]
    assert sorted(os.listdir(root)) == sorted(["d", NAME_255, WIDE_255, "s" * 255])
    os.unlink(root / NAME_255)
    assert not os.path.lexists(root / NAME_255)


def test_open_00_create_applies_mode_and_umask(root: Path) -> None:
    """Mirrors pjdfstest open/00: the created file's type and mode, under several umasks."""
    cases = [(0, 0o755, 0o755), (0, 0o151, 0o151), (0o077, 0o151, 0o100),
             (0o070, 0o345, 0o305), (0o501, 0o345, 0o244)]
    got = {}
    for index, (mask, mode, _) in enumerate(cases):
        path = root / f"f{index}"
        with_umask(mask, partial(open_close, path, os.O_CREAT | os.O_WRONLY, mode))
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode)
        got[index] = oct(stat.S_IMODE(st.st_mode))
    assert got == {index: oct(want) for index, (_, _, want) in enumerate(cases)}


def test_open_00_create_sets_times_and_updates_parent(root: Path) -> None:
    """Mirrors pjdfstest open/00: a new file's times are after the parent's old ctime, and
    the parent's mtime and ctime move."""
    (root / "d").mkdir()
    before = os.stat(root / "d")
    tick()
    open_close(root / "d" / "f", os.O_CREAT | os.O_WRONLY)
    st = os.stat(root / "d" / "f")
    after = os.stat(root / "d")
    assert st.st_atime_ns > before.st_ctime_ns
    assert st.st_mtime_ns > before.st_ctime_ns
    assert st.st_ctime_ns > before.st_ctime_ns
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns


def test_open_00_ocreat_of_existing_file_changes_nothing(root: Path) -> None:
    """Mirrors pjdfstest open/00: O_CREAT on an existing file leaves the parent's times and
    the file's content alone."""
    (root / "d").mkdir()
    create(root / "d" / "f", b"content")
    before = os.stat(root / "d")
    file_before = os.stat(root / "d" / "f")
    tick()
    open_close(root / "d" / "f", os.O_CREAT | os.O_RDONLY)
    open_close(root / "d" / "f", os.O_CREAT | os.O_WRONLY)
    after = os.stat(root / "d")
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    assert os.stat(root / "d" / "f").st_mtime_ns == file_before.st_mtime_ns
    assert read(root / "d" / "f") == b"content"


def test_open_00_otrunc_truncates_and_updates_times(root: Path) -> None:
    """Mirrors pjdfstest open/00: open(O_WRONLY|O_TRUNC) empties the file and moves its
    mtime and ctime."""
    create(root / "f", b"test\n")
    assert os.stat(root / "f").st_size == 5
    before = os.stat(root / "f")
    tick()
    open_close(root / "f", os.O_WRONLY | os.O_TRUNC)
    after = os.stat(root / "f")
    assert after.st_size == 0
    assert read(root / "f") == b""
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns


def test_open_26_mode_0000_file_is_usable_through_its_fd(root: Path) -> None:
    """Mirrors pjdfstest open/26 and ftruncate/00: a file created with mode 0000 is usable
    through the descriptor that created it."""
    fd = os.open(root / "f", os.O_CREAT | os.O_RDWR, 0)
    try:
        assert os.write(fd, b"secret") == 6
        os.ftruncate(fd, 3)
        assert os.pread(fd, 10, 0) == b"sec"
    finally:
        os.close(fd)
    st = os.stat(root / "f")
    assert stat.S_IMODE(st.st_mode) == 0
    assert st.st_size == 3


def test_open_append_never_truncates(root: Path) -> None:
    """Extends pjdfstest open/00: O_APPEND (``>>``) writes go to the end, whatever the offset,
    and never truncate; this holds across separate opens and from a shell."""
    create(root / "log", b"one\n")
    with open(root / "log", "ab") as handle:
        handle.write(b"two\n")
    fd = os.open(root / "log", os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"three\n")
    finally:
        os.close(fd)
    subprocess.run(["sh", "-c", 'echo four >> "$1"', "sh", str(root / "log")], check=True)
    fd = os.open(root / "log", os.O_RDWR | os.O_APPEND)
    try:
        os.write(fd, b"five\n")
        assert os.pread(fd, 4, 0) == b"one\n"
    finally:
        os.close(fd)
    assert read(root / "log") == b"one\ntwo\nthree\nfour\nfive\n"


# --------------------------------------------------------------------------- read, write


def test_pwrite_beyond_eof_leaves_a_hole_of_zeros(root: Path) -> None:
    """Random writes (fsx-style; no pjdfstest case): writes past EOF read back zeros between."""
    fd = os.open(root / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"tail", 10000)
        os.pwrite(fd, b"MID", 5000)
        os.pwrite(fd, b"xy", 2)
        assert os.fstat(fd).st_size == 10004
    finally:
        os.close(fd)
    want = bytearray(10004)
    want[0:4] = b"head"
    want[2:4] = b"xy"
    want[5000:5003] = b"MID"
    want[10000:10004] = b"tail"
    assert read(root / "f") == bytes(want)
    assert os.stat(root / "f").st_size == 10004


def test_two_descriptors_see_each_others_writes(root: Path) -> None:
    """Coherence of one file through two descriptors, before either is closed."""
    create(root / "f", b"0123456789")
    one = os.open(root / "f", os.O_RDWR)
    two = os.open(root / "f", os.O_RDWR)
    try:
        os.pwrite(one, b"AB", 2)
        assert os.pread(two, 10, 0) == b"01AB456789"
        os.pwrite(two, b"tail", 10)
        assert os.fstat(one).st_size == 14
        assert os.pread(one, 20, 0) == b"01AB456789tail"
        assert read(root / "f") == b"01AB456789tail"
    finally:
        os.close(one)
        os.close(two)
    assert read(root / "f") == b"01AB456789tail"


def test_large_file_round_trip(root: Path) -> None:
    """A 3 MiB file written in 64 KiB pieces reads back identical (sizes past one part)."""
    data = os.urandom(3 * 1024 * 1024 + 123)
    with open(root / "big", "wb") as handle:
        for start in range(0, len(data), 65536):
            handle.write(data[start:start + 65536])
    assert os.stat(root / "big").st_size == len(data)
    assert hashlib.sha256(read(root / "big")).hexdigest() == hashlib.sha256(data).hexdigest()
    fd = os.open(root / "big", os.O_RDONLY)
    try:
        assert os.pread(fd, 100, 2 * 1024 * 1024 - 50) == data[2 * 1024 * 1024 - 50:2 * 1024 * 1024 + 50]
    finally:
        os.close(fd)


def test_write_to_a_read_only_descriptor_is_ebadf(root: Path) -> None:
    """Mirrors pjdfstest ftruncate/00 (EINVAL for ftruncate of an O_RDONLY descriptor); write(2)
    on it is EBADF; the file is unchanged."""
    create(root / "f", b"data")
    fd = os.open(root / "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            os.write(fd, b"x")
        assert info.value.errno == errno.EBADF
        with pytest.raises(OSError) as info:
            os.ftruncate(fd, 1)
        assert info.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert read(root / "f") == b"data"


MMAP_SCRIPT = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
with mmap.mmap(fd, 8192) as mapped:
    assert mapped[:4] == b"aaaa", mapped[:4]
    mapped[4096:4100] = b"MMAP"
    mapped.flush()
os.fsync(fd)
os.close(fd)
"""


def test_fsync_fdatasync_and_mmap(root: Path) -> None:
    """fsync and fdatasync succeed; a shared writable mmap's changes reach the file.

    The mmap runs in a child process: the mount's server is a thread of this process, and
    CPython keeps the GIL through mmap page faults and msync, which would deadlock here.
    """
    create(root / "f", b"a" * 8192)
    fd = os.open(root / "f", os.O_RDWR)
    try:
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    subprocess.run([sys.executable, "-c", MMAP_SCRIPT, str(root / "f")], check=True, timeout=60)
    data = read(root / "f")
    assert data[4096:4100] == b"MMAP"
    assert data[:4096] == b"a" * 4096 and len(data) == 8192


def test_close_publishes_data_to_the_backend(tree: MountedRoot) -> None:
    """Data written is in the backend (read around the mount) once close() returns."""
    root = tree.root
    (root / "d").mkdir()
    with open(root / "d" / "f", "wb") as handle:
        handle.write(b"first")
    assert tree.backend("d/f") == b"first"
    fd = os.open(root / "d" / "f", os.O_RDWR)
    try:
        os.pwrite(fd, b"SECOND", 3)
    finally:
        os.close(fd)
    assert tree.backend("d/f") == b"firSECOND"
    # Closed with nothing written: published at the last close (the release that follows
    # close), not at the close itself, which may be a shell's close of a duplicate.
    open_close(root / "empty", os.O_CREAT | os.O_WRONLY)
    assert wait_until(lambda: tree.backend("empty") == b"")


def test_rename_and_unlink_reach_the_backend(tree: MountedRoot) -> None:
    """Renames and unlinks are in the backend once the call returns."""
    root = tree.root
    create(root / "a", b"payload")
    os.rename(root / "a", root / "b")
    assert (tree.backend("a"), tree.backend("b")) == (None, b"payload")
    os.unlink(root / "b")
    assert tree.backend("b") is None


# ------------------------------------------------------------------------- mkdir, rmdir


def test_mkdir_00_creates_directories_with_mode(root: Path) -> None:
    """Mirrors pjdfstest mkdir/00: type and mode under several umasks; an empty listing."""
    cases = [(0, 0o755, 0o755), (0, 0o151, 0o151), (0o077, 0o151, 0o100),
             (0o070, 0o345, 0o305), (0o501, 0o345, 0o244)]
    got = {}
    for index, (mask, mode, _) in enumerate(cases):
        path = root / f"d{index}"
        with_umask(mask, partial(os.mkdir, path, mode))
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode)
        got[index] = oct(stat.S_IMODE(st.st_mode))
    assert got == {index: oct(want) for index, (_, _, want) in enumerate(cases)}
    os.chmod(root / "d0", 0o755)
    assert os.listdir(root / "d0") == []


def test_mkdir_00_new_directory_times(root: Path) -> None:
    """Mirrors pjdfstest mkdir/00: the new directory's times are after the parent's old
    ctime; the parent's mtime and ctime move."""
    before = os.stat(root)
    tick()
    os.mkdir(root / "d")
    st = os.stat(root / "d")
    after = os.stat(root)
    assert min(st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns) > before.st_ctime_ns
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns


def test_rmdir_00_removes_directories(root: Path) -> None:
    """Mirrors pjdfstest rmdir/00: the directory is gone; the parent's mtime and ctime move."""
    os.makedirs(root / "p" / "d")
    before = os.stat(root / "p")
    tick()
    os.rmdir(root / "p" / "d")
    after = os.stat(root / "p")
    assert not os.path.lexists(root / "p" / "d")
    assert os.listdir(root / "p") == []
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns
    os.mkdir(root / "p" / "d")  # the name is free again
    assert os.listdir(root / "p") == ["d"]


def test_directory_with_many_entries_lists_them_all(root: Path) -> None:
    """readdir returns every entry once, with the right types (no pjdfstest case)."""
    (root / "d").mkdir()
    names = {f"file-{index:03d}" for index in range(120)}
    for name in names:
        open_close(root / "d" / name, os.O_CREAT | os.O_WRONLY)
    os.mkdir(root / "d" / "sub")
    os.symlink("file-000", root / "d" / "link")
    listed = os.listdir(root / "d")
    assert len(listed) == len(set(listed))
    assert set(listed) == names | {"sub", "link"}
    kinds = {entry.name: (entry.is_dir(follow_symlinks=False), entry.is_symlink())
             for entry in os.scandir(root / "d")}
    assert kinds["sub"] == (True, False)
    assert kinds["link"] == (False, True)
    assert kinds["file-000"] == (False, False)


# ---------------------------------------------------------------------------------- unlink


def test_unlink_00_removes_files_symlinks_and_fifos(root: Path) -> None:
    """Mirrors pjdfstest unlink/00: regular files, symlinks and fifos go away, and the
    parent's mtime and ctime move each time."""
    (root / "d").mkdir()
    create(root / "d" / "file", b"x")
    os.symlink("file", root / "d" / "link")
    os.mkfifo(root / "d" / "fifo")
    for name in ("link", "file", "fifo"):
        before = os.stat(root / "d")
        tick()
        os.unlink(root / "d" / name)
        after = os.stat(root / "d")
        assert not os.path.lexists(root / "d" / name), name
        assert after.st_mtime_ns > before.st_mtime_ns, name
        assert after.st_ctime_ns > before.st_ctime_ns, name
    assert os.listdir(root / "d") == []


def test_unlink_14_open_file_stays_readable_and_writable(root: Path) -> None:
    """Mirrors pjdfstest unlink/14: an open file is not freed by unlink; the descriptor
    still reads and writes, fstat shows nlink 0, and the name can be reused independently."""
    create(root / "f", b"Hello, World!")
    reader = os.open(root / "f", os.O_RDONLY)
    writer = os.open(root / "f", os.O_RDWR)
    try:
        os.unlink(root / "f")
        assert not os.path.lexists(root / "f")
        assert os.fstat(reader).st_nlink == 0
        assert os.read(reader, 100) == b"Hello, World!"
        os.pwrite(writer, b"_", 6)
        os.pwrite(writer, b"!!", 13)
        assert os.pread(writer, 100, 0) == b"Hello,_World!!!"
        assert os.pread(reader, 100, 0) == b"Hello,_World!!!"
        assert os.fstat(writer).st_size == 15
        create(root / "f", b"new")
        assert read(root / "f") == b"new"
        assert os.pread(reader, 100, 0) == b"Hello,_World!!!"
    finally:
        os.close(reader)
        os.close(writer)
    assert read(root / "f") == b"new"
    assert os.listdir(root) == ["f"]


# --------------------------------------------------------------------------------- rename


def test_rename_00_file_keeps_inode_mode_and_content(root: Path) -> None:
    """Mirrors pjdfstest rename/00: the renamed file keeps its inode, mode and nlink; the old
    name is ENOENT."""
    create(root / "a", b"content", 0o644)
    os.chmod(root / "a", 0o640)
    inode = os.lstat(root / "a").st_ino
    os.rename(root / "a", root / "b")
    with pytest.raises(FileNotFoundError):
        os.lstat(root / "a")
    st = os.lstat(root / "b")
    assert (st.st_ino, stat.S_IMODE(st.st_mode), st.st_nlink) == (inode, 0o640, 1)
    assert read(root / "b") == b"content"


def test_rename_00_directory_moves_its_tree(root: Path) -> None:
    """Mirrors pjdfstest rename/00 for directories: the whole tree moves with its content."""
    (root / "a" / "sub" / "deeper").mkdir(parents=True)
    files = {f"a/f{index}": os.urandom(64) for index in range(20)}
    files["a/sub/x"] = b"x"
    files["a/sub/deeper/y"] = b"y"
    for name, data in files.items():
        create(root / name, data)
    inode = os.lstat(root / "a").st_ino
    (root / "dest").mkdir()
    os.rename(root / "a", root / "dest" / "b")
    assert not os.path.lexists(root / "a")
    assert os.lstat(root / "dest" / "b").st_ino == inode
    for name, data in files.items():
        assert read(root / "dest" / "b" / name[2:]) == data, name
    assert sorted(os.listdir(root)) == ["dest"]
    assert os.listdir(root / "dest" / "b" / "sub" / "deeper") == ["y"]


def test_rename_00_symlink_keeps_its_target(root: Path) -> None:
    """Mirrors pjdfstest rename/00 for symlinks."""
    create(root / "target", b"t")
    os.symlink("target", root / "l1")
    os.rename(root / "l1", root / "l2")
    assert os.readlink(root / "l2") == "target"
    assert read(root / "l2") == b"t"
    assert not os.path.lexists(root / "l1")


def test_rename_over_an_existing_file_replaces_it(root: Path) -> None:
    """Mirrors pjdfstest rename/00 and rename/23: the destination is replaced atomically;
    an open descriptor on the replaced file still reads the old content."""
    create(root / "src", b"new content")
    create(root / "dst", b"old content, longer")
    old = os.open(root / "dst", os.O_RDONLY)
    try:
        os.rename(root / "src", root / "dst")
        assert not os.path.lexists(root / "src")
        assert read(root / "dst") == b"new content"
        assert os.stat(root / "dst").st_size == len(b"new content")
        assert os.pread(old, 100, 0) == b"old content, longer"
    finally:
        os.close(old)
    assert sorted(os.listdir(root)) == ["dst"]


def test_rename_23_onto_another_link_of_the_same_file(linked_root: Path) -> None:
    """Mirrors pjdfstest rename/23: renaming onto a multiply-linked file works, and renaming a
    link onto another link of the same file is a no-op."""
    root = linked_root
    create(root / "a", b"a")
    os.link(root / "a", root / "b")
    create(root / "c", b"c")
    os.rename(root / "c", root / "b")
    assert read(root / "b") == b"c"
    assert os.stat(root / "a").st_nlink == 1
    os.link(root / "a", root / "a2")
    os.rename(root / "a", root / "a2")
    assert os.path.exists(root / "a") and os.path.exists(root / "a2")
    assert os.stat(root / "a").st_nlink == 2


def test_rename_directory_over_an_empty_directory(root: Path) -> None:
    """Mirrors pjdfstest rename/20 (the allowed case): a directory replaces an empty one."""
    (root / "src").mkdir()
    create(root / "src" / "f", b"f")
    (root / "dst").mkdir()
    os.rename(root / "src", root / "dst")
    assert not os.path.lexists(root / "src")
    assert read(root / "dst" / "f") == b"f"


def test_rename_of_an_open_file_keeps_its_descriptor(root: Path) -> None:
    """A descriptor opened before a rename writes to the file under its new name."""
    create(root / "a", b"12345")
    fd = os.open(root / "a", os.O_RDWR)
    try:
        os.rename(root / "a", root / "b")
        os.pwrite(fd, b"XY", 5)
        assert read(root / "b") == b"12345XY"
    finally:
        os.close(fd)
    assert read(root / "b") == b"12345XY"
    assert not os.path.lexists(root / "a")


def test_rename_22_changes_ctime_and_parent_times(root: Path) -> None:
    """Mirrors pjdfstest rename/22 (the file's ctime moves) and rename/00 (both parents'
    mtime and ctime move)."""
    (root / "from").mkdir()
    (root / "to").mkdir()
    create(root / "from" / "f", b"x")
    file_before = os.lstat(root / "from" / "f")
    src_before, dst_before = os.stat(root / "from"), os.stat(root / "to")
    tick()
    os.rename(root / "from" / "f", root / "to" / "f")
    file_after = os.lstat(root / "to" / "f")
    src_after, dst_after = os.stat(root / "from"), os.stat(root / "to")
    assert file_after.st_ctime_ns > file_before.st_ctime_ns
    assert file_after.st_mtime_ns == file_before.st_mtime_ns
    assert src_after.st_mtime_ns > src_before.st_mtime_ns
    assert src_after.st_ctime_ns > src_before.st_ctime_ns
    assert dst_after.st_mtime_ns > dst_before.st_mtime_ns
    assert dst_after.st_ctime_ns > dst_before.st_ctime_ns


def test_rename_24_moved_directory_dotdot(root: Path) -> None:
    """Mirrors pjdfstest rename/24: after the move, ``..`` of the directory is its new parent."""
    (root / "p1" / "d").mkdir(parents=True)
    (root / "p2").mkdir()
    assert os.lstat(root / "p1" / "d" / "..").st_ino == os.lstat(root / "p1").st_ino
    os.rename(root / "p1" / "d", root / "p2" / "e")
    assert os.lstat(root / "p2" / "e" / "..").st_ino == os.lstat(root / "p2").st_ino
    create(root / "p2" / "e" / ".." / "via-dotdot", b"v")
    assert read(root / "p2" / "via-dotdot") == b"v"


# ------------------------------------------------------------------------ truncate, ftruncate


def test_truncate_00_decrease_and_increase(root: Path) -> None:
    """Mirrors pjdfstest truncate/00: sizes follow truncate(2), extended parts read as zeros
    and ctime moves."""
    create(root / "f")
    os.truncate(root / "f", 1234567)
    assert os.lstat(root / "f").st_size == 1234567
    os.truncate(root / "f", 567)
    assert os.lstat(root / "f").st_size == 567
    assert read(root / "f") == bytes(567)
    data = os.urandom(12345)
    create(root / "g", data)
    os.truncate(root / "g", 23456)
    assert os.lstat(root / "g").st_size == 23456
    assert read(root / "g") == data + bytes(23456 - 12345)
    os.truncate(root / "g", 1)
    assert read(root / "g") == data[:1]
    before = os.stat(root / "g")
    tick()
    os.truncate(root / "g", 123)
    after = os.stat(root / "g")
    assert after.st_ctime_ns > before.st_ctime_ns
    assert after.st_mtime_ns > before.st_mtime_ns


def test_truncate_down_then_up_reads_zeros_not_old_data(root: Path) -> None:
    """Mirrors pjdfstest truncate/00: bytes cut by a truncate come back as zeros, not as the
    old content, when the file grows again."""
    create(root / "f", b"A" * 100)
    os.truncate(root / "f", 10)
    os.truncate(root / "f", 50)
    assert read(root / "f") == b"A" * 10 + bytes(40)


def test_ftruncate_00_decrease_and_increase(root: Path) -> None:
    """Mirrors pjdfstest ftruncate/00: through O_RDWR and O_WRONLY descriptors, with content
    checks and writes around the new end."""
    data = os.urandom(12345)
    create(root / "f", data)
    fd = os.open(root / "f", os.O_RDWR)
    try:
        os.ftruncate(fd, 23456)
        assert os.fstat(fd).st_size == 23456
        assert os.pread(fd, 30000, 0) == data + bytes(23456 - 12345)
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"end", 200)
        assert os.pread(fd, 300, 0) == data[:100] + bytes(100) + b"end"
    finally:
        os.close(fd)
    assert read(root / "f") == data[:100] + bytes(100) + b"end"
    fd = os.open(root / "f", os.O_WRONLY)
    try:
        os.ftruncate(fd, 1)
    finally:
        os.close(fd)
    assert os.lstat(root / "f").st_size == 1
    assert read(root / "f") == data[:1]
    before = os.stat(root / "f")
    tick()
    fd = os.open(root / "f", os.O_RDWR)
    try:
        os.ftruncate(fd, 123)
    finally:
        os.close(fd)
    assert os.stat(root / "f").st_ctime_ns > before.st_ctime_ns


# ---------------------------------------------------------------------------- chmod, chown


def test_chmod_00_changes_mode(root: Path) -> None:
    """Mirrors pjdfstest chmod/00: mode of files, directories and fifos; chmod through a
    symlink changes the target, not the link; ctime moves."""
    create(root / "file")
    (root / "dir").mkdir()
    os.mkfifo(root / "fifo")
    for name in ("file", "dir", "fifo"):
        os.chmod(root / name, 0o111)
        assert stat.S_IMODE(os.stat(root / name).st_mode) == 0o111, name
        os.symlink(name, root / "link")
        link_mode = os.lstat(root / "link").st_mode
        os.chmod(root / "link", 0o222)
        assert stat.S_IMODE(os.stat(root / "link").st_mode) == 0o222, name
        assert stat.S_IMODE(os.stat(root / name).st_mode) == 0o222, name
        assert os.lstat(root / "link").st_mode == link_mode, name
        os.unlink(root / "link")
        before = os.stat(root / name)
        tick()
        os.chmod(root / name, 0o700)
        assert os.stat(root / name).st_ctime_ns > before.st_ctime_ns, name


def test_chmod_12_special_bits_and_mode_survive_writes(root: Path) -> None:
    """Mirrors pjdfstest chmod/12 (setuid, setgid and sticky bits are kept as set) and checks
    that a mode survives writing and closing the file."""
    create(root / "f", b"x")
    os.chmod(root / "f", 0o6755)
    assert stat.S_IMODE(os.stat(root / "f").st_mode) == 0o6755
    (root / "d").mkdir()
    os.chmod(root / "d", 0o1777)
    assert stat.S_IMODE(os.stat(root / "d").st_mode) == 0o1777
    create(root / "g", b"one")
    os.chmod(root / "g", 0o600)
    with open(root / "g", "ab") as handle:
        handle.write(b"two")
    assert stat.S_IMODE(os.stat(root / "g").st_mode) == 0o600
    assert read(root / "g") == b"onetwo"
    assert stat.S_IMODE(os.stat(root / "g").st_mode) == 0o600


def test_chown_00_changes_owner(root: Path) -> None:
    """Mirrors pjdfstest chown/00: uid and gid as set (root only); -1 leaves one alone."""
    if os.geteuid() != 0:
        pytest.skip("chown to other users needs root")
    create(root / "f", b"x")
    (root / "d").mkdir()
    for name in ("f", "d"):
        os.chown(root / name, 65534, 65533)
        st = os.lstat(root / name)
        assert (st.st_uid, st.st_gid) == (65534, 65533), name
        os.chown(root / name, -1, 65532)
        st = os.lstat(root / name)
        assert (st.st_uid, st.st_gid) == (65534, 65532), name
    with open(root / "f", "ab") as handle:
        handle.write(b"y")
    st = os.lstat(root / "f")
    assert (st.st_uid, st.st_gid) == (65534, 65532)


# ------------------------------------------------------------------------------ utimensat


def test_utimensat_00_sets_times_on_files_and_dirs(root: Path) -> None:
    """Mirrors pjdfstest utimensat/00, utimensat/04 (mtime before atime) and utimensat/05
    (following a symlink)."""
    create(root / "f", b"x")
    (root / "d").mkdir()
    os.symlink("f", root / "l")
    for name in ("f", "d"):
        os.utime(root / name, ns=(1_900_000_000_000_000_000, 1_000_000_000_000_000_000))
        st = os.stat(root / name)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_900_000_000_000_000_000, 1_000_000_000_000_000_000), name
    os.utime(root / "l", ns=(1_500_000_000_000_000_000, 1_600_000_000_000_000_000))
    st = os.stat(root / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_500_000_000_000_000_000, 1_600_000_000_000_000_000)


def test_utimensat_01_now(root: Path) -> None:
    """Mirrors pjdfstest utimensat/01: UTIME_NOW (os.utime without times) sets the present."""
    create(root / "f", b"x")
    os.utime(root / "f", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    start = time.time_ns()
    os.utime(root / "f")
    end = time.time_ns()
    st = os.stat(root / "f")
    for value in (st.st_atime_ns, st.st_mtime_ns):
        assert start - 50_000_000 <= value <= end + 50_000_000


def test_utimensat_08_subsecond_precision(root: Path) -> None:
    """Mirrors pjdfstest utimensat/08: nanoseconds are kept exactly."""
    create(root / "f", b"x")
    os.utime(root / "f", ns=(1_700_000_000_123_456_789, 1_700_000_001_987_654_321))
    st = os.stat(root / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_700_000_000_123_456_789, 1_700_000_001_987_654_321)


def test_utimensat_09_y2038(root: Path) -> None:
    """Mirrors pjdfstest utimensat/09: times past 2^31 and 2^32 seconds."""
    create(root / "f", b"x")
    os.utime(root / "f", (2**31, 2**32))
    st = os.stat(root / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (2**31 * 10**9, 2**32 * 10**9)


def test_utimensat_futimens_before_close_is_kept(root: Path) -> None:
    """Mirrors pjdfstest utimensat/00 through a descriptor, as ``cp -p``, tar and rsync do:
    times set on a written file before close() are still there after close() and reopens."""
    fd = os.open(root / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"payload")
        os.utime(fd, ns=(1_111_111_111_000_000_001, 1_222_222_222_000_000_002))
    finally:
        os.close(fd)
    st = os.stat(root / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_111_111_111_000_000_001, 1_222_222_222_000_000_002)
    assert read(root / "f") == b"payload"
    open_close(root / "f", os.O_RDWR)
    assert os.stat(root / "f").st_mtime_ns == 1_222_222_222_000_000_002


def test_write_updates_mtime_and_ctime(root: Path) -> None:
    """Mirrors pjdfstest's expectation (open/00, truncate/00) that modifying data moves mtime
    and ctime; also after times were set explicitly."""
    create(root / "f", b"x")
    os.utime(root / "f", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = os.stat(root / "f")
    tick()
    with open(root / "f", "ab") as handle:
        handle.write(b"y")
    after = os.stat(root / "f")
    assert after.st_mtime_ns > time.time_ns() - 60 * 10**9
    assert after.st_ctime_ns > before.st_ctime_ns


def test_copy2_preserves_mode_and_times(root: Path) -> None:
    """shutil.copy2 (copy, chmod, utime, xattr copy tolerating ENOTSUP) within the mount."""
    create(root / "src", os.urandom(5000))
    os.chmod(root / "src", 0o751)
    os.utime(root / "src", ns=(1_300_000_000_000_000_000, 1_400_000_000_000_000_000))
    shutil.copy2(root / "src", root / "dst")
    st = os.stat(root / "dst")
    assert stat.S_IMODE(st.st_mode) == 0o751
    assert st.st_mtime_ns == 1_400_000_000_000_000_000
    assert read(root / "dst") == read(root / "src")


# --------------------------------------------------------------------------- symlink, link


def test_symlink_00_creates_symbolic_links(root: Path) -> None:
    """Mirrors pjdfstest symlink/00: lstat shows a link, stat and open follow it, dangling
    links exist for lstat only, and the parent's mtime and ctime move."""
    create(root / "f", b"target data")
    (root / "d").mkdir()
    create(root / "d" / "inner", b"i")
    before = os.stat(root)
    tick()
    os.symlink("f", root / "lf")
    after = os.stat(root)
    os.symlink("d", root / "ld")
    os.symlink("nowhere", root / "dangling")
    assert stat.S_ISLNK(os.lstat(root / "lf").st_mode)
    assert os.readlink(root / "lf") == "f"
    assert os.stat(root / "lf").st_ino == os.stat(root / "f").st_ino
    assert read(root / "lf") == b"target data"
    assert os.listdir(root / "ld") == ["inner"]
    assert stat.S_ISLNK(os.lstat(root / "dangling").st_mode)
    with pytest.raises(FileNotFoundError):
        os.stat(root / "dangling")
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns
    with open(root / "lf", "ab") as handle:
        handle.write(b"!")
    assert read(root / "f") == b"target data!"


def test_link_00_creates_hard_links(linked_root: Path) -> None:
    """Mirrors pjdfstest link/00: link counts, shared inode, mode and owner; writes through
    one name show through the other; the file's ctime moves; unlink drops the count."""
    root = linked_root
    create(root / "n0", b"shared")
    ctime = os.stat(root / "n0").st_ctime_ns
    tick()
    os.link(root / "n0", root / "n1")
    os.link(root / "n1", root / "n2")
    assert os.stat(root / "n0").st_ctime_ns > ctime
    assert [os.lstat(root / name).st_nlink for name in ("n0", "n1", "n2")] == [3, 3, 3]
    assert len({os.lstat(root / name).st_ino for name in ("n0", "n1", "n2")}) == 1
    os.chmod(root / "n1", 0o201)
    assert stat.S_IMODE(os.lstat(root / "n2").st_mode) == 0o201
    with open(root / "n2", "ab") as handle:
        handle.write(b" data")
    assert read(root / "n0") == b"shared data"
    os.unlink(root / "n0")
    assert [os.lstat(root / name).st_nlink for name in ("n1", "n2")] == [2, 2]
    os.unlink(root / "n2")
    assert os.lstat(root / "n1").st_nlink == 1
    assert read(root / "n1") == b"shared data"


def test_link_is_eperm_where_storage_has_no_hard_links(tree: MountedRoot) -> None:
    """Object stores and memory keep no hard links: a link would be two copies that drift
    apart after a remount, so link(2) fails with EPERM (as on s3fs-fuse) and nothing is made."""
    if tree.kind in LINKED_KINDS:
        pytest.skip(f"{tree.kind} storage has hard links (test_link_00_creates_hard_links)")
    root = tree.root
    create(root / "f", b"data")
    with pytest.raises(OSError) as info:
        os.link(root / "f", root / "g")
    assert info.value.errno == errno.EPERM
    assert not os.path.lexists(root / "g")
    assert tree.backend("g") is None
    assert read(root / "f") == b"data"


def test_link_11_directory_is_eperm(root: Path) -> None:
    """Mirrors pjdfstest link/11: hard links to directories are EPERM."""
    (root / "d").mkdir()
    with pytest.raises(OSError) as info:
        os.link(root / "d", root / "d2")
    assert info.value.errno == errno.EPERM
    assert not os.path.lexists(root / "d2")


# ---------------------------------------------------------------------------- mkfifo, mknod


def test_mkfifo_00_creates_working_fifos(root: Path) -> None:
    """Mirrors pjdfstest mkfifo/00: type and mode of the fifo, parent times move, and data
    passes through it."""
    before = os.stat(root)
    tick()
    with_umask(0, lambda: os.mkfifo(root / "fifo", 0o640))
    after = os.stat(root)
    st = os.lstat(root / "fifo")
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns > before.st_ctime_ns
    reader = os.open(root / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer = os.open(root / "fifo", os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(writer, b"through the pipe")
        finally:
            os.close(writer)
        assert os.read(reader, 100) == b"through the pipe"
    finally:
        os.close(reader)


def test_mknod_regular_file(root: Path) -> None:
    """Mirrors pjdfstest mknod/00 for S_IFREG: mknod makes an empty, usable regular file."""
    with_umask(0, lambda: os.mknod(root / "f", stat.S_IFREG | 0o640))
    st = os.lstat(root / "f")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 and st.st_size == 0
    with open(root / "f", "ab") as handle:
        handle.write(b"ok")
    assert read(root / "f") == b"ok"


# ------------------------------------------------------------------------ statvfs, xattrs


def test_statvfs(root: Path) -> None:
    """statvfs and fstatvfs answer, with NAME_MAX 255."""
    create(root / "f", b"x")
    info = os.statvfs(root)
    assert info.f_bsize > 0 and info.f_frsize > 0
    assert info.f_namemax == 255
    assert info.f_blocks >= info.f_bfree >= info.f_bavail >= 0
    fd = os.open(root / "f", os.O_RDONLY)
    try:
        assert os.fstatvfs(fd).f_namemax == 255
    finally:
        os.close(fd)


def test_xattrs_are_refused_with_enotsup(tree: MountedRoot) -> None:
    """Extended attributes: setxattr on a mount is ENOTSUP (a plain directory may allow it)."""
    create(tree.root / "f", b"x")
    if tree.kind == "direct":
        try:
            os.setxattr(tree.root / "f", "user.test", b"value")
        except OSError as exc:
            if exc.errno not in {errno.ENOTSUP, errno.EOPNOTSUPP}:
                raise
        return
    with pytest.raises(OSError) as info:
        os.setxattr(tree.root / "f", "user.test", b"value")
    assert info.value.errno in {errno.ENOTSUP, errno.EOPNOTSUPP}
    with pytest.raises(OSError) as info:
        os.getxattr(tree.root / "f", "user.test")
    assert info.value.errno in {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA}
    assert read(tree.root / "f") == b"x"


# -------------------------------------------------------------------------------- read-only


@pytest.mark.parametrize("kind", KINDS)
def test_read_only_mount_refuses_every_write_with_erofs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Mirrors pjdfstest open/14, open/15, mkdir/09, rmdir/14, unlink/12, rename/16,
    truncate/10, ftruncate/10, chmod/09, symlink/10, link/16, mkfifo/08: EROFS."""
    files = {"f": b"data", "d/g": b"g"}
    with open_mount(kind, tmp_path, request, read_only=True, files=files, dirs=["e"]) as tree:
        table: dict[str, tuple[Op, set[str]]] = {
            "open/14 O_WRONLY": (lambda r: open_close(r / "f", os.O_WRONLY), {"EROFS"}),
            "open/14 O_RDWR": (lambda r: open_close(r / "f", os.O_RDWR), {"EROFS"}),
            "open/14 O_TRUNC": (lambda r: open_close(r / "f", os.O_RDONLY | os.O_TRUNC), {"EROFS"}),
            "open/15 O_CREAT": (lambda r: open_close(r / "new", os.O_CREAT | os.O_WRONLY), {"EROFS"}),
            "mkdir/09": (lambda r: os.mkdir(r / "new"), {"EROFS"}),
            "rmdir/14": (lambda r: os.rmdir(r / "e"), {"EROFS"}),
            "unlink/12": (lambda r: os.unlink(r / "f"), {"EROFS"}),
            "rename/16": (lambda r: os.rename(r / "f", r / "moved"), {"EROFS"}),
            "rename/16 over file": (lambda r: os.rename(r / "f", r / "d" / "g"), {"EROFS"}),
            "truncate/10": (lambda r: os.truncate(r / "f", 1), {"EROFS"}),
            "chmod/09": (lambda r: os.chmod(r / "f", 0o600), {"EROFS"}),
            "chown": (lambda r: os.chown(r / "f", os.geteuid(), os.getegid()), {"EROFS"}),
            "utimensat": (lambda r: os.utime(r / "f", ns=(1, 1)), {"EROFS"}),
            "symlink/10": (lambda r: os.symlink("f", r / "link"), {"EROFS"}),
            "link/16": (lambda r: os.link(r / "f", r / "hard"), {"EROFS"}),
            "mkfifo/08": (lambda r: os.mkfifo(r / "fifo"), {"EROFS"}),
        }
        check_table(tree.root, table)
        assert read(tree.root / "f") == b"data"
        assert read(tree.root / "d" / "g") == b"g"
        assert sorted(os.listdir(tree.root)) == ["d", "e", "f"]
        assert os.statvfs(tree.root).f_flag & os.ST_RDONLY


@pytest.mark.parametrize("kind", ["fifo", "socket", "char"])
def test_link_00_a_special_file_made_here_keeps_its_inode_past_a_relisting(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Mirrors pjdfstest link/00 (the ctime loop, which sleeps before ``link``): a special
    file made through the mount is the same file once the kernel's entry has expired and the
    directory is listed again, so ``link``, ``rename`` and ``unlink`` of it work."""
    if kind == "char" and os.geteuid() != 0:
        pytest.skip("mknod of a device node needs root")
    with open_mount("local", tmp_path, request, options={"metadata_ttl": 0.05}) as tree:
        root = tree.root
        (root / "d").mkdir()
        made = root / "d" / "n0"
        if kind == "fifo":
            os.mkfifo(made, 0o644)
        elif kind == "socket":
            import socket

            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(os.fspath(made))
        else:
            os.mknod(made, 0o644 | stat.S_IFCHR, os.makedev(1, 2))
        before = os.lstat(made).st_ino
        time.sleep(0.2)  # past the entry and attribute timeouts: the next lookup lists again
        os.listdir(root / "d")
        os.link(made, root / "d" / "n1")
        assert os.lstat(made).st_ino == before
        assert os.lstat(made).st_nlink == os.lstat(root / "d" / "n1").st_nlink == 2
        time.sleep(0.2)
        os.rename(root / "d" / "n1", root / "d" / "n2")
        os.unlink(made)
        assert os.lstat(root / "d" / "n2").st_nlink == 1
        os.unlink(root / "d" / "n2")
        assert os.listdir(root / "d") == []
