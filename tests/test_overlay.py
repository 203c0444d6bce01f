"""What only an overlay does: whiteouts, opaque directories, copy-ups, the guarded commit,
discard, its records, and an agent trying to reach them."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from agentvfs.errors import (
    DirectoryNotEmpty,
    FileNotFound,
    PermissionDenied,
    StaleFileError,
    WorkspaceReadOnlyError,
)
from agentvfs.testing import Harness, MotoServer, local_harness
from agentvfs.vfs import (
    BackendFilesystem,
    CommitReport,
    LocalFilesystem,
    MemoryBackend,
    OverlayFilesystem,
    Version,
    WorkspaceFilesystem,
    publish_file,
    walk,
)
from conftest import BACKENDS, S3_BUCKET, harness_for, memory_harness, s3_harness

pytestmark = pytest.mark.anyio

RECORDS = ".agentvfs-overlay/manifest.json"

#: The tree every test starts from, put straight into the base storage.
TREE = {
    "README.md": b"# project\n",
    "src/app.py": b"print('hi')\n",
    "src/lib/util.py": b"def f():\n    return 1\n",
    "src/lib/deep/more.py": b"x = 1\n",
    "docs/guide.md": b"guide\n",
    "docs/api/index.md": b"api\n",
    "data/données/naïve 文件.txt": "unicode ✓\n".encode(),
}


def _seed(harness: Harness) -> None:
    for path, data in TREE.items():
        harness.put(path, data)


async def _fingerprint(fs: WorkspaceFilesystem) -> dict[str, str]:
    """Every entry below the root: a directory, or the SHA-256 of a file's bytes."""
    out: dict[str, str] = {}
    for entry in await walk(fs, ""):
        if entry.type == "directory":
            out[entry.name] = "dir"
        else:
            data = await fs.read_file(entry.name)
            assert isinstance(data, bytes)
            out[entry.name] = hashlib.sha256(data).hexdigest()
    return out


async def _view(fs: WorkspaceFilesystem) -> dict[str, bytes | None]:
    """Every entry of ``fs``: a file's bytes, None for a directory."""
    out: dict[str, bytes | None] = {}
    for entry in await fs.readdir("", recursive=True):
        data = await fs.read_file(entry.name) if entry.type == "file" else None
        assert data is None or isinstance(data, bytes)
        out[entry.name] = data
    return out


@pytest.fixture(params=BACKENDS)
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    harness = harness_for(request.param, request, tmp_path)
    _seed(harness)
    return harness


@pytest.fixture
def overlay(base: Harness) -> OverlayFilesystem:
    return OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))


async def _change_everything(fs: OverlayFilesystem) -> None:
    await fs.write_file("README.md", "# changed\n")
    await fs.append_file("src/app.py", "print('more')\n")
    await fs.write_file("src/new.py", "new\n")
    await fs.delete_file("docs/guide.md")
    await fs.rmdir("docs/api", recursive=True)
    await fs.mkdir("docs/api")
    await fs.write_file("docs/api/v2.md", "v2\n")
    await fs.move_file("src/lib", "lib")
    await fs.mkdir("empty/inner")
    await fs.move_file("data/données/naïve 文件.txt", "data/renommé ✓.txt")


# -- the base layer is never written ----------------------------------------------------------


async def test_base_never_changes_before_commit(base: Harness, overlay: OverlayFilesystem) -> None:
    before = await _fingerprint(base.reopen())
    await _change_everything(overlay)
    assert await _fingerprint(base.reopen()) == before
    view = await _view(overlay)
    assert view["README.md"] == b"# changed\n"
    assert view["src/app.py"] == b"print('hi')\nprint('more')\n"
    assert view["lib/deep/more.py"] == b"x = 1\n"
    assert "src/lib" not in view and "docs/guide.md" not in view
    assert view["data/renommé ✓.txt"] == "unicode ✓\n".encode()
    assert await overlay.readdir("data/données") == []
    assert [e.name for e in await overlay.readdir("docs/api")] == ["v2.md"]  # opaque
    assert view["empty/inner"] is None


async def test_commit_makes_the_base_what_the_overlay_showed(base: Harness, overlay: OverlayFilesystem) -> None:
    await _change_everything(overlay)
    shown = await _view(overlay)
    report = await overlay.commit()
    assert isinstance(report, CommitReport) and report.ok, report.reasons
    assert {"README.md", "src/new.py", "docs/guide.md", "docs/api/index.md", "lib/util.py"} <= set(report.applied)
    assert await _view(base.reopen()) == shown
    assert await _view(overlay) == shown
    # Everything applied: the upper layer is empty, records and all.
    assert await overlay.upper.readdir("") == []
    assert await overlay.changes() == []


