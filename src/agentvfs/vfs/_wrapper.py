"""Delegating filesystems: one base that forwards everything, layers that add one concern."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import anyio

from ._base import (
    SupportsGrep,
    WorkspaceFilesystem,
    read_many,
    read_range,
    read_range_into,
    walk,
)
from ._records import FileEntry, FileStat, GrepFileResult

__all__ = ["TimeoutFilesystem", "WrapperFilesystem"]

T = TypeVar("T")


class WrapperFilesystem(WorkspaceFilesystem):
    """Forward every operation to ``inner``; subclasses override :meth:`_wrap`.

    Attributes not defined here (``base_path``, ``capabilities``, ...) are read from the
    wrapped filesystem, so a wrapper can stand wherever the inner one did.
    """

    def __init__(self, inner: WorkspaceFilesystem) -> None:
        # No super().__init__: identity, status and description all live in ``inner``.
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def id(self) -> str:  # type: ignore[override]
        return self.inner.id

    @property
    def read_only(self) -> bool:  # type: ignore[override]
        return self.inner.read_only

    @property
    def status(self) -> str:  # type: ignore[override]
        return self.inner.status

    @property
    def provider(self) -> str:  # type: ignore[override]
        return self.inner.provider

    async def _wrap(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        return await call()

    async def init(self) -> None:
        await self.inner.init()

    async def destroy(self) -> None:
        await self.inner.destroy()

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        return await self._wrap("read_file", lambda: self.inner.read_file(path, encoding=encoding))

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        recursive: bool = True,
        overwrite: bool = True,
        mime_type: str | None = None,
        expected_mtime: datetime | FileStat | None = None,
    ) -> None:
        await self._wrap(
            "write_file",
            lambda: self.inner.write_file(
                path, content, recursive=recursive, overwrite=overwrite, mime_type=mime_type,
                expected_mtime=expected_mtime,
            ),
        )

    async def append_file(self, path: str, content: str | bytes) -> None:
        await self._wrap("append_file", lambda: self.inner.append_file(path, content))

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        await self._wrap("delete_file", lambda: self.inner.delete_file(path, force=force))

    async def copy_file(
        self, src: str, dest: str, *, overwrite: bool = True, recursive: bool = False
    ) -> None:
        await self._wrap(
            "copy_file", lambda: self.inner.copy_file(src, dest, overwrite=overwrite, recursive=recursive)
        )

    async def move_file(self, src: str, dest: str, *, overwrite: bool = True) -> None:
        await self._wrap("move_file", lambda: self.inner.move_file(src, dest, overwrite=overwrite))

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        await self._wrap("mkdir", lambda: self.inner.mkdir(path, recursive=recursive))

    async def rmdir(self, path: str, *, recursive: bool = False, force: bool = False) -> None:
        await self._wrap("rmdir", lambda: self.inner.rmdir(path, recursive=recursive, force=force))

    async def readdir(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        extension: str | list[str] | None = None,
        max_depth: int | None = None,
    ) -> list[FileEntry]:
        return await self._wrap(
            "readdir",
            lambda: self.inner.readdir(path, recursive=recursive, extension=extension, max_depth=max_depth),
        )

    async def exists(self, path: str) -> bool:
        return await self._wrap("exists", lambda: self.inner.exists(path))

    async def stat(self, path: str) -> FileStat:
        return await self._wrap("stat", lambda: self.inner.stat(path))

    async def walk(
        self, path: str = "", *, max_depth: int | None = None, include_hidden: bool = True
    ) -> list[FileEntry]:
        return await self._wrap(
            "walk", lambda: walk(self.inner, path, max_depth=max_depth, include_hidden=include_hidden)
        )

    async def grep(self, pattern: str, path: str = "", **options: Any) -> list[GrepFileResult]:
        inner = self.inner
        if not isinstance(inner, SupportsGrep):
            raise NotImplementedError(f"{inner.name} has no native grep")
        return await self._wrap("grep", lambda: inner.grep(pattern, path, **options))

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        return await self._wrap("read_range", lambda: read_range(self.inner, path, start, end))

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        return await self._wrap("read_range", lambda: read_range_into(self.inner, path, start, buffer))

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        return await self._wrap("read_many", lambda: read_many(self.inner, paths, max_bytes=max_bytes))

    def get_instructions(self, **kwargs: Any) -> str:
        return self.inner.get_instructions(**kwargs)

    def get_mount_config(self) -> dict[str, Any] | None:
        return self.inner.get_mount_config()

    async def get_info(self) -> dict[str, Any]:
        return await self.inner.get_info()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class TimeoutFilesystem(WrapperFilesystem):
    """Give every operation a deadline; a late one raises ``TimeoutError``.

    Writes stage their data and commit in one step, and a write whose deadline passed before
    the commit does not commit, so a timed-out operation leaves no partial file.

    Parameters
    ----------
    inner : WorkspaceFilesystem
        The filesystem to guard.
    timeout_ms : float
        Deadline per operation, in milliseconds.
    """

    def __init__(self, inner: WorkspaceFilesystem, timeout_ms: float) -> None:
        super().__init__(inner)
        self.timeout_ms = timeout_ms

    async def _wrap(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        with anyio.move_on_after(self.timeout_ms / 1000) as scope:
            return await call()
        if scope.cancelled_caught:
            raise TimeoutError(f"Filesystem operation {operation} timed out after {self.timeout_ms:g}ms")
        raise AssertionError("unreachable")  # pragma: no cover
