"""The conformance suite every workspace filesystem must pass.

Subclass :class:`FilesystemTests` and provide a ``harness`` fixture (see
:mod:`agentvfs.testing`); each test uses the harness's oracle to check what really reached
the storage.
"""

from __future__ import annotations

import errno
from datetime import datetime

import pytest

from ..errors import (
    DirectoryNotEmpty,
    DirectoryNotFound,
    FileDecodeError,
    FileExists,
    FileNotFound,
    InvalidPathError,
    IsDirectory,
    NameTooLongError,
    NotDirectory,
    PermissionDenied,
    StaleFileError,
    WorkspaceReadOnlyError,
)
from ..vfs import SupportsGrep, SupportsWalk, list_stats, walk_stats
from ._harness import Harness

__all__ = ["FilesystemTests"]


class FilesystemTests:
    """Every operation, error type and errno of the workspace filesystem contract."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def harness(self) -> Harness:
        raise NotImplementedError("provide a harness fixture in the backend's test class")

    # -- read ---------------------------------------------------------------------------------

    async def test_read_roundtrip(self, harness: Harness) -> None:
        harness.put("r/a.txt", b"Hello World\nsecond line\n")
        assert await harness.fs.read_file(harness.p("r/a.txt")) == b"Hello World\nsecond line\n"
        assert await harness.fs.read_file(harness.p("r/a.txt"), encoding="utf-8") == "Hello World\nsecond line\n"

    async def test_read_missing(self, harness: Harness) -> None:
        with pytest.raises(FileNotFoundError) as info:
            await harness.fs.read_file(harness.p("nope.txt"))
        assert isinstance(info.value, FileNotFound)
        assert info.value.errno == errno.ENOENT
        assert info.value.code == "ENOENT"
        assert str(info.value) == f"File not found: {harness.inner('nope.txt')}"

    async def test_read_directory(self, harness: Harness) -> None:
        harness.put("d/x.txt", b"x")
        with pytest.raises(IsADirectoryError) as info:
            await harness.fs.read_file(harness.p("d"))
        assert isinstance(info.value, IsDirectory)
        assert info.value.errno == errno.EISDIR
        assert str(info.value) == f"Path is a directory: {harness.inner('d')}"

    async def test_read_non_utf8_as_text(self, harness: Harness) -> None:
        harness.put("bin.dat", b"\xff\xfeok")
        with pytest.raises(ValueError, match="not valid utf-8 text") as info:
            await harness.fs.read_file(harness.p("bin.dat"), encoding="utf-8")
        assert isinstance(info.value, FileDecodeError)
        assert await harness.fs.read_file(harness.p("bin.dat")) == b"\xff\xfeok"

    # -- write --------------------------------------------------------------------------------

    async def test_write_creates_parents(self, harness: Harness) -> None:
        await harness.fs.write_file(harness.p("n1/n2/new.txt"), "New content")
        assert harness.get("n1/n2/new.txt") == b"New content"
        assert harness.isdir("n1/n2")
        assert (await harness.fs.stat(harness.p("n1"))).type == "directory"

    async def test_write_text_is_utf8(self, harness: Harness) -> None:
        await harness.fs.write_file(harness.p("u.txt"), "héllo")
        assert harness.get("u.txt") == "héllo".encode()

    async def test_write_overwrites_by_default(self, harness: Harness) -> None:
        harness.put("o.txt", b"old")
        await harness.fs.write_file(harness.p("o.txt"), b"new")
        assert harness.get("o.txt") == b"new"

    async def test_write_exclusive_refuses_existing(self, harness: Harness) -> None:
        harness.put("a.txt", b"keep me")
        with pytest.raises(FileExistsError) as info:
            await harness.fs.write_file(harness.p("a.txt"), b"other", overwrite=False)
        assert isinstance(info.value, FileExists)
        assert info.value.errno == errno.EEXIST
        assert str(info.value) == f"File already exists: {harness.inner('a.txt')}"
        assert harness.get("a.txt") == b"keep me"

    async def test_write_exclusive_creates_new(self, harness: Harness) -> None:
        await harness.fs.write_file(harness.p("fresh.txt"), b"1", overwrite=False)
        assert harness.get("fresh.txt") == b"1"

    async def test_write_without_recursive_needs_parent(self, harness: Harness) -> None:
        with pytest.raises(FileNotFoundError) as info:
            await harness.fs.write_file(harness.p("nodir/x.txt"), b"x", recursive=False)
        assert isinstance(info.value, DirectoryNotFound)
        assert str(info.value) == f"Directory not found: {harness.inner('nodir')}"
        assert harness.get("nodir/x.txt") is None

    async def test_write_under_a_file(self, harness: Harness) -> None:
        harness.put("plain.txt", b"data")
        with pytest.raises(NotADirectoryError) as info:
            await harness.fs.write_file(harness.p("plain.txt/child.txt"), b"x")
        assert isinstance(info.value, NotDirectory)
        assert info.value.errno == errno.ENOTDIR
        assert harness.get("plain.txt") == b"data"

    async def test_write_onto_directory(self, harness: Harness) -> None:
        await harness.fs.mkdir(harness.p("adir"))
        with pytest.raises(IsADirectoryError):
            await harness.fs.write_file(harness.p("adir"), b"x")
        assert harness.isdir("adir")

    async def test_write_stale_expected_mtime(self, harness: Harness) -> None:
        harness.put("s.txt", b"v1")
        seen = await harness.fs.stat(harness.p("s.txt"))
        harness.put("s.txt", b"v2 changed outside")
        with pytest.raises(StaleFileError) as info:
            await harness.fs.write_file(harness.p("s.txt"), b"mine", expected_mtime=seen)
        assert info.value.errno == errno.ESTALE
        assert str(info.value).startswith(f"File was modified externally: {harness.inner('s.txt')} (expected mtime ")
        assert harness.get("s.txt") == b"v2 changed outside"
        fresh = await harness.fs.stat(harness.p("s.txt"))
        await harness.fs.write_file(harness.p("s.txt"), b"mine", expected_mtime=fresh)
        assert harness.get("s.txt") == b"mine"

    async def test_write_stale_with_plain_datetime(self, harness: Harness) -> None:
        harness.put("t.txt", b"v1")
        seen = await harness.fs.stat(harness.p("t.txt"))
        assert isinstance(seen.modified_at, datetime)
        harness.put("t.txt", b"v2 changed outside")
        with pytest.raises(StaleFileError):
            await harness.fs.write_file(harness.p("t.txt"), b"mine", expected_mtime=seen.modified_at)
        assert harness.get("t.txt") == b"v2 changed outside"

    async def test_write_expected_mtime_missing_file_proceeds(self, harness: Harness) -> None:
        harness.put("gone.txt", b"v1")
        seen = await harness.fs.stat(harness.p("gone.txt"))
        await harness.fs.delete_file(harness.p("gone.txt"))
        await harness.fs.write_file(harness.p("gone.txt"), b"back", expected_mtime=seen)
        assert harness.get("gone.txt") == b"back"

    async def test_write_rejects_non_bytes(self, harness: Harness) -> None:
        with pytest.raises(TypeError, match="content must be str or bytes"):
            await harness.fs.write_file(harness.p("x.txt"), 123)  # type: ignore[arg-type]

    async def test_append(self, harness: Harness) -> None:
        await harness.fs.append_file(harness.p("log/l.txt"), "one\n")
        await harness.fs.append_file(harness.p("log/l.txt"), b"two\n")
        assert harness.get("log/l.txt") == b"one\ntwo\n"

    # -- delete -------------------------------------------------------------------------------

    async def test_delete_file(self, harness: Harness) -> None:
        harness.put("del/a.txt", b"a")
        await harness.fs.delete_file(harness.p("del/a.txt"))
        assert harness.get("del/a.txt") is None
        # The directory stays, as on a disk, even when it held only that file.
        assert await harness.fs.exists(harness.p("del"))
        assert await harness.fs.readdir(harness.p("del")) == []

    async def test_delete_missing(self, harness: Harness) -> None:
        with pytest.raises(FileNotFound) as info:
            await harness.fs.delete_file(harness.p("nope.txt"))
        assert info.value.errno == errno.ENOENT
        await harness.fs.delete_file(harness.p("nope.txt"), force=True)

    async def test_delete_directory_refused(self, harness: Harness) -> None:
        harness.put("dd/a.txt", b"a")
        with pytest.raises(IsDirectory):
            await harness.fs.delete_file(harness.p("dd"))
        assert harness.get("dd/a.txt") == b"a"

    # -- directories --------------------------------------------------------------------------

    async def test_mkdir_empty_persists(self, harness: Harness) -> None:
        await harness.fs.mkdir(harness.p("m/a/b"))
        assert harness.isdir("m/a/b")
        assert await harness.fs.exists(harness.p("m/a/b"))
        assert (await harness.fs.stat(harness.p("m/a/b"))).type == "directory"
        assert [e.name for e in await harness.fs.readdir(harness.p("m/a"))] == ["b"]
        assert await harness.fs.readdir(harness.p("m/a/b")) == []
        await harness.fs.mkdir(harness.p("m/a/b"))  # an existing directory is fine

    async def test_mkdir_over_file(self, harness: Harness) -> None:
        harness.put("f.txt", b"x")
        with pytest.raises(FileExists):
            await harness.fs.mkdir(harness.p("f.txt"))
        assert harness.get("f.txt") == b"x"

    async def test_mkdir_not_recursive(self, harness: Harness) -> None:
        with pytest.raises(DirectoryNotFound) as info:
            await harness.fs.mkdir(harness.p("x/y"), recursive=False)
        assert str(info.value) == f"Directory not found: {harness.inner('x')}"
        await harness.fs.mkdir(harness.p("x"), recursive=False)
        await harness.fs.mkdir(harness.p("x/y"), recursive=False)
        assert harness.isdir("x/y")

    async def test_rmdir(self, harness: Harness) -> None:
        await harness.fs.mkdir(harness.p("e"))
        await harness.fs.rmdir(harness.p("e"))
        assert not await harness.fs.exists(harness.p("e"))

    async def test_rmdir_not_empty(self, harness: Harness) -> None:
        harness.put("full/a.txt", b"a")
        with pytest.raises(OSError) as info:
            await harness.fs.rmdir(harness.p("full"))
        assert isinstance(info.value, DirectoryNotEmpty)
        assert info.value.errno == errno.ENOTEMPTY
        assert str(info.value) == f"Directory not empty: {harness.inner('full')}"
        assert harness.get("full/a.txt") == b"a"
        await harness.fs.rmdir(harness.p("full"), recursive=True)
        assert harness.get("full/a.txt") is None
        assert not await harness.fs.exists(harness.p("full"))

    async def test_rmdir_keeps_parent(self, harness: Harness) -> None:
        harness.put("keep/sub/a.txt", b"a")
        await harness.fs.rmdir(harness.p("keep/sub"), recursive=True)
        assert await harness.fs.exists(harness.p("keep"))

    async def test_rmdir_missing_and_file(self, harness: Harness) -> None:
        with pytest.raises(DirectoryNotFound):
            await harness.fs.rmdir(harness.p("nope"))
        await harness.fs.rmdir(harness.p("nope"), force=True)
        harness.put("file.txt", b"x")
        with pytest.raises(NotDirectory):
            await harness.fs.rmdir(harness.p("file.txt"))

    # -- listing and metadata -----------------------------------------------------------------

    async def test_readdir(self, harness: Harness) -> None:
        harness.put("ls/b.txt", b"bb")
        harness.put("ls/a.md", b"a")
        harness.put("ls/sub/c.ts", b"ccc")
        entries = await harness.fs.readdir(harness.p("ls"))
        assert [(e.name, e.type) for e in entries] == [("a.md", "file"), ("b.txt", "file"), ("sub", "directory")]
        assert {e.name: e.size for e in entries if e.type == "file"} == {"a.md": 1, "b.txt": 2}

    async def test_readdir_recursive(self, harness: Harness) -> None:
        harness.put("rr/d/f.txt", b"f")
        harness.put("rr/d/e/g.ts", b"g")
        harness.put("rr/top.ts", b"t")
        entries = await harness.fs.readdir(harness.p("rr"), recursive=True)
        assert [(e.name, e.type) for e in entries] == [
            ("d", "directory"), ("d/e", "directory"), ("d/e/g.ts", "file"),
            ("d/f.txt", "file"), ("top.ts", "file"),
        ]
        only_ts = await harness.fs.readdir(harness.p("rr"), recursive=True, extension="ts")
        assert [e.name for e in only_ts if e.type == "file"] == ["d/e/g.ts", "top.ts"]
        shallow = await harness.fs.readdir(harness.p("rr"), recursive=True, max_depth=1)
        assert [e.name for e in shallow] == ["d", "top.ts"]

    async def test_readdir_errors(self, harness: Harness) -> None:
        with pytest.raises(DirectoryNotFound) as info:
            await harness.fs.readdir(harness.p("nope"))
        assert str(info.value) == f"Directory not found: {harness.inner('nope')}"
        harness.put("plain.md", b"x")
        with pytest.raises(NotDirectory):
            await harness.fs.readdir(harness.p("plain.md"))

    async def test_stat(self, harness: Harness) -> None:
        harness.put("st/f.txt", b"hello")
        stat = await harness.fs.stat(harness.p("st/f.txt"))
        assert (stat.name, stat.type, stat.size, stat.mime_type) == ("f.txt", "file", 5, "text/plain")
        assert stat.path.endswith("st/f.txt")
        assert stat.modified_at.tzinfo is not None
        directory = await harness.fs.stat(harness.p("st"))
        assert (directory.name, directory.type, directory.mime_type) == ("st", "directory", None)
        with pytest.raises(FileNotFound):
            await harness.fs.stat(harness.p("st/none"))
        assert not await harness.fs.exists(harness.p("st/none"))
        assert await harness.fs.exists(harness.p("st/f.txt"))

    # -- copy and move --------------------------------------------------------------------------

    async def test_copy_file(self, harness: Harness) -> None:
        harness.put("c/a.txt", b"abc")
        await harness.fs.copy_file(harness.p("c/a.txt"), harness.p("c2/deep/b.txt"))
        assert harness.get("c2/deep/b.txt") == b"abc"
        assert harness.get("c/a.txt") == b"abc"
        harness.put("c/other.txt", b"other")
        with pytest.raises(FileExists):
            await harness.fs.copy_file(harness.p("c/a.txt"), harness.p("c/other.txt"), overwrite=False)
        assert harness.get("c/other.txt") == b"other"
        with pytest.raises(FileNotFound):
            await harness.fs.copy_file(harness.p("c/none.txt"), harness.p("c/x.txt"))

    async def test_copy_tree(self, harness: Harness) -> None:
        harness.put("t/a.txt", b"a")
        harness.put("t/s/b.txt", b"b")
        with pytest.raises(IsDirectory):
            await harness.fs.copy_file(harness.p("t"), harness.p("t2"))
        await harness.fs.copy_file(harness.p("t"), harness.p("t2"), recursive=True)
        assert harness.get("t2/a.txt") == b"a"
        assert harness.get("t2/s/b.txt") == b"b"

    async def test_move_file(self, harness: Harness) -> None:
        harness.put("mv/a.txt", b"abc")
        await harness.fs.move_file(harness.p("mv/a.txt"), harness.p("mv2/b.txt"))
        assert harness.get("mv2/b.txt") == b"abc"
        assert harness.get("mv/a.txt") is None
        assert await harness.fs.exists(harness.p("mv"))
        harness.put("mv/c.txt", b"c")
        with pytest.raises(FileExists):
            await harness.fs.move_file(harness.p("mv/c.txt"), harness.p("mv2/b.txt"), overwrite=False)
        assert harness.get("mv/c.txt") == b"c"
        assert harness.get("mv2/b.txt") == b"abc"
        with pytest.raises(FileNotFound):
            await harness.fs.move_file(harness.p("mv/none"), harness.p("mv/x"))

    async def test_move_directory(self, harness: Harness) -> None:
        harness.put("md/a.txt", b"a")
        harness.put("md/s/b.txt", b"b")
        await harness.fs.move_file(harness.p("md"), harness.p("md2"))
        assert harness.get("md2/s/b.txt") == b"b"
        assert not await harness.fs.exists(harness.p("md"))

    async def test_move_directory_made_by_mkdir(self, harness: Harness) -> None:
        # On object stores such a directory has a marker object of its own ("dir/").
        await harness.fs.mkdir(harness.p("made"))
        await harness.fs.mkdir(harness.p("made/empty"))
        await harness.fs.write_file(harness.p("made/f.txt"), b"f")
        await harness.fs.move_file(harness.p("made"), harness.p("made2"))
        assert harness.get("made2/f.txt") == b"f"
        assert harness.isdir("made2/empty")
        assert not await harness.fs.exists(harness.p("made"))
        names = [e.name for e in await harness.fs.readdir(harness.p("made2"), recursive=True)]
        assert names == ["empty", "f.txt"]

    async def test_onto_itself_keeps_the_file(self, harness: Harness) -> None:
        harness.put("same/a.txt", b"data")
        await harness.fs.move_file(harness.p("same/a.txt"), harness.p("same/./a.txt"))
        await harness.fs.copy_file(harness.p("same/a.txt"), harness.p("same/a.txt"))
        assert harness.get("same/a.txt") == b"data"
        with pytest.raises(FileExists):
            await harness.fs.move_file(harness.p("same/a.txt"), harness.p("same/a.txt"), overwrite=False)
        with pytest.raises(FileExists):
            await harness.fs.copy_file(harness.p("same/a.txt"), harness.p("same/a.txt"), overwrite=False)
        assert harness.get("same/a.txt") == b"data"

    async def test_move_directory_into_itself_refused(self, harness: Harness) -> None:
        harness.put("a/f1.txt", b"1")
        harness.put("a/sub/f2.txt", b"2")
        with pytest.raises(PermissionError, match="cannot move a directory into itself"):
            await harness.fs.move_file(harness.p("a"), harness.p("a/b"))
        assert harness.get("a/f1.txt") == b"1"
        assert harness.get("a/sub/f2.txt") == b"2"

    async def test_move_below_a_file(self, harness: Harness) -> None:
        harness.put("f", b"file")
        with pytest.raises(NotDirectory):
            await harness.fs.move_file(harness.p("f"), harness.p("f/x"))
        assert harness.get("f") == b"file"

    async def test_below_a_file_is_missing(self, harness: Harness) -> None:
        harness.put("leaf", b"file")
        with pytest.raises(DirectoryNotFound):
            await harness.fs.readdir(harness.p("leaf/x"))
        with pytest.raises(DirectoryNotFound):
            await harness.fs.write_file(harness.p("leaf/x/y.txt"), b"y", recursive=False)

    async def test_empty_root_lists_empty(self, harness: Harness) -> None:
        if harness.prefix:
            pytest.skip("a composite's root lists its mount points")
        assert await harness.fs.readdir("") == []
        assert await harness.fs.readdir("", recursive=True) == []
        assert (await harness.fs.stat("")).type == "directory"

    # -- paths ----------------------------------------------------------------------------------

    async def test_escape_refused(self, harness: Harness) -> None:
        harness.put("esc.txt", b"inside")
        for bad in ("../x.txt", "a/../../x.txt", "../../../../etc/passwd"):
            if harness.prefix:
                # A composite clamps ".." at its own root, where no mount lives.
                with pytest.raises(FileNotFoundError, match="No mount for path"):
                    await harness.fs.read_file(harness.p(bad))
                continue
            with pytest.raises(PermissionError) as info:
                await harness.fs.read_file(bad)
            assert isinstance(info.value, PermissionDenied)
            assert info.value.errno == errno.EACCES

    async def test_escape_message(self, harness: Harness) -> None:
        if harness.prefix:
            pytest.skip("a composite routes '..' before the mount sees it")
        with pytest.raises(PermissionDenied) as info:
            await harness.fs.write_file("../x.txt", b"x")
        assert str(info.value) == "Permission denied: access on ../x.txt"

    async def test_normalised_paths_name_one_file(self, harness: Harness) -> None:
        harness.put("norm/a.txt", b"a")
        for alias in ("norm/a.txt", "./norm/a.txt", "norm//a.txt", "norm/x/../a.txt"):
            assert await harness.fs.read_file(harness.p(alias)) == b"a"

    async def test_nul_byte(self, harness: Harness) -> None:
        with pytest.raises(InvalidPathError) as info:
            await harness.fs.write_file(harness.p("a\0b.txt"), b"x")
        assert info.value.errno == errno.EINVAL
        assert isinstance(info.value, ValueError)

    async def test_name_too_long(self, harness: Harness) -> None:
        with pytest.raises(NameTooLongError) as info:
            await harness.fs.write_file(harness.p("x" * 256), b"x")
        assert info.value.errno == errno.ENAMETOOLONG
        await harness.fs.write_file(harness.p("y" * 200), b"ok")
        assert harness.get("y" * 200) == b"ok"

    async def test_staging_files_never_listed(self, harness: Harness) -> None:
        for i in range(5):
            await harness.fs.write_file(harness.p(f"stg/f{i}.txt"), b"x" * i)
        names = [e.name for e in await harness.fs.readdir(harness.p("stg"))]
        assert names == [f"f{i}.txt" for i in range(5)]

    # -- read-only --------------------------------------------------------------------------------

    async def test_read_only(self, harness: Harness) -> None:
        harness.put("ro/a.txt", b"a")
        ro = harness.reopen(read_only=True)
        assert ro.read_only
        assert await ro.read_file(harness.p("ro/a.txt")) == b"a"
        assert [e.name for e in await ro.readdir(harness.p("ro"))] == ["a.txt"]
        writes = [
            ("write_file", ro.write_file(harness.p("ro/a.txt"), b"b")),
            ("append_file", ro.append_file(harness.p("ro/a.txt"), b"b")),
            ("delete_file", ro.delete_file(harness.p("ro/a.txt"))),
            ("mkdir", ro.mkdir(harness.p("ro/new"))),
            ("rmdir", ro.rmdir(harness.p("ro"), recursive=True)),
            ("copy_file", ro.copy_file(harness.p("ro/a.txt"), harness.p("ro/b.txt"))),
            ("move_file", ro.move_file(harness.p("ro/a.txt"), harness.p("ro/b.txt"))),
        ]
        for op, call in writes:
            with pytest.raises(OSError) as info:
                await call
            assert info.value.errno in (errno.EROFS, errno.EACCES), op
            assert isinstance(info.value, (WorkspaceReadOnlyError, PermissionDenied)), op
        assert harness.get("ro/a.txt") == b"a"
        assert harness.get("ro/b.txt") is None

    # -- capabilities -----------------------------------------------------------------------------------

    async def test_walk(self, harness: Harness) -> None:
        if not isinstance(harness.fs, SupportsWalk):
            pytest.skip("no native walk")
        harness.put("w/a.txt", b"a")
        harness.put("w/.hidden/b.txt", b"b")
        harness.put("w/s/.c.txt", b"c")
        everything = [e.name for e in await harness.fs.walk(harness.p("w"))]
        assert everything == [".hidden", ".hidden/b.txt", "a.txt", "s", "s/.c.txt"]
        visible = [e.name for e in await harness.fs.walk(harness.p("w"), include_hidden=False)]
        assert visible == ["a.txt", "s"]

    async def test_walk_stats(self, harness: Harness) -> None:
        harness.put("ws/a.txt", b"a")
        harness.put("ws/s/b.txt", b"bb")
        harness.put("ws/s/t/c.txt", b"ccc")
        harness.put("ws/.h/d.txt", b"dddd")
        found = dict(await walk_stats(harness.fs, harness.p("ws")))
        assert sorted(found) == [".h/d.txt", "a.txt", "s/b.txt", "s/t/c.txt"]
        assert {name: stat.size for name, stat in found.items()} == {
            ".h/d.txt": 4, "a.txt": 1, "s/b.txt": 2, "s/t/c.txt": 3,
        }  # fmt: skip
        # The same metadata a listing of each directory gives (the one listing of the tree
        # must not show other sizes, times or versions).
        for name, stat in found.items():
            parent, _, base = name.rpartition("/")
            listed = {
                s.name: s for s in await list_stats(harness.fs, harness.p(f"ws/{parent}" if parent else "ws"))
            }
            twin = listed[base]
            assert (stat.type, stat.size, stat.modified_at, stat.etag) == (
                twin.type, twin.size, twin.modified_at, twin.etag,
            ), name  # fmt: skip
        assert dict(await walk_stats(harness.fs, harness.p("ws"), max_depth=2)).keys() == {
            ".h/d.txt", "a.txt", "s/b.txt",
        }  # fmt: skip
        with pytest.raises(FileNotFoundError):
            await walk_stats(harness.fs, harness.p("absent-dir"))

    async def test_grep(self, harness: Harness) -> None:
        if not isinstance(harness.fs, SupportsGrep):
            pytest.skip("no native grep")
        harness.put("g/a.ts", b"one\n// TODO fix\nthree TODO\n")
        harness.put("g/b.md", b"nothing here\n")
        harness.put("g/img.png", b"TODO png")
        results = await harness.fs.grep("TODO", harness.p("g"), context_lines=1)
        assert [r.path.rsplit("/", 1)[-1] for r in results] == ["a.ts"]
        first = results[0].matches[0]
        assert (first.line, first.column, first.text, first.before, first.after) == (
            2, 3, "// TODO fix", ("one",), ("three TODO",)
        )
        capped = await harness.fs.grep("todo", harness.p("g"), case_sensitive=False, max_count_per_file=1)
        assert [len(r.matches) for r in capped] == [1]
