"""The error tree, the public names, the blocking facade and the demo command."""

from __future__ import annotations

import errno
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

import agentvfs
from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace, errors


def test_messages_codes_and_builtins() -> None:
    cases: list[tuple[Any, type[BaseException], int, str, str]] = [
        (errors.FileNotFound("a.txt"), FileNotFoundError, errno.ENOENT, "ENOENT", "File not found: a.txt"),
        (errors.DirectoryNotFound("d"), FileNotFoundError, errno.ENOENT, "ENOENT", "Directory not found: d"),
        (errors.FileExists("a"), FileExistsError, errno.EEXIST, "EEXIST", "File already exists: a"),
        (errors.IsDirectory("d"), IsADirectoryError, errno.EISDIR, "EISDIR", "Path is a directory: d"),
        (errors.NotDirectory("f"), NotADirectoryError, errno.ENOTDIR, "ENOTDIR", "Path is not a directory: f"),
        (errors.DirectoryNotEmpty("d"), OSError, errno.ENOTEMPTY, "ENOTEMPTY", "Directory not empty: d"),
        (errors.PermissionDenied("../x", "access"), PermissionError, errno.EACCES, "EACCES", "Permission denied: access on ../x"),
        (errors.WorkspaceReadOnlyError("write_file"), OSError, errno.EROFS, "READ_ONLY", "Workspace is in read-only mode. Cannot perform: write_file"),
        (errors.FilesystemNotReadyError("fs1"), OSError, errno.EIO, "ENOTREADY", 'Filesystem "fs1" is not ready. Call init() first or use ensureReady().'),
        (errors.UnsupportedGrepPatternError("(?<=x)", "lookbehind"), ValueError, errno.EINVAL, "EUNSUPPORTED_PATTERN", "Unsupported grep pattern: (?<=x) (lookbehind)"),
    ]
    for err, builtin, number, code, message in cases:
        assert issubclass(type(err), builtin)
        assert err.errno == number
        assert err.code == code
        assert str(err) == message
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == message and copy.errno == number
    stale = errors.StaleFileError("s.txt", datetime(2026, 1, 2, 3, 4, 5, 678000, UTC), datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC))
    assert str(stale) == "File was modified externally: s.txt (expected mtime 2026-01-02T03:04:05.678Z, actual 2026-01-02T03:04:06.000Z)"
    assert stale.errno == errno.ESTALE


def test_workspace_and_sandbox_errors() -> None:
    assert str(errors.SearchNotAvailableError()) == "Workspace does not have search configured (enable bm25 or provide vectorStore + embedder)"
    assert errors.SearchNotAvailableError().code == "NO_SEARCH"
    assert str(errors.WorkspaceNotReadyError("w", "destroyed")) == "Workspace is not ready (status: destroyed)"
    assert str(errors.SandboxTimeoutError(300)) == "Execution timed out after 300ms"
    assert isinstance(errors.SandboxTimeoutError(1), TimeoutError)
    assert str(errors.IsolationUnavailableError("bwrap", "not installed")) == "Isolation backend 'bwrap' is not available: not installed"
    # separate roots, as in the reference
    assert not issubclass(errors.FilesystemError, errors.WorkspaceError)
    assert not issubclass(errors.SandboxError, errors.WorkspaceError)
    assert pickle.loads(pickle.dumps(errors.WorkspaceNotReadyError("w", "x"))).code == "NOT_READY"


def test_public_names() -> None:
    # isort-style order (constants, then classes, then functions), as ruff keeps it
    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert agentvfs.__all__ == sorted(agentvfs.__all__, key=order)
    for name in agentvfs.__all__:
        obj = getattr(agentvfs, name)
        assert not getattr(obj, "__module__", "agentvfs").split(".")[-1].startswith("_"), name
    for name in ("Workspace", "RequestContext", "LocalFilesystem", "FsspecFilesystem", "CompositeFilesystem",
                 "WorkspaceError", "FilesystemError", "SandboxError", "WorkspaceReadOnlyError", "StaleFileError"):
        assert name in agentvfs.__all__
    assert set(errors.__all__) >= {n for n in agentvfs.__all__ if n.endswith("Error")}


