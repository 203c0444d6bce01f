"""The storage contract (``Backend``) itself: version guards, object metadata, byte ranges,
the error table, and what ``BackendFilesystem`` adds over it. The conformance suite runs
through ``BackendFilesystem(MemoryBackend())`` in ``test_conformance.py``."""

from __future__ import annotations

import errno
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from agentvfs.errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileExists,
    FileNotFound,
    FilesystemError,
    FileTooLarge,
    IsDirectory,
    NameTooLongError,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
)
from agentvfs.vfs import (
    Backend,
    BackendFilesystem,
    ByteRange,
    FileStat,
    KnownVersions,
    MemoryBackend,
    SupportsBatchRead,
    SupportsTreeWalk,
    Version,
    WriteMode,
    translate,
    translated,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_guarded_write_is_a_compare_and_swap() -> None:
    backend = MemoryBackend()
    first = await backend.write("a.txt", b"v1")
    second = await backend.write("a.txt", b"v2", guard=Version.of(first))
    assert second.etag != first.etag
    with pytest.raises(StaleFileError) as info:
        await backend.write("a.txt", b"lost", guard=Version.of(first))
    assert info.value.errno == errno.ESTALE
    assert await backend.read("a.txt") == b"v2"
    # A guard on a file that is gone fails too: the writer expected to replace something.
    await backend.delete("a.txt")
    with pytest.raises(StaleFileError):
        await backend.write("a.txt", b"x", guard=Version.of(second))


async def test_of_many_guarded_writers_of_one_version_exactly_one_wins() -> None:
    backend = MemoryBackend()
    seen = await backend.write("n.txt", b"0")
    outcomes: list[str] = []

    async def writer(i: int) -> None:
        try:
            await backend.write("n.txt", f"{i}".encode(), guard=Version.of(seen))
            outcomes.append("won")
        except StaleFileError:
            outcomes.append("stale")

    async with anyio.create_task_group() as tg:
        for i in range(1, 21):
            tg.start_soon(writer, i)
    assert sorted(outcomes) == ["stale"] * 19 + ["won"]


async def test_create_mode_refuses_an_existing_file() -> None:
    backend = MemoryBackend()
    await backend.write("a.txt", b"1", mode=WriteMode.CREATE)
    with pytest.raises(FileExists):
        await backend.write("a.txt", b"2", mode=WriteMode.CREATE)
    assert await backend.read("a.txt") == b"1"


async def test_object_metadata_is_kept_copied_and_replaced() -> None:
    backend = MemoryBackend()
    assert backend.capabilities.metadata
    await backend.write("a.sh", b"#!/bin/sh\n", metadata={"mode": "0755", "uid": "1000"})
    assert (await backend.stat("a.sh")).metadata == {"mode": "0755", "uid": "1000"}
    await backend.copy("a.sh", "b.sh")
    assert (await backend.stat("b.sh")).metadata == {"mode": "0755", "uid": "1000"}
    await backend.write("a.sh", b"new")
    assert (await backend.stat("a.sh")).metadata == {}  # a write replaces what it had


async def test_ranges() -> None:
    backend = MemoryBackend()
    await backend.write("r.bin", bytes(range(10)))
    assert await backend.read("r.bin", ByteRange(2, 5)) == bytes([2, 3, 4])
    assert await backend.read("r.bin", ByteRange(8)) == bytes([8, 9])
    assert await backend.read("r.bin", ByteRange(20, 30)) == b""
    for bad in ((-1, 2), (5, 2)):
        with pytest.raises(ValueError, match="invalid byte range"):
            ByteRange(*bad)
    fs = BackendFilesystem(backend)
    buffer = bytearray(4)
    assert await fs.read_range_into("r.bin", 7, memoryview(buffer)) == 3
    assert bytes(buffer[:3]) == bytes([7, 8, 9])


async def test_directories_and_their_errors() -> None:
    backend = MemoryBackend()
    with pytest.raises(DirectoryNotFound):
        await backend.write("d/a.txt", b"x")  # the parent must exist: no agent concept here
    await backend.make_dir("d")
    await backend.write("d/a.txt", b"x")
    with pytest.raises(DirectoryNotEmpty):
        await backend.remove_dir("d")
    with pytest.raises(NotDirectory):
        await backend.list("d/a.txt")
    with pytest.raises(NotDirectory):
        await backend.make_dir("d/a.txt/e")
    with pytest.raises(IsDirectory):
        await backend.read("d")
    with pytest.raises(FileNotFound):
        await backend.stat("nothing")
    assert sorted(s.name for s in await backend.list("")) == ["d"]


def test_a_version_needs_something_to_compare() -> None:
    with pytest.raises(ValueError, match="needs an etag or a modification time"):
        Version()
    moment = datetime(2026, 1, 1, tzinfo=UTC)

    def at(offset: timedelta, etag: str | None = None) -> FileStat:
        then = moment + offset
        return FileStat(name="x", path="x", type="file", size=0, created_at=then, modified_at=then, etag=etag)

    assert Version(None, moment).matches(at(timedelta(microseconds=300)))  # to the millisecond
    assert not Version(None, moment).matches(at(timedelta(milliseconds=2)))
    assert not Version("e1", moment).matches(at(timedelta(0), etag="e2"))  # the etag decides
    assert not Version("e1", None).matches(at(timedelta(0)))  # an etag expected, none found


async def test_known_versions_make_a_plain_time_exact() -> None:
    backend = MemoryBackend()
    first = await backend.write("k.txt", b"1")
    known = KnownVersions(limit=2)
    known.remember(first)
    guard = known.guard("k.txt", first.modified_at)
    assert guard.etag == first.etag
    for other in ("a", "b"):
        known.remember(await backend.write(other, b""))
    assert known.guard("k.txt", first.modified_at).etag is None  # forgotten beyond the limit


def test_the_error_table() -> None:
    assert isinstance(translate(FileNotFoundError(2, "x"), "p", "read"), FileNotFound)
    assert isinstance(translate(FileExistsError(17, "x"), "p", "write"), FileExists)
    assert isinstance(translate(IsADirectoryError(21, "x"), "p", "read"), IsDirectory)
    assert isinstance(translate(NotADirectoryError(20, "x"), "p", "list"), NotDirectory)
    denied = translate(PermissionError(13, "x"), "p", "write_file")
    assert isinstance(denied, PermissionDenied) and str(denied) == "Permission denied: write_file on p"
    assert isinstance(translate(OSError(errno.ENOTEMPTY, "x"), "p", "rmdir"), DirectoryNotEmpty)
    assert isinstance(translate(OSError(errno.ENAMETOOLONG, "x"), "p", "write"), NameTooLongError)
    other = translate(OSError(errno.ENOSPC, "disk full"), "p", "write_file")
    assert type(other) is FilesystemError and other.errno == errno.ENOSPC and other.code == "ENOSPC"
    assert "write_file failed on p" in str(other)
    unknown = translate(RuntimeError("boom"), "p", "stat")
    assert unknown.errno == errno.EIO
    with pytest.raises(FileNotFound) as info, translated("p", "read"):
        raise FileNotFoundError(2, "x")
    assert isinstance(info.value.__cause__, FileNotFoundError)


async def test_the_filesystem_layer_adds_the_agent_semantics() -> None:
    backend = MemoryBackend()
    fs = BackendFilesystem(backend, read_only=False)
    assert fs.backend is backend and fs.provider == "memory" and fs.capabilities is backend.capabilities
    await fs.write_file("/deep/er/a.txt", "x")  # parents made, the leading / is the root
    assert (await backend.stat("deep/er")).type == "directory"
    with pytest.raises(PermissionDenied):
        await fs.read_file("../outside")
    with pytest.raises(FileNotFound, match=r"^File not found: /deep/er/missing\.txt$"):
        await fs.read_file("/deep/er/missing.txt")  # named as the caller wrote it
    await fs.move_file("deep/er/a.txt", "moved/a.txt")
    assert await fs.read_file("moved/a.txt", encoding="utf-8") == "x"
    with pytest.raises(TypeError, match="backend must be a Backend"):
        BackendFilesystem(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Can't instantiate abstract class"):
        Backend()  # type: ignore[abstract]


@pytest.mark.parametrize("native", [True, False], ids=["native", "fallback"])
async def test_the_optional_groups_and_their_fallbacks_agree(native: bool) -> None:
    from test_conformance import SevenOperations

    backend: Backend = MemoryBackend() if native else SevenOperations()
    assert isinstance(backend, SupportsBatchRead) == native
    assert isinstance(backend, SupportsTreeWalk) == native
    fs = BackendFilesystem(backend)
    await fs.write_file("d/a.txt", "alpha")
    await fs.write_file("d/e/b.txt", "b" * 100)
    await fs.write_file("d/.hidden/c.txt", "c")
    await fs.mkdir("d/empty")
    walked = [(e.name, e.type) for e in await fs.walk("d")]
    assert walked == [
        (".hidden", "directory"), (".hidden/c.txt", "file"), ("a.txt", "file"),
        ("e", "directory"), ("e/b.txt", "file"), ("empty", "directory"),
    ]  # fmt: skip
    assert [e.name for e in await fs.walk("d", include_hidden=False)] == ["a.txt", "e", "e/b.txt", "empty"]
    assert [e.name for e in await fs.walk("d", max_depth=1)] == [".hidden", "a.txt", "e", "empty"]
    assert [s.name for s in await fs.list_stats("d")] == [".hidden", "a.txt", "e", "empty"]
    got = await fs.read_many(["d/a.txt", "/d/e/b.txt", "d/missing", "d/e", "../x"], max_bytes=50)
    assert got["d/a.txt"] == b"alpha"
    assert isinstance(got["/d/e/b.txt"], FileTooLarge)
    assert isinstance(got["d/missing"], FileNotFound) and str(got["d/missing"]) == "File not found: d/missing"
    assert isinstance(got["d/e"], IsADirectoryError)
    assert isinstance(got["../x"], PermissionDenied)
    with pytest.raises(NotDirectory):
        await fs.walk("d/a.txt")


async def test_two_spellings_of_one_file_in_one_batch_both_get_an_answer() -> None:
    fs = BackendFilesystem(MemoryBackend())
    await fs.write_file("a.txt", "x")
    got = await fs.read_many(["a.txt", "/a.txt", "./missing", "missing"])
    assert (got["a.txt"], got["/a.txt"]) == (b"x", b"x")
    assert str(got["./missing"]) == "File not found: ./missing"
    assert str(got["missing"]) == "File not found: missing"
