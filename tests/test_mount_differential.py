"""Differential test: one seeded operation sequence on the mount and on a plain local directory.

Each operation's result (its return value or errno) must be the same on both trees, step by
step, and the whole trees (types, modes, sizes, contents, listings) are compared every few
steps and at the end. The paths come from a small namespace where files and directories
collide, so refusals (ENOENT, ENOTDIR, EISDIR, EEXIST, ENOTEMPTY, EINVAL) are exercised as
much as successes.

What is allowed to differ is listed in ``ALLOWED_DIFFERENCES``; everything else must match.
``direct`` runs the sequence against a second plain directory: the control.
"""

from __future__ import annotations

import errno
import os
import random
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _mounted import mounted

#: stat fields (and other facts) that may differ between the mount and a local directory.
ALLOWED_DIFFERENCES: dict[str, str] = {
    "st_ino": "inode numbers are the mount's own",
    "st_dev": "another filesystem",
    "st_atime": "access times depend on caching and mount options (relatime)",
    "st_mtime": "modification times depend on the clock at each step (not compared)",
    "st_ctime": "change times depend on the clock at each step (not compared)",
    "st_blocks": "allocation is storage-specific",
    "st_blksize": "preferred I/O size is storage-specific",
    "directory st_size": "directory sizes are filesystem-specific (ext4: 4096)",
    "directory st_nlink": "directory link counts are filesystem-specific (btrfs: 1)",
    "listing order": "readdir order is unspecified; listings are compared sorted",
}

PATHS = ["a", "b", "d", "e", "d/a", "d/b", "d/e", "d/e/a", "e/a"]
SEED = 20240601
STEPS = 300
SNAPSHOT_EVERY = 25


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        shown = [f"<{len(arg)} bytes>" if isinstance(arg, bytes) else repr(arg) for arg in self.args]
        return f"{self.name}({', '.join(shown)})"


def make_ops(seed: int, count: int) -> list[Op]:
    rng = random.Random(seed)
    weights = {
        "create": 10, "overwrite": 8, "write": 10, "append": 8, "truncate": 7, "rename": 10,
        "unlink": 7, "mkdir": 10, "rmdir": 7, "listdir": 6, "stat": 8, "read": 8, "chmod": 3,
    }
    names, cumulative = list(weights), list(weights.values())

    def data() -> bytes:
        return rng.randbytes(rng.choice([0, 1, 17, 512, 4096, 70_000]))

    ops = []
    for _ in range(count):
        name = rng.choices(names, cumulative)[0]
        path = rng.choice(PATHS)
        if name in {"create", "overwrite", "append"}:
            args: tuple[Any, ...] = (path, data())
        elif name == "write":
            args = (path, rng.choice([0, 3, 4096, 100_000]), data())
        elif name == "truncate":
            args = (path, rng.choice([0, 1, 10, 5000, 80_000]))
        elif name == "rename":
            args = (path, rng.choice(PATHS))
        elif name == "chmod":
            args = (path, rng.choice([0o600, 0o644, 0o755, 0o700]))
        else:
            args = (path,)
        ops.append(Op(name, args))
    return ops


def _write_all(path: Path, flags: int, data: bytes, offset: int | None = None) -> int:
    fd = os.open(path, flags, 0o644)
    try:
        if offset is None:
            return os.write(fd, data)
        return os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _stat_facts(path: Path) -> tuple[Any, ...]:
    """The stat fields that must agree (see ALLOWED_DIFFERENCES)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        return ("dir", oct(st.st_mode), st.st_uid, st.st_gid)
    return ("file", oct(st.st_mode), st.st_size, st.st_nlink, st.st_uid, st.st_gid)


def apply(root: Path, op: Op) -> tuple[str, Any]:
    """Run ``op`` under ``root``; ``("ok", value)`` or ``("error", errno name)``."""
    p = root / op.args[0]
    try:
        if op.name == "create":
            value: Any = _write_all(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, op.args[1])
        elif op.name == "overwrite":
            value = _write_all(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, op.args[1])
        elif op.name == "write":
            value = _write_all(p, os.O_WRONLY, op.args[2], op.args[1])
        elif op.name == "append":
            value = _write_all(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, op.args[1])
        elif op.name == "truncate":
            os.truncate(p, op.args[1])
            value = None
        elif op.name == "rename":
            os.rename(p, root / op.args[1])
            value = None
        elif op.name == "unlink":
            os.unlink(p)
            value = None
        elif op.name == "mkdir":
            os.mkdir(p, 0o755)
            value = None
        elif op.name == "rmdir":
            os.rmdir(p)
            value = None
        elif op.name == "listdir":
            value = sorted(os.listdir(p))
        elif op.name == "stat":
            value = _stat_facts(p)
        elif op.name == "read":
            with open(p, "rb") as handle:
                value = handle.read()
        elif op.name == "chmod":
            os.chmod(p, op.args[1])
            value = None
        else:
            raise AssertionError(op.name)
    except OSError as exc:
        return ("error", errno.errorcode.get(exc.errno or 0, str(exc.errno)))
    return ("ok", value)


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below ``root``: its stat facts, and a file's content."""
    tree: dict[str, tuple[Any, ...]] = {}
    for directory, subdirs, files in os.walk(root):
        for name in subdirs + files:
            path = Path(directory) / name
            rel = str(path.relative_to(root))
            facts = _stat_facts(path)
            if facts[0] == "file":
                facts = (*facts, path.read_bytes())
            tree[rel] = facts
    return tree


def describe(result: tuple[str, Any]) -> str:
    kind, value = result
    if isinstance(value, bytes):
        return f"{kind}: <{len(value)} bytes>"
    return f"{kind}: {value!r}"


def run_differential(mount_root: Path, reference: Path, ops: list[Op]) -> None:
    done: list[str] = []
    for step, op in enumerate(ops):
        done.append(str(op))
        expected = apply(reference, op)
        got = apply(mount_root, op)
        assert got == expected, (
            f"step {step}: {op}: mount {describe(got)}, local directory {describe(expected)}; "
            f"operations so far: {done}"
        )
        if step % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1 or step == len(ops) - 1:
            mount_tree, reference_tree = snapshot(mount_root), snapshot(reference)
            differing = sorted(
                name for name in mount_tree.keys() | reference_tree.keys()
                if mount_tree.get(name) != reference_tree.get(name)
            )
            assert not differing, (
                f"after step {step}: trees differ at {differing}: "
                f"mount {[mount_tree.get(n, 'missing')[:6] for n in differing]}, "
                f"local directory {[reference_tree.get(n, 'missing')[:6] for n in differing]}; "
                f"operations so far: {done}"
            )


def test_operation_generator_is_deterministic() -> None:
    assert make_ops(SEED, 50) == make_ops(SEED, 50)
    assert {op.name for op in make_ops(SEED, STEPS)} >= {"create", "rename", "rmdir", "write"}


@pytest.mark.parametrize(
    "kind", ["direct", "memory", "local", pytest.param("s3", marks=pytest.mark.s3)]
)
@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_mount_matches_local_directory(
    kind: str, seed: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    old_umask = os.umask(0o022)
    try:
        with mounted(kind, tmp_path, request) as root:
            run_differential(root, reference, make_ops(seed, STEPS))
    finally:
        os.umask(old_umask)