async def test_discard(base: Harness, overlay: OverlayFilesystem) -> None:
    before = await _view(base.reopen())
    await _change_everything(overlay)
    assert await overlay.changes()
    await overlay.discard()
    assert await _view(overlay) == before
    assert await overlay.upper.readdir("") == []
    assert await overlay.changes() == []


# -- whiteouts and opaque directories --------------------------------------------------------------


async def test_whiteout_of_a_file() -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.fs, BackendFilesystem(MemoryBackend()))
    await fs.delete_file("docs/guide.md")
    with pytest.raises(FileNotFound):
        await fs.read_file("docs/guide.md")
    assert not await fs.exists("docs/guide.md")
    assert [e.name for e in await fs.readdir("docs")] == ["api"]
    assert base.get("docs/guide.md") == b"guide\n"
    with pytest.raises(FileNotFound):
        await fs.delete_file("docs/guide.md")
    # Made again, it is the overlay's file; the whiteout still hides the base's.
    await fs.write_file("docs/guide.md", "mine\n")
    assert await fs.read_file("docs/guide.md") == b"mine\n"
    await fs.delete_file("docs/guide.md")
    assert not await fs.exists("docs/guide.md")
    assert base.get("docs/guide.md") == b"guide\n"


async def test_rmdir_then_mkdir_is_an_empty_opaque_directory() -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.fs, BackendFilesystem(MemoryBackend()))
    with pytest.raises(DirectoryNotEmpty):
        await fs.rmdir("src")
    await fs.rmdir("src", recursive=True)
    assert not await fs.exists("src/lib/util.py")
    with pytest.raises(FileNotFoundError):
        await fs.readdir("src")
    await fs.mkdir("src")
    assert await fs.readdir("src") == []
    assert await fs.readdir("src", recursive=True) == []
    assert not await fs.exists("src/app.py")
    await fs.write_file("src/lib/x.py", "x\n")
    assert [e.name for e in await fs.readdir("src", recursive=True)] == ["lib", "lib/x.py"]
    # The base keeps everything, and the commit makes it the opaque directory.
    assert base.get("src/lib/deep/more.py") == b"x = 1\n"
    report = await fs.commit()
    assert report.ok, report.reasons
    assert base.get("src/app.py") is None and base.get("src/lib/deep/more.py") is None
    assert base.get("src/lib/x.py") == b"x\n"
    assert [e.name for e in await base.fs.readdir("src", recursive=True)] == ["lib", "lib/x.py"]


async def test_empty_directories() -> None:
    base = memory_harness()
    _seed(base)
    await base.fs.mkdir("empty-in-base")
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    await fs.mkdir("made/empty")
    await fs.rmdir("empty-in-base")
    assert await fs.readdir("made/empty") == []
    assert not await fs.exists("empty-in-base")
    report = await fs.commit()
    assert report.ok
    assert {"made", "made/empty", "empty-in-base"} <= set(report.applied)
    assert base.isdir("made/empty") and not base.isdir("empty-in-base")


async def test_a_file_replaces_a_base_directory_and_back() -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    await fs.rmdir("docs", recursive=True)
    await fs.write_file("docs", "now a file\n")
    await fs.delete_file("README.md")
    await fs.mkdir("README.md")
    assert await fs.read_file("docs") == b"now a file\n"
    with pytest.raises(NotADirectoryError):
        await fs.readdir("docs")
    assert not await fs.exists("docs/guide.md")
    assert (await fs.stat("README.md")).type == "directory"
    report = await fs.commit()
    assert report.ok, report.reasons
    assert base.get("docs") == b"now a file\n" and base.isdir("README.md")


# -- renames of base trees --------------------------------------------------------------------------


async def test_rename_of_a_base_tree_and_back() -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    await fs.move_file("src", "source")
    assert not await fs.exists("src")
    assert await fs.read_file("source/lib/deep/more.py") == b"x = 1\n"
    await fs.move_file("source", "src")
    assert await fs.read_file("src/lib/util.py") == b"def f():\n    return 1\n"
    assert not await fs.exists("source")
    await fs.move_file("src/app.py", "app.py")
    report = await fs.commit()
    assert report.ok, report.reasons
    assert base.get("app.py") == b"print('hi')\n" and base.get("src/app.py") is None
    assert base.get("src/lib/deep/more.py") == b"x = 1\n"
    assert not base.isdir("source")


# -- versions: stale checks and the guarded commit ----------------------------------------------------


