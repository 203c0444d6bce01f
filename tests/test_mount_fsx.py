"""fsx-style random I/O through the mount, checked against an in-memory model after every step.

Like fsx (the file-system exerciser of BSD and xfstests), the core is one file driven through
a long-lived descriptor: open (with or without O_TRUNC), pread, pwrite (also past EOF, leaving
holes of zeros), truncate and ftruncate up and down, close and reopen. A few rules touch other
names (write, append, rename over, unlink, mkdir, rmdir, readdir), so the descriptor may end up
on a file that was renamed away, replaced or unlinked. The model keeps inodes (content) apart
from names, as POSIX does. After each step every name's size and content, the listings and the
open descriptor's size are compared with the model.

``direct`` (a plain directory) runs the same machine as a control. ``local`` opens files in
place where FUSE passthrough is available; ``staged`` is the same directory with passthrough
off, so every write goes through a staged copy and its publish (the path of every machine
without passthrough).
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from _mounted import mounted

MAIN = "f"
FILES = ["f", "a", "d1/f", "d1/a", "d2/b"]
DIRS = ["d1", "d2"]
MAX_OFFSET = 300_000  # crosses 4 KiB pages, 64 KiB and 128 KiB FUSE requests, 256 KiB chunks

FSX = settings(max_examples=40, stateful_step_count=30, deadline=None, database=None)
FSX_S3 = settings(
    max_examples=8,
    stateful_step_count=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def payload(seed: int, length: int) -> bytes:
    return random.Random(seed).randbytes(length)


class Rig:
    """The real tree under ``work`` and its model; every operation checks its own result."""

    def __init__(self, work: Path) -> None:
        work.mkdir()
        self.work = work
        self.inodes: dict[int, bytearray] = {}
        self.names: dict[str, int] = {}
        self.dirs: set[str] = set()
        self.fd: int | None = None
        self.fd_inode = -1
        self._next_inode = 0
        self.log: list[str] = []

    # ------------------------------------------------------------------------ helpers

    def _new_inode(self) -> int:
        self._next_inode += 1
        self.inodes[self._next_inode] = bytearray()
        return self._next_inode

    def _parent_exists(self, path: str) -> bool:
        return "/" not in path or path.split("/", 1)[0] in self.dirs

    def _expect(self, what: str, call: Any, want: int | None) -> Any:
        """Run ``call``; it must fail with errno ``want`` (or succeed when ``want`` is None)."""
        self.log.append(what)
        result: Any = None
        failed: int | None = None
        try:
            result = call()
        except OSError as exc:
            failed = exc.errno
        got = "success" if failed is None else errno.errorcode.get(failed, str(failed))
        wanted = "success" if want is None else errno.errorcode[want]
        assert failed == want, f"{what}: got {got}, want {wanted}"
        return result

    @staticmethod
    def _write_at(content: bytearray, offset: int, data: bytes) -> None:
        if offset > len(content):
            content.extend(bytes(offset - len(content)))
        content[offset:offset + len(data)] = data

    @staticmethod
    def _resize(content: bytearray, size: int) -> None:
        if size < len(content):
            del content[size:]
        else:
            content.extend(bytes(size - len(content)))

    # ----------------------------------------------------------- the descriptor on MAIN

    def open_main(self, trunc: bool) -> None:
        self.close()
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if trunc else 0)
        self.fd = self._expect(f"open({MAIN}, trunc={trunc})", lambda: os.open(self.work / MAIN, flags, 0o644), None)
        if MAIN not in self.names:
            self.names[MAIN] = self._new_inode()
        elif trunc:
            del self.inodes[self.names[MAIN]][:]
        self.fd_inode = self.names[MAIN]

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self._expect("close", lambda: os.close(fd), None)

    def pread(self, offset: int, length: int) -> None:
        assert self.fd is not None
        fd = self.fd
        got = self._expect(f"pread({offset}, {length})", lambda: os.pread(fd, length, offset), None)
        want = bytes(self.inodes[self.fd_inode][offset:offset + length])
        assert got == want, f"pread({offset}, {length}): {len(got)} bytes differ from the model's {len(want)}"

    def pwrite(self, offset: int, data: bytes) -> None:
        assert self.fd is not None
        fd = self.fd
        written = self._expect(f"pwrite({offset}, {len(data)})", lambda: os.pwrite(fd, data, offset), None)
        assert written == len(data)
        self._write_at(self.inodes[self.fd_inode], offset, data)

    def ftruncate(self, size: int) -> None:
        assert self.fd is not None
        fd = self.fd
        self._expect(f"ftruncate({size})", lambda: os.ftruncate(fd, size), None)
        self._resize(self.inodes[self.fd_inode], size)

    # ---------------------------------------------------------------------- by name

    def truncate(self, path: str, size: int) -> None:
        want = None if path in self.names else errno.ENOENT
        self._expect(f"truncate({path}, {size})", lambda: os.truncate(self.work / path, size), want)
        if want is None:
            self._resize(self.inodes[self.names[path]], size)

    def write_whole(self, path: str, data: bytes) -> None:
        want = None if self._parent_exists(path) else errno.ENOENT

        def call() -> None:
            fd = os.open(self.work / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                assert os.write(fd, data) == len(data)
            finally:
                os.close(fd)

        self._expect(f"write_whole({path}, {len(data)})", call, want)
        if want is None:
            inode = self.names.setdefault(path, self._new_inode())
            self.inodes[inode][:] = data

    def append(self, path: str, data: bytes) -> None:
        want = None if self._parent_exists(path) else errno.ENOENT

        def call() -> None:
            fd = os.open(self.work / path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.lseek(fd, 0, os.SEEK_SET)  # O_APPEND writes at the end whatever the offset
                assert os.write(fd, data) == len(data)
            finally:
                os.close(fd)

        self._expect(f"append({path}, {len(data)})", call, want)
        if want is None:
            inode = self.names.setdefault(path, self._new_inode())
            self.inodes[inode].extend(data)

    def rename(self, src: str, dst: str) -> None:
        if src not in self.names or not self._parent_exists(dst):
            want: int | None = errno.ENOENT
        else:
            want = None
        self._expect(f"rename({src}, {dst})", lambda: os.rename(self.work / src, self.work / dst), want)
        if want is None and src != dst:
            self.names[dst] = self.names.pop(src)

    def unlink(self, path: str) -> None:
        want = None if path in self.names else errno.ENOENT
        self._expect(f"unlink({path})", lambda: os.unlink(self.work / path), want)
        if want is None:
            del self.names[path]

    def mkdir(self, name: str) -> None:
        want = errno.EEXIST if name in self.dirs else None
        self._expect(f"mkdir({name})", lambda: os.mkdir(self.work / name), want)
        self.dirs.add(name)

    def rmdir(self, name: str) -> None:
        if name not in self.dirs:
            want: int | None = errno.ENOENT
        elif any(path.startswith(name + "/") for path in self.names):
            want = errno.ENOTEMPTY
        else:
            want = None
        self._expect(f"rmdir({name})", lambda: os.rmdir(self.work / name), want)
        if want is None:
            self.dirs.discard(name)

    # ---------------------------------------------------------------------- checks

    def check_descriptor(self) -> None:
        if self.fd is not None:
            size = os.fstat(self.fd).st_size
            assert size == len(self.inodes[self.fd_inode]), f"fstat size {size}, model {len(self.inodes[self.fd_inode])}"

    def check_listings(self) -> None:
        top = {path for path in self.names if "/" not in path} | self.dirs
        assert sorted(os.listdir(self.work)) == sorted(top)
        for name in self.dirs:
            inside = {path.split("/", 1)[1] for path in self.names if path.startswith(name + "/")}
            assert sorted(os.listdir(self.work / name)) == sorted(inside), name

    def check_contents(self) -> None:
        for path, inode in self.names.items():
            want = bytes(self.inodes[inode])
            assert os.stat(self.work / path).st_size == len(want), f"size of {path}"
            with open(self.work / path, "rb") as handle:
                got = handle.read()
            assert got == want, f"content of {path}: {len(got)} bytes, model {len(want)}"

    def check_all(self) -> None:
        self.check_descriptor()
        self.check_listings()
        self.check_contents()


offsets = st.one_of(st.integers(0, 5000), st.integers(0, MAX_OFFSET))
sizes = st.one_of(st.integers(0, 100), st.integers(0, MAX_OFFSET))
lengths = st.integers(1, 70_000)
seeds = st.integers(0, 2**32)
data_lengths = st.one_of(st.integers(1, 64), st.integers(1, 20_000))
files = st.sampled_from(FILES)
dirs = st.sampled_from(DIRS)


def make_machine(root: Path) -> type[RuleBasedStateMachine]:
    """A machine whose examples each work in a fresh directory under ``root``."""
    counter = iter(range(1_000_000))

    class FsxMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.rig = Rig(root / f"run-{next(counter)}")

        def has_fd(self) -> bool:
            return self.rig.fd is not None

        @rule(trunc=st.booleans())
        def open_main(self, trunc: bool) -> None:
            self.rig.open_main(trunc)

        @precondition(has_fd)
        @rule()
        def close(self) -> None:
            self.rig.close()

        @precondition(has_fd)
        @rule(offset=offsets, length=lengths)
        def pread(self, offset: int, length: int) -> None:
            self.rig.pread(offset, length)

        @precondition(has_fd)
        @rule(offset=offsets, seed=seeds, length=data_lengths)
        def pwrite(self, offset: int, seed: int, length: int) -> None:
            self.rig.pwrite(offset, payload(seed, length))

        @precondition(has_fd)
        @rule(size=sizes)
        def ftruncate(self, size: int) -> None:
            self.rig.ftruncate(size)

        @rule(path=st.sampled_from([MAIN, *FILES]), size=sizes)
        def truncate(self, path: str, size: int) -> None:
            self.rig.truncate(path, size)

        @rule(path=files, seed=seeds, length=data_lengths)
        def write_whole(self, path: str, seed: int, length: int) -> None:
            self.rig.write_whole(path, payload(seed, length))

        @rule(path=files, seed=seeds, length=data_lengths)
        def append(self, path: str, seed: int, length: int) -> None:
            self.rig.append(path, payload(seed, length))

        @rule(src=files, dst=files)
        def rename(self, src: str, dst: str) -> None:
            self.rig.rename(src, dst)

        @rule(path=files)
        def unlink(self, path: str) -> None:
            self.rig.unlink(path)

        @rule(name=dirs)
        def mkdir(self, name: str) -> None:
            self.rig.mkdir(name)

        @rule(name=dirs)
        def rmdir(self, name: str) -> None:
            self.rig.rmdir(name)

        @invariant()
        def matches_model(self) -> None:
            self.rig.check_all()

        def teardown(self) -> None:
            self.rig.close()

    return FsxMachine


@pytest.mark.parametrize("kind", ["direct", "memory", "local", "staged"])
def test_fsx_machine(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with mounted(kind, tmp_path, request) as root:
        run_state_machine_as_test(make_machine(root), settings=FSX)


@pytest.mark.s3
def test_fsx_machine_s3(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with mounted("s3", tmp_path, request) as root:
        run_state_machine_as_test(make_machine(root), settings=FSX_S3)


def run_seeded(rig: Rig, seed: int, count: int) -> None:
    """``count`` random operations from ``seed``; the descriptor is checked after each, the
    whole tree every 100 operations and at the end."""
    rng = random.Random(seed)
    ops = ["pwrite", "pread", "ftruncate", "open", "close", "truncate", "append",
           "write_whole", "rename", "unlink", "mkdir", "rmdir"]
    weights = [30, 20, 8, 8, 5, 5, 5, 4, 6, 3, 3, 3]

    def offset() -> int:
        return rng.randrange(5000) if rng.random() < 0.5 else rng.randrange(MAX_OFFSET)

    def data() -> bytes:
        return rng.randbytes(rng.randint(1, 64) if rng.random() < 0.5 else rng.randint(1, 20_000))

    for step in range(count):
        op = rng.choices(ops, weights)[0]
        if op in {"pwrite", "pread", "ftruncate"} and rig.fd is None:
            op = "open"
        if op == "pwrite":
            rig.pwrite(offset(), data())
        elif op == "pread":
            rig.pread(offset(), rng.randint(1, 70_000))
        elif op == "ftruncate":
            rig.ftruncate(rng.randrange(100) if rng.random() < 0.3 else rng.randrange(MAX_OFFSET))
        elif op == "open":
            rig.open_main(rng.random() < 0.2)
        elif op == "close":
            rig.close()
        elif op == "truncate":
            rig.truncate(rng.choice(FILES), rng.randrange(MAX_OFFSET))
        elif op == "append":
            rig.append(rng.choice(FILES), data())
        elif op == "write_whole":
            rig.write_whole(rng.choice(FILES), data())
        elif op == "rename":
            rig.rename(rng.choice(FILES), rng.choice(FILES))
        elif op == "unlink":
            rig.unlink(rng.choice(FILES))
        elif op == "mkdir":
            rig.mkdir(rng.choice(DIRS))
        else:
            rig.rmdir(rng.choice(DIRS))
        rig.check_descriptor()
        if step % 100 == 99:
            rig.check_all()
    rig.close()
    rig.check_all()


@pytest.mark.parametrize("kind", ["direct", "local", "staged"])
def test_fsx_10000_seeded_operations(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """10,000 operations from a fixed seed (reproducible: the failing step is in the message);
    about 12 s through a local mount, so not marked slow."""
    with mounted(kind, tmp_path, request) as root:
        rig = Rig(root / "seeded")
        try:
            run_seeded(rig, seed=20240531, count=10_000)
        except AssertionError as exc:
            raise AssertionError(f"step {len(rig.log)}: {exc}; last operations: {rig.log[-8:]}") from exc
        finally:
            rig.close()
