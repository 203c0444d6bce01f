"""The delegating filesystems: every operation a wrapper exposes goes through its hook.

A slow filesystem answers every call after a long sleep; a :class:`TimeoutFilesystem` around
it must fail every public coroutine method it has, quickly, whatever method is added later.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anyio
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import CompositeFilesystem, FsspecFilesystem, LocalFilesystem
from agentvfs.vfs import (
    FileStat,
    PosixAttributes,
    SupportsLocalFiles,
    SupportsStreamingUpload,
    TimeoutFilesystem,
    UploadStream,
    Version,
    WorkspaceFilesystem,
    WrapperFilesystem,
)

pytestmark = pytest.mark.anyio

SLOW = 5.0  # seconds every slow call sleeps; the deadline is far shorter


class _SlowUpload:
    async def write(self, data: bytes) -> None:
        await anyio.sleep(SLOW)

    async def commit(self) -> None:
        await anyio.sleep(SLOW)

    async def abort(self) -> None:
        pass


class SlowFilesystem(FsspecFilesystem):
    """A memory filesystem whose every operation, optional groups included, first sleeps."""

    def __init__(self) -> None:
        super().__init__(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/slow")

    async def _slow(self) -> None:
        await anyio.sleep(SLOW)

    async def read_file(self, path: str, *, encoding: str | None = None) -> str | bytes:
        await self._slow()
        return b""

    @property
    def attribute_storage(self) -> Literal["native", "metadata"] | None:
        return "metadata"

    async def set_attributes(self, path: str, attrs: PosixAttributes, *, expected: Version | None = None) -> str | None:
        await self._slow()
        return None

    async def make_special(self, path: str, attrs: PosixAttributes) -> None:
        await self._slow()

    async def make_hard_link(self, src: str, dest: str) -> None:
        await self._slow()

    async def rewrite_file(
        self,
        local_path: str,
        path: str,
        *,
        expected: Version | None = None,
        attributes: PosixAttributes | None = None,
    ) -> str | None:
        await self._slow()
        return None

    async def write_file(self, path: str, content: str | bytes, **kw: Any) -> None:
        await self._slow()

    async def append_file(self, path: str, content: str | bytes) -> None:
        await self._slow()

    async def delete_file(self, path: str, *, force: bool = False) -> None:
        await self._slow()

    async def copy_file(self, src: str, dest: str, **kw: Any) -> None:
        await self._slow()

    async def move_file(self, src: str, dest: str, **kw: Any) -> None:
        await self._slow()

    async def mkdir(self, path: str, *, recursive: bool = True) -> None:
        await self._slow()

    async def rmdir(self, path: str, **kw: Any) -> None:
        await self._slow()

    async def readdir(self, path: str = "", **kw: Any) -> list[Any]:
        await self._slow()
        return []

    async def exists(self, path: str) -> bool:
        await self._slow()
        return False

    async def stat(self, path: str) -> FileStat:
        await self._slow()
        raise AssertionError("unreachable")

    async def walk(self, path: str = "", **kw: Any) -> list[Any]:
        await self._slow()
        return []

    async def grep(self, pattern: str, path: str = "", **kw: Any) -> list[Any]:
        await self._slow()
        return []

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        await self._slow()
        return b""

    async def read_range_into(self, path: str, start: int, buffer: memoryview) -> int:
        await self._slow()
        return 0

    async def read_range_pinned(self, path: str, start: int, buffer: memoryview, version: str) -> int:
        await self._slow()
        return 0

    async def publish_file(self, local_path: str, path: str, **condition: Any) -> str | None:
        await self._slow()
        return None

    async def abort_upload(self, ticket: Mapping[str, str]) -> bool:
        await self._slow()
        return False

    async def read_many(self, paths: Sequence[str], *, max_bytes: int | None = None) -> dict[str, Any]:
        await self._slow()
        return {}

    async def read_file_beneath(self, directory: str, path: str, *, max_bytes: int | None = None) -> bytes:
        await self._slow()
        return b""

    async def list_stats(self, path: str = "") -> list[FileStat]:
        await self._slow()
        return []

    async def upload_file(self, local_path: str, path: str) -> None:
        await self._slow()

    async def download_file(self, path: str, local_path: str) -> None:
        await self._slow()

    async def open_upload(self, path: str, *, part_size: int, **attributes: Any) -> UploadStream | None:
        await self._slow()
        return _SlowUpload()

    async def setup(self) -> None:
        await self._slow()

    async def probe(self) -> None:
        await self._slow()

    async def get_info(self) -> dict[str, Any]:
        return {}


# Arguments for each public coroutine method, by parameter name.
_ARGS: dict[str, Any] = {
    "path": "a.txt", "content": b"x", "src": "a.txt", "dest": "b.txt", "pattern": "x",
    "start": 0, "end": 1, "buffer": memoryview(bytearray(4)), "paths": ["a.txt"],
    "directory": "", "local_path": "/nonexistent/agentvfs-test", "part_size": 1 << 20,
    "version": "v1", "ticket": {"bucket": "b", "key": "k", "upload_id": "u"},
    "attrs": PosixAttributes(mode=0o100644),
}

# Not under a deadline, on purpose: cutting them short would leak what they release.
_UNGUARDED = {"destroy", "get_info"}
# Hooks that ``init`` and ``destroy`` of the filesystem itself run; a wrapper's are never run.
_HOOKS = {"setup", "teardown"}


def _coroutine_methods(cls: type) -> list[str]:
    return sorted(
        name for name, fn in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_")
    )


def _call(fs: Any, name: str) -> Any:
    params = inspect.signature(getattr(type(fs), name)).parameters
    args = [_ARGS[p.name] for p in params.values() if p.name != "self" and p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kwargs = {p.name: _ARGS[p.name] for p in params.values() if p.kind is p.KEYWORD_ONLY
              and p.default is p.empty}
    return getattr(fs, name)(*args, **kwargs)


def test_the_wrapper_forwards_nothing_implicitly() -> None:
    assert "__getattr__" not in vars(WrapperFilesystem)
    assert not hasattr(TimeoutFilesystem(LocalFilesystem("/tmp"), 100), "base_path")


def test_every_operation_of_the_contract_is_delegated() -> None:
    # Every public method of the filesystem contract is the wrapper's own, not the base's.
    for name in set(_coroutine_methods(WorkspaceFilesystem)) - _HOOKS:
        assert name in vars(WrapperFilesystem), name


# Every operation the slow filesystem has, optional groups included: whatever of them a
# wrapper exposes, however it exposes it, must keep the deadline.
@pytest.mark.parametrize("name", sorted(set(_coroutine_methods(SlowFilesystem)) - _HOOKS))
async def test_every_operation_has_a_deadline(name: str) -> None:
    if name in _UNGUARDED:
        pytest.skip(f"{name} is documented to run without a deadline")
    fs = TimeoutFilesystem(SlowFilesystem(), 50)
    if not hasattr(fs, name):
        pytest.skip(f"a wrapper does not offer {name}")
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"operation .* timed out after 50ms"):
        await _call(fs, name)
    assert time.monotonic() - began < SLOW / 2


async def test_a_streamed_upload_has_a_deadline_on_each_step() -> None:
    slow = SlowFilesystem()

    async def quick_open(path: str, *, part_size: int, **attributes: Any) -> UploadStream:
        return _SlowUpload()

    slow.open_upload = quick_open  # type: ignore[method-assign]
    fs = TimeoutFilesystem(slow, 50)
    upload = await fs.open_upload("a.bin", part_size=1 << 20)
    assert upload is not None
    with pytest.raises(TimeoutError, match="upload write"):
        await upload.write(b"x")
    with pytest.raises(TimeoutError, match="upload commit"):
        await upload.commit()
    await upload.abort()


async def test_capabilities_and_description_are_the_inner_filesystems() -> None:
    inner = FsspecFilesystem(
        MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/w",
        display_name="Data", description="the data", icon="folder", text_extensions=["foo"],
    )
    fs = TimeoutFilesystem(inner, 1000)
    assert fs.capabilities is inner.capabilities
    assert (fs.display_name, fs.description, fs.icon) == ("Data", "the data", "folder")
    assert fs.text_extensions == inner.text_extensions
    await fs.write_file("a.txt", "hello")
    assert (fs.status, fs.error) == ("ready", None)
    assert await fs.read_file("a.txt", encoding="utf-8") == "hello"
    assert [s.name for s in await fs.list_stats("")] == ["a.txt"]


async def test_a_wrapper_keeps_the_storage_location(tmp_path: Any) -> None:
    # Read-before-write is remembered per storage location: a wrapped filesystem must not
    # share one with every other filesystem of its provider.
    local = LocalFilesystem(str(tmp_path))
    assert TimeoutFilesystem(local, 1000).location == local.location == str(tmp_path)


async def test_a_wrapper_never_hands_out_descriptors(tmp_path: Any) -> None:
    # The kernel reads a passed-through descriptor itself, beyond any deadline; a wrapped
    # local filesystem is served through the wrapper instead.
    local = LocalFilesystem(str(tmp_path))
    assert isinstance(local, SupportsLocalFiles)
    assert not isinstance(TimeoutFilesystem(local, 1000), SupportsLocalFiles)


async def test_open_upload_of_an_inner_without_streaming_is_none() -> None:
    inner = CompositeFilesystem({"/m": FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/m")})
    assert not isinstance(inner, SupportsStreamingUpload)
    fs = TimeoutFilesystem(inner, 1000)
    assert await fs.open_upload("m/a.bin", part_size=1 << 20) is None