async def test_a_version_seen_before_a_copy_up_is_stale() -> None:
    base = memory_harness()
    _seed(base)
    # A guard given only a time tells versions apart to the millisecond: the copy-up must
    # come in a later one than the seeding (warm, both fit in one and nothing is stale).
    time.sleep(0.002)
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    seen = await fs.stat("README.md")
    assert seen.etag is not None and seen.etag.startswith("b:")
    await fs.write_file("README.md", "first\n", expected_mtime=seen)
    copied = await fs.stat("README.md")
    assert copied.etag is not None and copied.etag.startswith("u:")
    with pytest.raises(StaleFileError):
        await fs.write_file("README.md", "lost update\n", expected_mtime=seen)
    with pytest.raises(StaleFileError):
        await fs.write_file("README.md", "lost update\n", expected_mtime=seen.modified_at)
    await fs.write_file("README.md", "second\n", expected_mtime=copied)
    assert await fs.read_file("README.md") == b"second\n"


async def test_conditional_publish(tmp_path: Path) -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    local = tmp_path / "f"
    local.write_bytes(b"published\n")
    seen = await fs.stat("README.md")
    version = await publish_file(fs, os.fspath(local), "README.md", expected=Version.of(seen))
    assert version is None or version.startswith("u:")
    with pytest.raises(StaleFileError):
        await publish_file(fs, os.fspath(local), "README.md", expected=Version.of(seen))
    with pytest.raises(FileExistsError):
        await publish_file(fs, os.fspath(local), "README.md", create=True)
    assert await fs.read_file("README.md") == b"published\n"
    assert base.get("README.md") == b"# project\n"


async def test_commit_reports_conflicts_and_keeps_them(base: Harness, overlay: OverlayFilesystem) -> None:
    await overlay.write_file("README.md", "overlay\n")  # changed in the base too: conflict
    await overlay.write_file("src/app.py", "overlay app\n")  # only here: applied
    await overlay.delete_file("docs/guide.md")  # changed in the base: conflict
    await overlay.write_file("fresh.txt", "overlay\n")  # created in the base too: conflict
    await overlay.rmdir("src/lib/deep", recursive=True)  # the base added a file: conflict
    await overlay.delete_file("docs/api/index.md")  # only here: applied
    # Direct changes to the base storage, behind the overlay's back.
    base.put("README.md", b"theirs\n")
    base.put("docs/guide.md", b"their guide\n")
    base.put("fresh.txt", b"theirs\n")
    base.put("src/lib/deep/theirs.py", b"theirs\n")

    report = await overlay.commit()
    assert not report.ok
    assert set(report.conflicts) == {"README.md", "docs/guide.md", "fresh.txt", "src/lib/deep"}
    assert set(report.reasons) == set(report.conflicts)
    assert "src/app.py" in report.applied and "docs/api/index.md" in report.applied
    assert "src/lib/deep/more.py" in report.applied  # what the overlay saw in the directory
    # Nothing of theirs was overwritten; what was applied is in the base.
    assert base.get("README.md") == b"theirs\n" and base.get("docs/guide.md") == b"their guide\n"
    assert base.get("fresh.txt") == b"theirs\n" and base.get("src/lib/deep/theirs.py") == b"theirs\n"
    assert base.get("src/app.py") == b"overlay app\n" and base.get("docs/api/index.md") is None
    # The conflicts stay in the overlay, which still shows its own version of them.
    assert await overlay.read_file("README.md") == b"overlay\n"
    assert not await overlay.exists("docs/guide.md")
    assert not await overlay.exists("src/lib/deep")
    assert set(await overlay.changes()) >= {"README.md", "docs/guide.md", "fresh.txt", "src/lib/deep"}
    assert "src/app.py" not in await overlay.changes()

    # A second commit finds the same conflicts, and applies nothing more.
    again = await overlay.commit()
    assert set(again.conflicts) == set(report.conflicts) and again.applied == ()
    # Forced, the overlay's version wins everywhere.
    forced = await overlay.commit(force=True)
    assert forced.ok, forced.reasons
    assert base.get("README.md") == b"overlay\n" and base.get("docs/guide.md") is None
    assert base.get("fresh.txt") == b"overlay\n" and not base.isdir("src/lib/deep")
    assert await overlay.upper.readdir("") == []