def test_blocking_facade(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\nTODO\n")
    with Workspace(filesystem=LocalFilesystem(tmp_path, read_only=True)).blocking() as ws:
        assert ws.status == "ready"
        assert ws.filesystem.read_file("docs/a.md", encoding="utf-8") == "# A\nTODO\n"
        assert [e.name for e in ws.filesystem.readdir("docs")] == ["a.md"]
        assert ws.filesystem.stat("docs/a.md").size == 9
        assert [h.path for h in ws.filesystem.grep("TODO", "docs")] == ["docs/a.md"]
        with pytest.raises(errors.WorkspaceReadOnlyError):
            ws.filesystem.write_file("docs/b.md", "x")
        assert ws.get_info()["filesystem"]["read_only"] is True
    assert ws.workspace.status == "destroyed"


def test_blocking_facade_inside_running_loop() -> None:
    import asyncio

    async def notebook_cell() -> bytes:
        ws = Workspace(filesystem=FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/n")).blocking()
        try:
            ws.filesystem.write_file("x.txt", b"from a notebook")
            return bytes(ws.filesystem.read_file("x.txt"))
        finally:
            ws.close()

    assert asyncio.run(notebook_cell()) == b"from a notebook"


@pytest.mark.parametrize("storage", ["memory", "local"])
def test_demo_command(storage: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentvfs.cli", "demo", "--storage", storage],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout
    assert f"== agentvfs demo on {storage} storage" in out
    assert "guarded write by the first writer of version m1: written" in out
    assert "guarded write by the second writer of version m1: StaleFileError" in out
    assert "write_file README.md overwrite=False -> FileExists: File already exists: README.md" in out
    assert "read_file ../etc/passwd -> PermissionDenied: Permission denied: access on ../etc/passwd" in out
    assert "stale write -> StaleFileError: File was modified externally: README.md" in out
    assert "grep TODO: src/app.py:2:23:" in out
    assert "read-only write -> WorkspaceReadOnlyError: Workspace is in read-only mode. Cannot perform: write_file" in out
    assert "workspace destroyed: status=destroyed" in out
    assert "Replaced 1 occurrence in src/app.py (lines 2)" in out
    assert "src/app.py (lines 2-2 of 3, 61 bytes)" in out
    # A published index, attached by an agent whose own change hides the published version.
    assert "build_index <tmp>/bucket -> <tmp>/index: manifest 1, 6 documents in 1 segment(s), with vectors by agentvfs-hashing-384" in out
    assert "search 'main hello' (vector, from the published shards): src/app.py " in out
    assert "nothing indexed of its own): src/app.py " in out  # as the workspace names it
    assert "the published src/app.py is hidden): notes/mine.md " in out
    assert "the published src/app.py is hidden): notes/mine.md 1.582\n" in out  # and nothing else
    # Snapshots, diff and restore; a fork committed; a cache a second filesystem finds warm.
    assert "  diff: removed notes/plan.md\n  diff: changed src/app.py\n" in out
    assert "restore notes/plan.md -> restored ['notes/plan.md'], conflicts []" in out
    assert "fork experiment: wrote src/feature.py; in the original? False" in out
    assert "fork.commit() -> applied ['src/feature.py'], conflicts []\n  in the original now? True" in out
    # The old app.py only the deleted snapshot held; the other seven files the later one holds.
    assert "delete_snapshot(before-cleanup) -> snapshots left ['after-fork']; collect_garbage: 1 blob(s) deleted (61 bytes), 7 kept for after-fork" in out
    assert "cache after a first read of 3 files: 3 entries" in out  # moto: the test extra
    assert "a new filesystem reads them again: 3 files, 3 from the cache" in out


PUBLIC_NAMESPACES = (
    "agentvfs", "agentvfs.errors", "agentvfs.vfs", "agentvfs.mounts", "agentvfs.sandbox",
    "agentvfs.search", "agentvfs.skills", "agentvfs.snapshots", "agentvfs.tools", "agentvfs.testing",
)


def _public(namespace: str) -> list[tuple[str, Any]]:
    import importlib

    module = importlib.import_module(namespace)
    return [(name, getattr(module, name)) for name in module.__all__]


@pytest.mark.parametrize("namespace", PUBLIC_NAMESPACES)
def test_every_public_name_says_where_it_is_documented(namespace: str) -> None:
    for name, obj in _public(namespace):
        home = getattr(obj, "__module__", None)
        if not isinstance(obj, type) and not callable(obj):
            continue
        assert isinstance(home, str) and not any(part.startswith("_") for part in home.split(".")), (name, home)


@pytest.mark.parametrize("namespace", PUBLIC_NAMESPACES)
def test_every_public_exception_lives_in_errors(namespace: str) -> None:
    for name, obj in _public(namespace):
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert obj.__module__ == "agentvfs.errors", name
            assert getattr(errors, name) is obj, name


def test_the_tree_at_the_top_of_errors_names_every_exception() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        if isinstance(getattr(errors, name), type):
            assert f"── {name} " in doc or doc.rstrip().endswith(name), name


def test_mount_errors_are_their_own_root() -> None:
    err = errors.MountError("Mounting at /mnt/x failed: busy", {"mountpoint": "/mnt/x"})
    assert not isinstance(err, errors.SandboxError)
    assert (err.code, err.details, str(err)) == ("MOUNT_ERROR", {"mountpoint": "/mnt/x"}, "Mounting at /mnt/x failed: busy")
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.code, copy.details, str(copy)) == (errors.MountError, "MOUNT_ERROR", {"mountpoint": "/mnt/x"}, str(err))
    # What the sandbox provider cannot do stays a sandbox error.
    assert issubclass(errors.MountNotSupportedError, errors.SandboxError)


def test_the_errors_of_search_skills_and_edits_keep_their_builtins() -> None:
    cases: list[tuple[BaseException, type[BaseException]]] = [
        (errors.SearchIndexError("bad index"), RuntimeError),
        (errors.BM25FileError("not an index", "/x/search.duckdb"), OSError),
        (errors.EmbeddingError("bad vector", {0: "nan"}), ValueError),
        (errors.InvalidSkillError("bad SKILL.md", ["name: missing"]), ValueError),
        (errors.SkillConflictError("two skills named a"), ValueError),
        (errors.InvalidSkillPathError("../x leaves the skill"), PermissionError),
        (errors.BlobIntegrityError("blob abc does not hash to its name"), OSError),
        (errors.StringNotFoundError(), ValueError),
        (errors.StringNotUniqueError(3), ValueError),
    ]
    for err, builtin in cases:
        assert isinstance(err, builtin)
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err)
    assert str(errors.StringNotUniqueError(3)).startswith("The specified text appears 3 times.")
    from agentvfs import search, skills

    assert search.SearchIndexError is errors.SearchIndexError
    assert skills.InvalidSkillError is errors.InvalidSkillError
