"""Mount roots for the FUSE mount tests: a plain directory (the control) or an agentvfs mount.

``mounted(kind, tmp_path, request)`` yields the root path of a fresh, empty tree:

- ``direct``: a plain directory on the host filesystem. The tests run here first; a test that
  fails on ``direct`` is a wrong test, not a mount bug.
- ``memory``: ``agentvfs.mounts.Mount`` over an ``FsspecFilesystem`` on a private memory store.
- ``local``: the mount over a ``LocalFilesystem`` on a temporary directory.
- ``staged``: the same with FUSE passthrough off (``passthrough=false``), so every written file
  takes the staged path (a private copy published by a link and a rename), as on every
  machine where passthrough is unavailable.
- ``s3``: the mount over an ``FsspecFilesystem`` on the session's moto server (mark ``s3``).

``open_mount`` yields a :class:`MountedRoot`, which also reads the storage behind the mount
directly (to check that data written is in the backend once ``close()`` returns).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentvfs.testing import Harness, local_harness
from conftest import memory_harness, s3_harness

__all__ = [
    "KINDS",
    "MOUNT_KINDS",
    "MountedRoot",
    "fuse_unavailable",
    "mounted",
    "open_mount",
    "wait_until",
]

#: Every kind, for tests that must hold on a plain directory and on each mount.
KINDS: list[Any] = ["direct", "memory", "local", pytest.param("s3", marks=pytest.mark.s3)]
#: The mounted kinds only.
MOUNT_KINDS: list[Any] = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]


@dataclass(frozen=True)
class MountedRoot:
    """A tree under test.

    Attributes
    ----------
    root : Path
        Where the tree is visible to ``os`` calls.
    kind : str
        ``direct``, ``memory``, ``local``, ``staged`` or ``s3``.
    backend : callable
        ``backend("a/b.txt")`` returns the bytes the storage holds for that file (None if it
        holds none), read around the mount.
    """

    root: Path
    kind: str
    backend: Callable[[str], bytes | None]


def wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def fuse_unavailable() -> str | None:
    """Why FUSE mounts cannot run here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "FUSE is not available: /dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "FUSE is not available: fusermount3 is not installed"
    return None


def _mount_class() -> Any:
    reason = fuse_unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        module = importlib.import_module("agentvfs.mounts")
    except ImportError as exc:
        pytest.skip(f"agentvfs.mounts not available ({exc})")
    mount_class = getattr(module, "Mount", None)
    if mount_class is None:
        pytest.skip("agentvfs.mounts not available (no Mount yet)")
    return mount_class


def _harness(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Harness:
    if kind == "memory":
        return memory_harness()
    if kind in ("local", "staged"):
        base = tmp_path / "backend"
        base.mkdir()
        return local_harness(str(base))
    if kind == "s3":
        return s3_harness(request.getfixturevalue("moto"))
    raise ValueError(f"unknown mount kind {kind!r}")


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _populate_dir(root: Path, files: Mapping[str, bytes], dirs: Iterable[str]) -> None:
    for name in dirs:
        (root / name).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


@contextmanager
def _direct(
    tmp_path: Path, read_only: bool, files: Mapping[str, bytes], dirs: Iterable[str]
) -> Iterator[MountedRoot]:
    source = tmp_path / "direct"
    source.mkdir()
    _populate_dir(source, files, dirs)
    if not read_only:
        yield MountedRoot(source, "direct", lambda rel: _read_file(source / rel))
        return
    # The read-only control is a read-only bind mount of the populated directory.
    view = tmp_path / "direct-ro"
    view.mkdir()
    done = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(source), str(view)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"no read-only control directory (mount --bind -o ro: {done.stderr.strip()})")
    try:
        yield MountedRoot(view, "direct", lambda rel: _read_file(source / rel))
    finally:
        subprocess.run(["umount", str(view)], check=True)


@contextmanager
def open_mount(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    *,
    read_only: bool | None = None,
    options: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
    dirs: Iterable[str] = (),
) -> Iterator[MountedRoot]:
    """Yield a :class:`MountedRoot` of ``kind``, holding ``files`` and ``dirs`` at the start.

    ``files`` and ``dirs`` are written to the storage before mounting (so they exist on a
    read-only mount too). Non-direct kinds skip when FUSE or ``agentvfs.mounts`` is missing.
    """
    files = dict(files or {})
    if kind == "direct":
        with _direct(tmp_path, bool(read_only), files, dirs) as tree:
            yield tree
        return
    mount_class = _mount_class()
    harness = _harness(kind, tmp_path, request)

    async def populate() -> None:
        for name in dirs:
            await harness.fs.mkdir(name)
        for name, data in files.items():
            await harness.fs.write_file(name, data)

    if files or dirs:
        anyio.run(populate)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    kwargs: dict[str, Any] = {"read_only": read_only}
    if kind == "staged":
        options = {**(options or {}), "passthrough": False}
    if options is not None:
        kwargs["options"] = dict(options)
    with mount_class(harness.fs, str(mountpoint), **kwargs):
        yield MountedRoot(mountpoint, kind, harness.get)


@contextmanager
def mounted(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    *,
    read_only: bool | None = None,
    options: Mapping[str, Any] | None = None,
) -> Iterator[Path]:
    """Yield the root path of an empty tree of ``kind`` (see :func:`open_mount`)."""
    with open_mount(kind, tmp_path, request, read_only=read_only, options=options) as tree:
        yield tree.root
