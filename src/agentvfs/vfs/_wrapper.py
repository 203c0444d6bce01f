"""Delegating filesystems: one base that forwards every operation, layers that add one concern.

The delegation is explicit: every operation of :class:`WorkspaceFilesystem` and of the
optional asynchronous groups (listing with stats, transfers, streamed uploads, reads beneath
a directory, grep) is a method here that goes through :meth:`WrapperFilesystem._wrap`, so a
layer such as :class:`TimeoutFilesystem` covers all of them and cannot miss one that is
added later (``tests/test_wrapper.py`` calls every public coroutine method). Nothing is
forwarded implicitly.

What a wrapper does not offer is the synchronous descriptor group
(:class:`~agentvfs.vfs.SupportsLocalFiles`): a FUSE passthrough of those descriptors makes
the kernel read the file directly, and no deadline can cover that. A mount of a wrapped
local filesystem serves reads through the wrapper instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio

from ._backend import Version
from ._base import (
    SupportsGrep,
    SupportsStreamingUpload,
    SupportsUploadRecovery,
    UploadStream,
    WorkspaceFilesystem,
    attribute_storage,
    download_file,
    list_stats,
    make_hard_link,
    make_special,
    publish_file,
    put_new,
    read_file_beneath,
    read_many,
    read_range,
    read_range_into,
    rewrite_file,
    set_attributes,
    upload_file,
    walk,
    walk_stats,
)
from ._posix import PosixAttributes
from ._records import Capabilities, FileEntry, FileStat, GrepFileResult

if TYPE_CHECKING:
    from .._context import RequestContext

__all__ = ["TimeoutFilesystem", "WrapperFilesystem"]

T = TypeVar("T")


class WrapperFilesystem(WorkspaceFilesystem):
    """Forward every operation to ``inner``; subclasses override :meth:`_wrap`.

    Identity, status and description are the inner filesystem's, read through properties,
    so a wrapper can stand wherever the inner one did.

    Parameters
    ----------
    inner : WorkspaceFilesystem
        The filesystem every call goes to.
    """

    def __init__(self, inner: WorkspaceFilesystem) -> None:
        # No super().__init__: identity, status and description all live in ``inner``.
        self.inner = inner

    async def _wrap(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one operation; the hook every layer overrides."""
        return await call()

    # -- identity and description (the inner filesystem's) ---------------------------------

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def id(self) -> str:  # type: ignore[override]
        return self.inner.id

    @property
    def provider(self) -> str:  # type: ignore[override]
        return self.inner.provider

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return self.inner.capabilities

    @property
    def read_only(self) -> bool:  # type: ignore[override]
        return self.inner.read_only

    @property
    def status(self) -> str:  # type: ignore[override]
        return self.inner.status

    @property
    def error(self) -> str | None:  # type: ignore[override]
        return self.inner.error

    @property
    def display_name(self) -> str | None:  # type: ignore[override]
        return self.inner.display_name

    @property
    def description(self) -> str | None:  # type: ignore[override]
        return self.inner.description

    @property
    def icon(self) -> str | None:  # type: ignore[override]
        return self.inner.icon

    @property
    def text_extensions(self) -> frozenset[str]:  # type: ignore[override]
        return self.inner.text_extensions

    def default_instructions(self) -> str:
        return self.inner.default_instructions()

    def get_instructions(self, *, request_context: RequestContext | None = None) -> str:
        return self.inner.get_instructions(request_context=request_context)

    def get_mount_config(self) -> dict[str, Any] | None:
        return self.inner.get_mount_config()

    @property
    def location(self) -> str | None:
        return self.inner.location

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()

    async def get_info(self) -> dict[str, Any]:
        return await self.inner.get_info()

    # -- lifecycle ----------------------------------------------------------------------------

    async def init(self) -> None:
        await self._wrap("init", self.inner.init)

    async def destroy(self) -> None:
        # Never under a deadline: releasing resources half way would leak them.
        await self.inner.destroy()

    async def probe(self) -> None:
        await self._wrap("probe", self.inner.probe)

    async def ensure_ready(self) -> None:
        await self._wrap("ensure_ready", self.inner.ensure_ready)

    # -- the core -------------------------------------------------------------------------------

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

    # -- the optional groups (each falls back where the inner filesystem lacks it) -------------

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
        return await self._wrap("read_range_into", lambda: read_range_into(self.inner, path, start, buffer))

    async def read_many(
        self, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> dict[str, bytes | OSError]:
        return await self._wrap("read_many", lambda: read_many(self.inner, paths, max_bytes=max_bytes))

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        return await self._wrap(
            "read_file_beneath", lambda: read_file_beneath(self.inner, directory, path, max_bytes=max_bytes)
        )

    async def list_stats(self, path: str = "") -> list[FileStat]:
        return await self._wrap("list_stats", lambda: list_stats(self.inner, path))

    async def walk_stats(self, path: str = "", *, max_depth: int | None = None) -> list[tuple[str, FileStat]]:
        return await self._wrap("walk_stats", lambda: walk_stats(self.inner, path, max_depth=max_depth))

    async def upload_file(self, local_path: str, path: str) -> None:
        await self._wrap("upload_file", lambda: upload_file(self.inner, local_path, path))

    async def publish_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        create: bool = False,
        attributes: PosixAttributes | None = None,
        keep: Mapping[str, str] | None = None,
    ) -> str | None:
        return await self._wrap(
            "upload_file",
            lambda: publish_file(
                self.inner, local_path, path, expected=expected, create=create, attributes=attributes, keep=keep
            ),
        )

    async def put_new(self, path: str, content: bytes) -> None:
        if type(self).write_file is not WrapperFilesystem.write_file:
            # A layer with writes of its own (a policy, an audit) sees this one too.
            await self.write_file(path, content, overwrite=False)
            return
        await self._wrap("write_file", lambda: put_new(self.inner, path, content))

    @property
    def attribute_storage(self) -> Literal["native", "metadata"] | None:
        return attribute_storage(self.inner)

    async def set_attributes(self, path: str, attrs: PosixAttributes, *, expected: Version | None = None) -> str | None:
        return await self._wrap("setattr", lambda: set_attributes(self.inner, path, attrs, expected=expected))

    async def make_special(self, path: str, attrs: PosixAttributes) -> None:
        await self._wrap("mknod", lambda: make_special(self.inner, path, attrs))

    async def make_hard_link(self, src: str, dest: str) -> None:
        await self._wrap("link", lambda: make_hard_link(self.inner, src, dest))

    async def rewrite_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        attributes: PosixAttributes | None = None,
    ) -> str | None:
        return await self._wrap(
            "upload_file",
            lambda: rewrite_file(self.inner, local_path, path, expected=expected, attributes=attributes),
        )

    async def download_file(self, path: str, local_path: str) -> None:
        await self._wrap("download_file", lambda: download_file(self.inner, path, local_path))

    async def read_range_pinned(self, path: str, start: int, buffer: memoryview, version: str) -> int:
        return await self._wrap(
            "read_range_pinned", lambda: read_range_into(self.inner, path, start, buffer, version=version)
        )

    async def abort_upload(self, ticket: Mapping[str, str]) -> bool:
        inner = self.inner
        if not isinstance(inner, SupportsUploadRecovery):
            return False
        return await self._wrap("abort_upload", lambda: inner.abort_upload(ticket))

    async def open_upload(self, path: str, *, part_size: int, **attributes: Any) -> UploadStream | None:
        inner = self.inner
        if not isinstance(inner, SupportsStreamingUpload):
            return None  # the caller writes the file whole instead
        # ``attributes``: the ``attributes`` and ``keep`` of SupportsPosixAttributes stores.
        stream = await self._wrap(
            "open_upload", lambda: inner.open_upload(path, part_size=part_size, **attributes)
        )
        return None if stream is None else _WrappedUpload(self, stream)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class _WrappedUpload:
    """An upload stream whose every step goes through its wrapper's :meth:`_wrap`."""

    __slots__ = ("_stream", "_wrapper")

    def __init__(self, wrapper: WrapperFilesystem, stream: UploadStream) -> None:
        self._wrapper = wrapper
        self._stream = stream

    async def write(self, data: bytes) -> None:
        await self._wrapper._wrap("upload write", lambda: self._stream.write(data))

    async def commit(self) -> None:
        await self._wrapper._wrap("upload commit", self._stream.commit)

    async def abort(self) -> None:
        # Not under a deadline: an abort cut short would leave the parts in storage.
        await self._stream.abort()


class TimeoutFilesystem(WrapperFilesystem):
    """Give every operation a deadline; a late one raises ``TimeoutError``.

    Writes stage their data and commit in one step, and a write whose deadline passed before
    the commit does not commit, so a timed-out operation leaves no partial file. ``destroy``
    and an upload's ``abort`` have no deadline: cutting them short would leak what they
    release.

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