@pytest.mark.s3
async def test_conflict_made_through_boto3(moto: MotoServer) -> None:
    base = s3_harness(moto)
    _seed(base)
    assert isinstance(base.fs, WorkspaceFilesystem)
    prefix = base.fs.location
    assert prefix is not None
    key = prefix.removeprefix(f"{S3_BUCKET}/") + "/README.md"
    fs = OverlayFilesystem(base.reopen(), memory_harness().fs)
    await fs.write_file("README.md", "overlay\n")
    await fs.write_file("src/app.py", "overlay app\n")
    client = moto.boto3_client()
    client.put_object(Bucket=S3_BUCKET, Key=key, Body=b"from boto3\n")
    report = await fs.commit()
    assert report.conflicts == ("README.md",)
    assert "changed in the target" in report.reasons["README.md"]
    assert client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() == b"from boto3\n"
    assert base.get("src/app.py") == b"overlay app\n"


async def test_commit_into_the_live_filesystem_of_a_read_only_base(tmp_path: Path) -> None:
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    live = local_harness(os.fspath(live_dir))
    _seed(live)
    frozen = LocalFilesystem(os.fspath(live_dir), read_only=True)  # what the base showed
    fs = OverlayFilesystem(frozen, BackendFilesystem(MemoryBackend()))
    await fs.write_file("README.md", "overlay\n")
    await fs.write_file("src/app.py", "overlay app\n")
    await fs.delete_file("docs/guide.md")
    with pytest.raises(ValueError, match="read-only"):
        await fs.commit()
    (live_dir / "src" / "app.py").write_bytes(b"changed live\n")
    report = await fs.commit(into=LocalFilesystem(os.fspath(live_dir)))
    assert report.conflicts == ("src/app.py",)
    assert set(report.applied) == {"README.md", "docs/guide.md"}
    assert live.get("README.md") == b"overlay\n" and live.get("docs/guide.md") is None
    assert live.get("src/app.py") == b"changed live\n"


async def test_records_persist_in_the_upper_layer(tmp_path: Path) -> None:
    base = memory_harness()
    _seed(base)
    upper_dir = tmp_path / "upper"
    upper_dir.mkdir()
    fs = OverlayFilesystem(base.reopen(), LocalFilesystem(os.fspath(upper_dir)))
    await fs.delete_file("README.md")
    await fs.write_file("src/app.py", "mine\n")
    await fs.rmdir("docs", recursive=True)
    records = json.loads((upper_dir / RECORDS).read_bytes())
    assert records["hidden"] == ["README.md", "docs"]
    assert set(records["origins"]) == {"README.md", "src/app.py", "docs", "docs/api", "docs/api/index.md", "docs/guide.md"}
    again = OverlayFilesystem(base.reopen(), LocalFilesystem(os.fspath(upper_dir)))
    assert not await again.exists("README.md") and not await again.exists("docs")
    base.put("src/app.py", b"theirs\n")
    report = await again.commit()
    assert report.conflicts == ("src/app.py",)  # the base version survived the reopen


async def test_damaged_records_say_so_and_discard_recovers(tmp_path: Path) -> None:
    base = memory_harness()
    _seed(base)
    upper_dir = tmp_path / "upper"
    (upper_dir / ".agentvfs-overlay").mkdir(parents=True)
    (upper_dir / RECORDS).write_text('{"format": 1, "hidden": ["../etc"], "origins": {}}')
    fs = OverlayFilesystem(base.reopen(), LocalFilesystem(os.fspath(upper_dir)))
    with pytest.raises(ValueError, match=r"records in \.agentvfs-overlay/manifest\.json .* damaged: bad path '\.\./etc'; discard\(\)"):
        await fs.read_file("README.md")
    await fs.discard()
    assert await fs.read_file("README.md") == b"# project\n"


# -- an agent against the overlay's records -----------------------------------------------------------


