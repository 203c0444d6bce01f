"""Harnesses: a filesystem under test plus an oracle that reads and writes storage directly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import os
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..vfs import (
    Backend,
    BackendFilesystem,
    CompositeFilesystem,
    FsspecFilesystem,
    LocalFilesystem,
    OverlayFilesystem,
    WorkspaceFilesystem,
)

T = TypeVar("T")

__all__ = [
    "Harness",
    "backend_harness",
    "composite_harness",
    "fsspec_harness",
    "local_harness",
    "mounted_harness",
    "overlay_harness",
]


@dataclass
class Harness:
    """What a conformance test needs to know about one backend.

    Attributes
    ----------
    fs : WorkspaceFilesystem
        The filesystem under test.
    put, get, isdir : callable
        The oracle: write bytes, read bytes (None if missing) and test for a directory,
        straight on the storage, bypassing ``fs``.
    reopen : callable
        ``reopen(read_only=True)`` returns another filesystem over the same storage.
    prefix : str
        Where the suite's paths live inside ``fs`` (a mount point for composites).
    """

    fs: WorkspaceFilesystem
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes | None]
    isdir: Callable[[str], bool]
    reopen: Callable[..., WorkspaceFilesystem]
    prefix: str = ""
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def p(self, path: str) -> str:
        """The suite path ``path`` as ``fs`` names it."""
        return f"{self.prefix}{path}" if self.prefix else path

    def inner(self, path: str) -> str:
        """How error messages name ``path`` (composites pass the remainder to the mount)."""
        return path


def fsspec_harness(raw: Any, root: str, *, name: str, **options: Any) -> Harness:
    """Build a harness for ``FsspecFilesystem(raw, root=root)`` with ``raw`` as the oracle.

    ``raw`` should be a separate fsspec instance over the same storage (for remote stores,
    created with ``skip_instance_cache=True`` and no listings cache).
    """
    base = raw._strip_protocol(root).rstrip("/")

    def full(path: str) -> str:
        return f"{base}/{path}" if base else path

    def put(path: str, data: bytes) -> None:
        target = full(path)
        if "/" in target.strip("/"):
            raw.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        raw.pipe_file(target, data)
        raw.invalidate_cache()

    def get(path: str) -> bytes | None:
        raw.invalidate_cache()
        try:
            return bytes(raw.cat_file(full(path)))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def isdir(path: str) -> bool:
        raw.invalidate_cache()
        return bool(raw.isdir(full(path)))

    def reopen(**kw: Any) -> WorkspaceFilesystem:
        return FsspecFilesystem(raw, root=root, **(options | kw))

    return Harness(FsspecFilesystem(raw, root=root, **options), put, get, isdir, reopen, name=name)


def _blocking(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an async backend call to completion from synchronous code, even inside a running
    event loop (the oracle is called from async tests): in a thread of its own."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, call()).result()


def backend_harness(backend: Backend, *, name: str = "") -> Harness:
    """Build a harness for ``BackendFilesystem(backend)`` with the backend itself as the
    oracle: how a third-party :class:`~agentvfs.vfs.Backend` runs the conformance suite.

    The oracle calls the backend's operations directly (bypassing the filesystem layer), so
    the backend must allow calls from another thread and event loop.
    """

    def put(path: str, data: bytes) -> None:
        parts = path.split("/")[:-1]
        for directory in ("/".join(parts[:depth]) for depth in range(1, len(parts) + 1)):
            _blocking(functools.partial(backend.make_dir, directory))
        _blocking(lambda: backend.write(path, data))

    def get(path: str) -> bytes | None:
        try:
            return _blocking(lambda: backend.read(path))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def isdir(path: str) -> bool:
        try:
            return _blocking(lambda: backend.stat(path)).type == "directory"
        except FileNotFoundError:
            return False

    def reopen(**kw: Any) -> WorkspaceFilesystem:
        return BackendFilesystem(backend, **kw)

    return Harness(BackendFilesystem(backend), put, get, isdir, reopen, name=name or backend.provider)


def local_harness(base: str, *, name: str = "local") -> Harness:
    """Build a harness for ``LocalFilesystem(base)`` with ``os`` as the oracle."""

    def put(path: str, data: bytes) -> None:
        target = os.path.join(base, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(data)

    def get(path: str) -> bytes | None:
        try:
            with open(os.path.join(base, path), "rb") as handle:
                return handle.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def isdir(path: str) -> bool:
        return os.path.isdir(os.path.join(base, path))

    def reopen(**kw: Any) -> WorkspaceFilesystem:
        return LocalFilesystem(base, **kw)

    return Harness(LocalFilesystem(base), put, get, isdir, reopen, name=name)


def composite_harness(main: Harness, other: Harness, *, name: str = "composite") -> Harness:
    """Mount ``main`` at ``/data`` and ``other`` at ``/other``; suite paths go to ``/data``."""

    def reopen(**kw: Any) -> WorkspaceFilesystem:
        return CompositeFilesystem({"/data": main.reopen(**kw), "/other": other.reopen(**kw)})

    harness = Harness(
        CompositeFilesystem({"/data": main.fs, "/other": other.fs}),
        main.put, main.get, main.isdir, reopen, prefix="data/", name=name,
    )
    harness.extra["other"] = other
    return harness


def overlay_harness(base: Harness, upper: Harness, *, name: str = "") -> Harness:
    """Build a harness for ``OverlayFilesystem(base.fs, upper.fs)``.

    The oracle writes into the base storage (what the overlay shows until it changes a
    path, and what changes behind its back), and reads the view from the two storages
    directly: the upper storage's file, else nothing where the overlay's records in the
    upper storage (``.agentvfs-overlay/manifest.json``) hide the path, else the base
    storage's file. So it checks what the overlay really keeps, not what it remembers.
    """

    def hidden(path: str) -> bool:
        raw = upper.get(".agentvfs-overlay/manifest.json")
        whiteouts = set(json.loads(raw)["hidden"]) if raw is not None else set()
        parts = path.split("/")
        return any("/".join(parts[:depth]) in whiteouts for depth in range(1, len(parts) + 1))

    def upper_file_above(path: str) -> bool:
        parts = path.split("/")
        return any(upper.get("/".join(parts[:depth])) is not None for depth in range(1, len(parts)))

    def get(path: str) -> bytes | None:
        data = upper.get(path)
        if data is not None:
            return data
        if upper.isdir(path) or upper_file_above(path) or hidden(path):
            return None
        return base.get(path)

    def isdir(path: str) -> bool:
        if upper.isdir(path):
            return True
        if upper.get(path) is not None or upper_file_above(path) or hidden(path):
            return False
        return base.isdir(path)

    def reopen(**kw: Any) -> WorkspaceFilesystem:
        return OverlayFilesystem(base.reopen(), upper.reopen(), **kw)

    harness = Harness(
        OverlayFilesystem(base.fs, upper.fs), base.put, get, isdir, reopen,
        name=name or f"overlay-{base.name}-on-{upper.name}",
    )
    harness.extra["base"] = base
    harness.extra["upper"] = upper
    return harness


@contextlib.contextmanager
def mounted_harness(inner: Harness, mountpoint: str, *, process: bool = False, **options: Any) -> Iterator[Harness]:
    """FUSE-mount ``inner.fs`` at ``mountpoint`` and yield a harness whose filesystem works
    on the mount point with plain ``os`` calls, while the oracle still reads and writes the
    storage directly. The mount trusts nothing cached (``metadata_ttl=0``) unless told, since
    the oracle changes storage behind its back. With ``process=True`` a child process serves
    the mount (as sandboxes do for filesystems it can rebuild).
    """
    from ..mounts import Mount, ProcessMount

    settings: dict[str, Any] = {"metadata_ttl": 0.0} | options
    kind = ProcessMount if process else Mount
    with kind(inner.fs, mountpoint, options=settings) as handle:

        def reopen(**kw: Any) -> WorkspaceFilesystem:
            return FsspecFilesystem(f"file://{mountpoint}", **kw)

        harness = Harness(
            FsspecFilesystem(f"file://{mountpoint}"),
            inner.put, inner.get, inner.isdir, reopen,
            name=f"mount-{inner.name}",
        )
        harness.extra["mount"] = handle
        harness.extra["inner"] = inner
        yield harness