async def test_records_cannot_be_seen_or_forged() -> None:
    base = memory_harness()
    _seed(base)
    upper = BackendFilesystem(MemoryBackend())
    fs = OverlayFilesystem(base.reopen(), upper)
    await fs.delete_file("README.md")  # now there are records in the upper layer
    assert await upper.exists(RECORDS)
    assert ".agentvfs-overlay" not in [e.name for e in await fs.readdir("")]
    assert not any(e.name.startswith(".agentvfs-overlay") for e in await fs.walk("", include_hidden=True))
    assert ".agentvfs-overlay" not in [s.name for s in await fs.list_stats("")]
    for spelling in (RECORDS, "/" + RECORDS, "./x/../" + RECORDS, ".agentvfs-overlay"):
        assert not await fs.exists(spelling)
        with pytest.raises(FileNotFoundError):
            await fs.read_file(spelling)
        with pytest.raises(FileNotFoundError):
            await fs.stat(spelling)
    with pytest.raises(FileNotFoundError):
        await fs.readdir(".agentvfs-overlay")
    forged = json.dumps({"format": 1, "hidden": ["src"], "origins": {}})
    attempts = [
        fs.write_file(RECORDS, forged),
        fs.write_file("/.agentvfs-overlay/../.agentvfs-overlay/manifest.json", forged),
        fs.append_file(RECORDS, forged),
        fs.delete_file(RECORDS),
        fs.mkdir(".agentvfs-overlay/x"),
        fs.rmdir(".agentvfs-overlay", recursive=True),
        fs.copy_file("src/app.py", RECORDS),
        fs.move_file("src/app.py", RECORDS),
        fs.move_file("src", ".agentvfs-overlay"),
        fs.copy_file(RECORDS, "stolen.json"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as info:
            await attempt
        assert info.value.errno in (errno.EACCES, errno.ENOENT)
    with pytest.raises(PermissionDenied, match=r"reserved for the overlay's records"):
        await fs.write_file(RECORDS, forged)
    # Nothing changed: the records still hide only README.md, src is intact.
    assert json.loads(await upper.read_file(RECORDS))["hidden"] == ["README.md"]
    assert await fs.read_file("src/app.py") == b"print('hi')\n"
    assert not await fs.exists("stolen.json")


async def test_lookalike_names_are_ordinary_files() -> None:
    base = memory_harness()
    _seed(base)
    # A base that holds the reserved name (an upper layer of another overlay, say): not shown.
    base.put(RECORDS, json.dumps({"format": 1, "hidden": ["src"], "origins": {}}).encode())
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    assert await fs.read_file("src/app.py") == b"print('hi')\n"
    assert ".agentvfs-overlay" not in [e.name for e in await fs.readdir("")]
    forged = json.dumps({"format": 1, "hidden": ["README.md"], "origins": {}})
    for name in ("sub/.agentvfs-overlay/manifest.json", ".wh.README.md", ".agentvfs-overlay2", "docs/.wh..wh..opq"):
        await fs.write_file(name, forged)
        assert await fs.read_file(name) == forged.encode()
    assert await fs.read_file("README.md") == b"# project\n"
    names = {e.name for e in await fs.readdir("", recursive=True)}
    assert {"sub/.agentvfs-overlay/manifest.json", ".wh.README.md", ".agentvfs-overlay2", "docs/.wh..wh..opq"} <= names
    await fs.delete_file(".wh.README.md")
    assert await fs.exists("README.md")


async def test_dotdot_never_leaves_the_root() -> None:
    base = memory_harness()
    _seed(base)
    fs = OverlayFilesystem(base.reopen(), BackendFilesystem(MemoryBackend()))
    for bad in ("../x", "src/../../x", "../.agentvfs-overlay/manifest.json"):
        for call in (fs.read_file(bad), fs.write_file(bad, "x"), fs.delete_file(bad), fs.mkdir(bad), fs.stat(bad)):
            with pytest.raises(PermissionDenied):
                await call
    await fs.write_file("src/../top.txt", "t")
    assert await fs.read_file("top.txt") == b"t"


# -- modes and bad input -----------------------------------------------------------------------------


async def test_read_only_overlay() -> None:
    base = memory_harness()
    _seed(base)
    upper = BackendFilesystem(MemoryBackend())
    fs = OverlayFilesystem(base.reopen(), upper)
    await fs.write_file("a.txt", "a")
    ro = OverlayFilesystem(base.reopen(), BackendFilesystem(upper.backend, read_only=True), read_only=True)
    assert await ro.read_file("a.txt") == b"a"
    for call in (ro.commit(), ro.discard(), ro.write_file("b.txt", "b"), ro.delete_file("a.txt")):
        with pytest.raises(WorkspaceReadOnlyError):
            await call
    assert await fs.read_file("a.txt") == b"a"


def test_bad_construction() -> None:
    memory = BackendFilesystem(MemoryBackend())
    with pytest.raises(TypeError, match="base must be a WorkspaceFilesystem, not str"):
        OverlayFilesystem("s3://bucket", memory)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base and upper must be two filesystems"):
        OverlayFilesystem(memory, memory)
    with pytest.raises(ValueError, match="the upper filesystem is read-only"):
        OverlayFilesystem(memory, BackendFilesystem(MemoryBackend(), read_only=True))


async def test_bad_commit_targets() -> None:
    fs = OverlayFilesystem(BackendFilesystem(MemoryBackend()), BackendFilesystem(MemoryBackend()))
    with pytest.raises(TypeError, match="into must be a WorkspaceFilesystem"):
        await fs.commit(into="base")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="another filesystem than the overlay"):
        await fs.commit(into=fs)
    with pytest.raises(ValueError, match="another filesystem than the overlay"):
        await fs.commit(into=fs.upper)
