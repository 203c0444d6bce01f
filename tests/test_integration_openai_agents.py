"""The OpenAI Agents SDK adapter (``agentvfs.integrations.openai_agents``), against the real SDK.

The sandbox tests are adapted (rewritten, not copied) from the SDK's own tests, as read in
openai/openai-agents-python at commit 7f7a44f, for :class:`AgentVFSSandboxClient` on memory,
a local directory, S3 (moto) and GCS (fake-gcs-server); agent runs use the SDK's
``ScriptedModel`` (no model calls).

``tests/sandbox/test_unix_local.py``, case by case:

- ``test_unix_local_rejects_host_path_before_creating_workspace``: covered by
  ``test_host_path_grants_are_refused_before_the_workspace_exists``.
- ``TestUnixLocalUserScopedFilesystem.test_mkdir_as_user_...`` and ``test_rm_as_user_...``:
  covered by ``test_user_scoped_file_operations_are_refused_and_change_nothing``. UnixLocal
  runs a ``sudo -u`` permission probe; a session here has one user, so the general
  contract kept is "an operation for a user is never silently done as someone else".
- ``TestUnixLocalPty`` (five PTY cases: start / write / poll, Ctrl-C, terminal signals,
  non-tty stdin, stop ends PTYs): not covered. The session offers no PTY
  (``supports_pty()`` is False), so the SDK's shell tool runs each command to completion;
  ``test_pty_is_not_offered_so_the_shell_tool_runs_commands_whole`` checks that fallback.
- ``TestUnixLocalPty.test_tty_fd_close_is_owned_without_blocking_termination``: not
  covered, UnixLocal internals (its bookkeeping of PTY descriptor close tasks).

``tests/sandbox/integration_tests/_helpers.py`` with ``test_runner_pause_resume.py`` (the
persist -> hydrate round trip through a paused and resumed run): covered by
``test_a_paused_run_resumes_with_the_workspace_restored_from_the_snapshot``, with the
manifest entry kinds a session materialises (file, dir, ephemeral file, local file and
local dir under a path grant), the runtime write, the patch, the archive extraction, the
escape checks (read / write / patch outside, a symlink out of the workspace) and the
restored tree. Left out: the git checkout and the R2 / Azure mounts (refused, see
``test_unsupported_manifests_are_refused_naming_the_entry``), the S3 / GCS mounts (served
live, never snapshotted: see the mount tests) and the PTY probe (no PTY, above).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import tempfile
import uuid
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.editor import ApplyPatchOperation
from agents.items import ToolCallOutputItem
from agents.run_config import SandboxRunConfig
from agents.run_context import RunContextWrapper
from agents.run_state import RunState
from agents.sandbox import Manifest, SandboxAgent, SandboxArchiveLimits, SandboxPathGrant
from agents.sandbox.capabilities import Capability, Shell
from agents.sandbox.entries import (
    Dir,
    File,
    GCSMount,
    GitRepo,
    InContainerMountStrategy,
    LocalDir,
    LocalFile,
    R2Mount,
    RcloneMountPattern,
    S3Mount,
)
from agents.sandbox.errors import (
    ApplyPatchPathError,
    ExecTimeoutError,
    InvalidManifestPathError,
    SnapshotPersistError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.files import EntryKind
from agents.sandbox.session import BaseSandboxSession, Dependencies, SandboxSession
from agents.sandbox.snapshot import RemoteSnapshotSpec
from agents.sandbox.types import User
from agents.testing import ScriptedModel, function_call
from agents.testing.model import assistant_message
from agents.tool import Tool
from agents.tool_context import ToolContext
from fsspec.implementations.memory import MemoryFileSystem

from _mounted import fuse_unavailable
from agentvfs import FsspecFilesystem, LocalFilesystem, LocalSandbox, Workspace, WorkspaceFilesystem
from agentvfs.integrations.openai_agents import (
    AgentVFSSandboxClient,
    AgentVFSSandboxSession,
    FsspecSnapshotStore,
    function_tools,
)
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.testing._attacks_inputs import (
    long_name_tar,
    pax_backtracking_tar,
    timed,
    zip_extra_fields_bomb,
)
from agentvfs.testing._attacks_tools import peak_rss_growth
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(fuse_unavailable() is not None, reason=str(fuse_unavailable())),
]

needs_bwrap = pytest.mark.skipif(
    not LocalSandbox.detect_isolation()["available"], reason="bubblewrap cannot isolate here"
)
SANDBOX_BACKENDS = [
    "memory",
    "local",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("gcs", marks=pytest.mark.gcs),
]
NO_TRACING = RunConfig(tracing_disabled=True)


# -- helpers -------------------------------------------------------------------------------------


class Storage:
    """A session's storage plus an independent way to look at it (the raw store)."""

    def __init__(
        self, name: str, filesystem: WorkspaceFilesystem, read_raw: Callable[[str], bytes]
    ) -> None:
        self.name = name
        self.filesystem = filesystem
        self.read_raw = read_raw


def _storage(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if backend == "memory":
        raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
        root = f"/{unique('oa')}"
        return Storage(
            "memory", FsspecFilesystem(raw, root=root), lambda p: bytes(raw.cat(f"{root}/{p}"))
        )
    if backend == "local":
        base = tmp_path / "store"
        base.mkdir()
        return Storage("local", LocalFilesystem(str(base)), lambda p: (base / p).read_bytes())
    if backend == "gcs":
        fake_gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
        gcs = fake_gcs.gcsfs()
        gcs_prefix = f"{GCS_BUCKET}/{unique('oa')}"
        # As for S3, the check reads through a second, fresh gcsfs.
        gcs_check = fake_gcs.gcsfs()
        return Storage(
            "gcs",
            FsspecFilesystem(gcs, root=gcs_prefix),
            lambda p: bytes(gcs_check.cat(f"{gcs_prefix}/{p}")),
        )
    moto: MotoServer = request.getfixturevalue("moto")
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('oa')}"
    # The check reads through a second s3fs, so nothing cached by the session can answer it.
    check = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    return Storage(
        "s3", FsspecFilesystem(raw, root=prefix), lambda p: bytes(check.cat(f"{prefix}/{p}"))
    )


@pytest.fixture(params=SANDBOX_BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return _storage(request.param, request, tmp_path)


@pytest.fixture
async def session(storage: Storage) -> AsyncIterator[SandboxSession]:
    client = AgentVFSSandboxClient(storage.filesystem)
    manifest = Manifest(
        entries={
            "notes.txt": File(content=b"from the manifest\n"),
            "tree": Dir(children={"leaf.txt": File(content=b"leaf\n")}),
        }
    )
    live = await client.create(manifest=manifest)
    async with live:
        yield live
    await client.delete(live)
    assert not os.path.exists(_inner(live).state.working_directory), (
        "delete left the host directory"
    )


def _inner(session: SandboxSession) -> AgentVFSSandboxSession:
    inner = session._inner
    assert isinstance(inner, AgentVFSSandboxSession)
    return inner


async def _text(session: SandboxSession, path: str) -> str:
    stream = await session.read(Path(path))
    try:
        data = stream.read()
    finally:
        stream.close()
    return data.decode() if isinstance(data, bytes) else str(data)


@contextlib.asynccontextmanager
async def _unstarted(client: AgentVFSSandboxClient, **options: Any) -> AsyncIterator[AgentVFSSandboxSession]:
    """A session not started (hydration, ``extract`` and the file API work on the storage
    directly), deleted after (its host directory goes)."""
    live = await client.create(**options)
    try:
        yield _inner(live)
    finally:
        await client.delete(live)


def _tar(members: Mapping[str, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


# -- the sandbox session on every backend --------------------------------------------------------


async def test_commands_run_in_the_workspace_root_and_see_the_manifest(
    session: SandboxSession, storage: Storage
) -> None:
    root = session.state.manifest.root
    result = await session.exec("pwd; cat notes.txt tree/leaf.txt; echo oops >&2; exit 3")
    assert result.stdout.decode() == f"{root}\nfrom the manifest\nleaf\n"
    assert result.stderr.decode() == "oops\n"
    assert result.exit_code == 3
    plain = await session.exec("printf", "%s|", "a b", "c", shell=False)
    assert (plain.stdout, plain.exit_code) == (b"a b|c|", 0)


async def test_file_api_and_commands_share_the_storage(
    session: SandboxSession, storage: Storage
) -> None:
    await session.write(Path("api/written.txt"), io.BytesIO(b"by the file api\n"))
    seen = await session.exec(
        "cat api/written.txt && mkdir -p out && echo by-a-command > out/cmd.txt"
    )
    assert seen.stdout == b"by the file api\n"
    assert await _text(session, "out/cmd.txt") == "by-a-command\n"
    # Both writes reached the storage itself, not a copy in the sandbox.
    assert storage.read_raw("api/written.txt") == b"by the file api\n"
    assert storage.read_raw("out/cmd.txt") == b"by-a-command\n"
    assert storage.read_raw("notes.txt") == b"from the manifest\n"
    listed = {Path(e.path).name: e.kind.value for e in await session.ls(".")}
    assert listed == {
        "notes.txt": "file",
        "tree": "directory",
        "api": "directory",
        "out": "directory",
    }
    await session.rm("api", recursive=True)
    assert (await session.exec("test -e api")).exit_code == 1


async def test_paths_outside_the_workspace_are_refused(session: SandboxSession) -> None:
    for path in ("../outside.txt", "/tmp/agentvfs-outside.txt"):
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path(path))
        with pytest.raises(InvalidManifestPathError):
            await session.write(Path(path), io.BytesIO(b"x"))
    assert not os.path.exists("/tmp/agentvfs-outside.txt")
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path("missing.txt"))


async def test_persist_then_hydrate_into_another_session(
    session: SandboxSession, storage: Storage, tmp_path: Path
) -> None:
    await session.write(Path("deep/er/file.bin"), io.BytesIO(bytes(range(256))))
    await session.mkdir(Path("empty"))
    archive = await session.persist_workspace()
    with tarfile.open(fileobj=archive) as tar:
        names = set(tar.getnames())
    assert {"notes.txt", "tree", "tree/leaf.txt", "deep/er/file.bin", "empty"} <= names
    archive.seek(0)
    target = tmp_path / "target"
    target.mkdir()
    # A local directory: pyfuse3 serves one in-process (memory) mount per process at a time.
    other_client = AgentVFSSandboxClient(LocalFilesystem(str(target)))
    other = await other_client.create()
    async with other:
        await other.hydrate_workspace(archive)
        assert await _text(other, "tree/leaf.txt") == "leaf\n"
        assert (await other.read(Path("deep/er/file.bin"))).read() == bytes(range(256))
        assert (await other.exec("test -d empty && cat notes.txt")).stdout == b"from the manifest\n"
    assert (target / "deep/er/file.bin").read_bytes() == bytes(range(256))
    await other_client.delete(other)


# -- one backend is enough for these -------------------------------------------------------------


@pytest.fixture
async def memory_session() -> AsyncIterator[SandboxSession]:
    client = AgentVFSSandboxClient()
    live = await client.create()
    async with live:
        yield live
    await client.delete(live)


async def test_hydrate_refuses_an_escaping_archive_before_writing(
    memory_session: SandboxSession,
) -> None:
    for bad in ({"ok.txt": b"fine", "../evil.txt": b"x"}, {"ok.txt": b"fine", "/abs.txt": b"x"}):
        with pytest.raises(WorkspaceArchiveWriteError):
            await memory_session.hydrate_workspace(_tar(bad))
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w") as tar:
        info = tarfile.TarInfo("link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    link.seek(0)
    with pytest.raises(WorkspaceArchiveWriteError):
        await memory_session.hydrate_workspace(link)
    assert await _inner(memory_session).filesystem.readdir("") == []


def _peak_rss() -> int:
    """The process's peak resident memory so far, in bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_a_sparse_file_past_the_limits_is_refused_without_reading_it_into_memory(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "notes.txt").write_bytes(b"n\n")
    # Made as a command in the sandbox would (truncate -s 2G): 2 GiB that cost no disk.
    (store / "big").touch()
    os.truncate(store / "big", 2 << 30)
    limits = SandboxArchiveLimits(max_input_bytes=4 << 30, max_extracted_bytes=1 << 30)
    client = AgentVFSSandboxClient(LocalFilesystem(str(store)), archive_limits=limits)
    live = await client.create()
    try:
        async with live:
            before = _peak_rss()
            with pytest.raises(WorkspaceArchiveReadError) as persisted:
                await live.persist_workspace()
            assert persisted.value.context["reason"] == "archive extracted size exceeds limit"
            assert persisted.value.context["member"] == "big"
            assert persisted.value.context["limit"] == 1 << 30
            with pytest.raises(WorkspaceArchiveReadError) as read:
                await live.read(Path("big"))
            assert read.value.context["reason"] == "file size exceeds limit"
            assert _peak_rss() - before < 200 * 1024 * 1024
            # The run's limits (SandboxRunConfig.archive_limits, set on the session by the
            # runner) win over the client's: here the tar's size is what refuses it.
            live._set_archive_limits(SandboxArchiveLimits(max_input_bytes=1 << 20))
            with pytest.raises(WorkspaceArchiveReadError) as tar_size:
                await live.persist_workspace()
            assert tar_size.value.context["reason"] == "archive input size exceeds limit"
            os.unlink(store / "big")
            (store / "medium").touch()
            os.truncate(store / "medium", 20 << 20)  # past the chunk and the in-memory spool
            live._set_archive_limits(None)
            archive = await live.persist_workspace()
            with tarfile.open(fileobj=archive) as tar:
                assert {m.name: m.size for m in tar.getmembers()} == {
                    "notes.txt": 2,
                    "medium": 20 << 20,
                }
            assert (await live.read(Path("medium"))).read() == bytes(20 << 20)
    finally:
        await client.delete(live)


async def test_a_fifo_is_left_out_of_the_snapshot_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    client = AgentVFSSandboxClient(LocalFilesystem(str(store)))
    live = await client.create(manifest=Manifest(entries={"notes.txt": File(content=b"n\n")}))
    try:
        async with live:
            assert (await live.exec("mkfifo fifo")).exit_code == 0
            with caplog.at_level("WARNING", logger="agentvfs.integrations.openai_agents"):
                archive = await live.persist_workspace()
            with tarfile.open(fileobj=archive) as tar:
                assert tar.getnames() == ["notes.txt"]
            assert "leaves out fifo" in caplog.text
    finally:
        await client.delete(live)


async def test_hydrate_refuses_an_archive_past_the_limits_before_writing() -> None:
    limits = SandboxArchiveLimits(max_input_bytes=64 * 1024, max_extracted_bytes=4096, max_members=3)
    client = AgentVFSSandboxClient(archive_limits=limits)
    live = await client.create()
    bomb = io.BytesIO()  # 1 MiB of zeros: a few KiB compressed, past the extracted limit
    with tarfile.open(fileobj=bomb, mode="w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 1 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    bomb.seek(0)
    cases = {
        "archive member count exceeds limit": _tar({f"f{i}.txt": b"x" for i in range(4)}),
        "archive extracted size exceeds limit": bomb,
        "archive input size exceeds limit": _tar({"big.bin": bytes(100 * 1024)}),
    }
    try:
        async with live:
            for reason, archive in cases.items():
                with pytest.raises(WorkspaceArchiveWriteError) as caught:
                    await live.hydrate_workspace(archive)
                assert caught.value.context["reason"] == reason
                assert await _inner(live).filesystem.readdir("") == []
            await live.hydrate_workspace(_tar({"d": None, "d/a.txt": b"a", "b.txt": b"b"}))
            assert await _text(live, "d/a.txt") == "a"
    finally:
        await client.delete(live)


async def test_hydrate_refuses_long_member_names_in_bounded_memory(tmp_path: Path) -> None:
    """A 128 KiB gzip whose GNU long name is 128 MiB: tarfile read the name whole (and kept
    copies: 3.2 GiB for a 509 KiB archive); the bounded reader refuses it by the size its
    header declares, unread, and says which limit."""
    client = AgentVFSSandboxClient(LocalFilesystem(str(tmp_path)))
    async with _unstarted(client) as session:
        bomb = long_name_tar(128 << 20)
        with peak_rss_growth() as growth, pytest.raises(WorkspaceArchiveWriteError) as caught:
            await session.hydrate_workspace(io.BytesIO(bomb))
        assert growth[0] < 64 << 20, f"refusing it grew the peak RSS by {growth[0] >> 20} MiB"
        assert caught.value.context["reason"] == "archive member name exceeds limit"
        assert (caught.value.context["limit"], caught.value.context["actual"]) == (4096, 128 << 20)
        assert str(caught.value).startswith("archive member name exceeds limit: 134217728 > 4096, in the archive of")
        assert list(tmp_path.iterdir()) == []


async def test_hydrate_of_a_backtracking_pax_header_keeps_the_event_loop_running(tmp_path: Path) -> None:
    """A pax header of 64 KiB of digits: tarfile (before 3.11.10) searched it with a pattern
    that backtracks quadratically, holding the GIL and so the event loop (8 s here, half an
    hour at 1 MiB); the bounded reader walks its records by their lengths and refuses it."""
    client = AgentVFSSandboxClient(LocalFilesystem(str(tmp_path)))
    async with _unstarted(client) as session:
        async with timed() as clock:
            with pytest.raises(WorkspaceArchiveWriteError) as caught:
                await session.hydrate_workspace(io.BytesIO(pax_backtracking_tar(64 * 1024)))
        assert clock[1] < 1.0, f"the event loop stalled for {clock[1]:.1f} s"
        assert clock[0] < 5.0, f"refusing it took {clock[0]:.1f} s"
        assert "the pax header at offset 0 has a malformed record" in str(caught.value)
        assert caught.value.context["reason"] == "invalid archive"
        assert list(tmp_path.iterdir()) == []


async def test_a_truncated_snapshot_is_refused_before_resume_clears_the_workspace(tmp_path: Path) -> None:
    """Every byte of a snapshot is read before the live files are cleared: one cut short
    changes nothing, and the error names the member it ends in."""
    store_dir, snaps = tmp_path / "store", tmp_path / "snaps"
    store_dir.mkdir()
    snaps.mkdir()
    store = FsspecSnapshotStore(LocalFilesystem(str(snaps)))
    client = AgentVFSSandboxClient(
        LocalFilesystem(str(store_dir)), dependencies=Dependencies().bind_value("snaps", store)
    )
    async with _unstarted(client, snapshot=RemoteSnapshotSpec(client_dependency_key="snaps")) as session:
        (store_dir / "keep.txt").write_bytes(b"live work\n")
        whole = _tar({"a.txt": b"a" * 1000, "b.bin": bytes(50_000)}).getvalue()
        await store.upload(str(session.state.session_id), io.BytesIO(whole[:-20_000]))
        with pytest.raises(WorkspaceArchiveWriteError) as caught:
            await session._restore_snapshot_into_workspace_on_resume()
        assert sorted(p.name for p in store_dir.iterdir()) == ["keep.txt"]
        assert (store_dir / "keep.txt").read_bytes() == b"live work\n"
        assert "it ends inside the content of member 'b.bin'" in str(caught.value)


async def test_extract_reads_tars_and_zips_within_the_same_bounds(tmp_path: Path) -> None:
    """``extract()`` (the SDK's archive upload) reads a tar with the bounded reader and checks
    a zip's central directory before zipfile does, within the client's limits; what is
    fine is extracted as the SDK extracts it, links on the way refused."""
    store = tmp_path / "store"
    store.mkdir()
    client = AgentVFSSandboxClient(LocalFilesystem(str(store)))
    async with _unstarted(client) as session:
        async with timed() as clock:
            with pytest.raises(WorkspaceArchiveWriteError, match="malformed record"):
                await session.extract("bomb.tar", io.BytesIO(pax_backtracking_tar(64 * 1024)))
            with pytest.raises(WorkspaceArchiveWriteError, match="archive member extra fields exceed limit"):
                await session.extract("bomb.zip", io.BytesIO(zip_extra_fields_bomb(60)))
        assert clock[1] < 1.0 and clock[0] < 5.0, clock
        with pytest.raises(WorkspaceArchiveWriteError, match="archive member name exceeds limit"):
            await session.extract("names.tar", io.BytesIO(long_name_tar(16 << 20)))
        await session.extract("up/ok.tar", _tar({"d": None, "d/a.txt": b"a", "b.txt": b"b"}))
        assert (store / "up" / "d" / "a.txt").read_bytes() == b"a" and (store / "up" / "b.txt").read_bytes() == b"b"
        packed = io.BytesIO()
        with zipfile.ZipFile(packed, "w") as archive:
            archive.writestr("z/one.txt", b"one")
        packed.seek(0)
        await session.extract("zipped/ok.zip", packed)
        assert (store / "zipped" / "z" / "one.txt").read_bytes() == b"one"
        os.symlink(str(tmp_path), store / "out")
        with pytest.raises(WorkspaceArchiveWriteError) as through:
            await session.extract("link.tar", _tar({"out/escaped.txt": b"x"}))
        assert through.value.context["reason"] == "symlink in parent path: out"
        assert not (tmp_path / "escaped.txt").exists()
        with pytest.raises(WorkspaceArchiveWriteError) as unsafe:
            await session.extract("abs.tar", _tar({"/abs.txt": b"x"}))
        assert unsafe.value.context["reason"] == "absolute path"


async def test_write_holds_a_chunk_of_a_large_stream_in_memory(tmp_path: Path) -> None:
    """``write`` read its stream whole (a 256 MiB archive member, 256 MiB and more of RSS);
    now a chunk at a time, through a local file the storage uploads."""

    class Zeros(io.RawIOBase):
        def __init__(self, size: int) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            count = min(len(buffer), self.left)
            buffer[:count] = bytes(count)
            self.left -= count
            return count

    client = AgentVFSSandboxClient(LocalFilesystem(str(tmp_path)))
    async with _unstarted(client) as session:
        with peak_rss_growth() as growth:
            await session.write(Path("big.bin"), io.BufferedReader(Zeros(256 << 20)))
        assert growth[0] < 96 << 20, f"writing 256 MiB grew the peak RSS by {growth[0] >> 20} MiB"
        assert (tmp_path / "big.bin").stat().st_size == 256 << 20
        await session.write(Path("small.txt"), io.BytesIO(b"small"))
        assert (tmp_path / "small.txt").read_bytes() == b"small"


async def test_a_command_past_its_timeout_is_an_error(memory_session: SandboxSession) -> None:
    with pytest.raises(ExecTimeoutError):
        await memory_session.exec("sleep 5", timeout=0.3)
    assert (await memory_session.exec("echo still alive")).stdout == b"still alive\n"


@needs_bwrap
async def test_commands_are_isolated_by_bubblewrap(
    memory_session: SandboxSession, tmp_path: Path
) -> None:
    outside = tmp_path / "host.txt"
    result = await memory_session.exec(
        f"echo x > {outside}; cat /etc/hostname >/dev/null; echo done"
    )
    assert b"done" in result.stdout
    assert not outside.exists()
    net = await memory_session.exec("cat /proc/net/dev | wc -l")
    assert int(net.stdout) <= 3, "the sandbox has a network interface besides lo"


async def test_users_are_refused_with_a_clear_error(memory_session: SandboxSession) -> None:
    with pytest.raises(ValueError, match="one user"):
        await memory_session.exec("id", user=User(name="nobody"))
    with pytest.raises(ValueError, match="one user"):
        await memory_session.read(Path("x"), user="nobody")


async def test_unsupported_manifests_are_refused_naming_the_entry() -> None:
    client = AgentVFSSandboxClient()
    with pytest.raises(ValueError, match="'repo' of type 'git_repo'"):
        await client.create(
            manifest=Manifest(entries={"repo": GitRepo(repo="openai/x", ref="main")})
        )
    with pytest.raises(ValueError, match="'data' of type 'r2_mount'"):
        await client.create(
            manifest=Manifest(
                entries={
                    "data": R2Mount(
                        bucket="b",
                        account_id="a",
                        mount_strategy=InContainerMountStrategy(pattern=RcloneMountPattern()),
                    )
                }
            )
        )
    with pytest.raises(ValueError, match=r"leave Manifest\.root at its default"):
        await client.create(manifest=Manifest(root="/srv/elsewhere"))
    with pytest.raises(ValueError, match="users or groups"):
        await client.create(manifest=Manifest(users=[User(name="alice")]))


@pytest.mark.s3
async def test_an_s3_mount_entry_is_served_by_an_agentvfs_mount(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    prefix = unique("oa-mount")
    raw.pipe(f"{S3_BUCKET}/{prefix}/in/seed.txt", b"from the bucket\n")
    # No credentials on the entry (moto's come from the environment), so the SDK asks for no
    # exposure acknowledgement; the strategy is what the SDK requires, and is not used.
    mount = S3Mount(
        bucket=S3_BUCKET,
        prefix=f"{prefix}/",
        endpoint_url=moto.endpoint_url,
        region="us-east-1",
        read_only=False,
        mount_strategy=InContainerMountStrategy(pattern=RcloneMountPattern()),
    )
    client = AgentVFSSandboxClient()
    live = await client.create(
        manifest=Manifest(entries={"notes.txt": File(content=b"n\n"), "data": mount})
    )
    try:
        async with live:
            result = await live.exec(
                "cat data/in/seed.txt && printf 'from the sandbox\\n' > data/out.txt && cat notes.txt"
            )
            assert result.exit_code == 0, result.stderr
            assert result.stdout == b"from the bucket\nn\n"
            # The file API names the same objects through the mount point.
            assert await _text(live, "data/out.txt") == "from the sandbox\n"
            # The bucket is not part of the workspace's snapshot.
            with tarfile.open(fileobj=await live.persist_workspace()) as snapshot:
                assert not any(name.startswith("data/") for name in snapshot.getnames())
    finally:
        await client.delete(live)
    assert not os.path.exists(_inner(live).state.working_directory), (
        "delete left the host directory"
    )
    check = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    assert check.cat(f"{S3_BUCKET}/{prefix}/out.txt") == b"from the sandbox\n"
    assert check.cat(f"{S3_BUCKET}/{prefix}/in/seed.txt") == b"from the bucket\n"


@pytest.mark.gcs
async def test_a_gcs_mount_entry_is_served_by_an_agentvfs_mount(fake_gcs: FakeGcsServer) -> None:
    raw = fake_gcs.gcsfs()
    prefix = unique("oa-mount")
    raw.pipe(f"{GCS_BUCKET}/{prefix}/seed.txt", b"from gcs\n")
    mount = GCSMount(
        bucket=GCS_BUCKET,
        prefix=prefix,
        endpoint_url=fake_gcs.endpoint_url,
        read_only=False,
        mount_strategy=InContainerMountStrategy(pattern=RcloneMountPattern()),
    )
    client = AgentVFSSandboxClient()
    live = await client.create(manifest=Manifest(entries={"gcs": mount}))
    try:
        async with live:
            result = await live.exec("cat gcs/seed.txt && echo back > gcs/back.txt")
            assert result.exit_code == 0, result.stderr
            assert result.stdout == b"from gcs\n"
    finally:
        await client.delete(live)
    assert fake_gcs.gcsfs().cat(f"{GCS_BUCKET}/{prefix}/back.txt") == b"back\n"


@pytest.mark.s3
async def test_a_read_only_s3_mount_refuses_writes(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    prefix = unique("oa-ro")
    raw.pipe(f"{S3_BUCKET}/{prefix}/seed.txt", b"seed\n")
    mount = S3Mount(
        bucket=S3_BUCKET,
        prefix=prefix,
        endpoint_url=moto.endpoint_url,
        mount_strategy=InContainerMountStrategy(pattern=RcloneMountPattern()),
    )
    client = AgentVFSSandboxClient()
    live = await client.create(manifest=Manifest(entries={"ro": mount}))
    try:
        async with live:
            result = await live.exec("cat ro/seed.txt; echo x > ro/new.txt")
            assert result.stdout == b"seed\n"
            assert result.exit_code != 0
    finally:
        await client.delete(live)
    assert not raw.exists(f"{S3_BUCKET}/{prefix}/new.txt")


# -- snapshots -----------------------------------------------------------------------------------


@pytest.fixture
def snapshot_store(moto: MotoServer) -> tuple[FsspecSnapshotStore, str]:
    prefix = f"{S3_BUCKET}/{unique('snaps')}"
    return FsspecSnapshotStore(moto.s3fs(use_listings_cache=False), root=prefix), prefix


class _Broken(io.RawIOBase):
    """A stream that gives some bytes, then fails: an upload cut off half-way."""

    def __init__(self) -> None:
        self._sent = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._sent:
            raise OSError("connection reset while reading the archive")
        self._sent = True
        buffer[:4] = b"half"
        return 4


@pytest.mark.s3
async def test_snapshot_store_round_trip_and_failed_upload(
    snapshot_store: tuple[FsspecSnapshotStore, str], moto: MotoServer
) -> None:
    store, prefix = snapshot_store
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    assert not await store.exists("s1")
    await store.upload("s1", io.BytesIO(b"tar v1"))
    assert raw.cat(f"{prefix}/s1.tar") == b"tar v1"
    assert await store.exists("s1")
    assert (await store.download("s1")).read() == b"tar v1"
    # A failed upload raises and leaves the previous snapshot whole.
    with pytest.raises(OSError, match="connection reset"):
        await store.upload("s1", io.BufferedReader(_Broken()))
    assert raw.cat(f"{prefix}/s1.tar") == b"tar v1"
    with pytest.raises(OSError, match="connection reset"):
        await store.upload("s2", io.BufferedReader(_Broken()))
    assert not await store.exists("s2")
    assert sorted(raw.ls(prefix, detail=False)) == [f"{prefix}/s1.tar"]
    # Through the SDK: RemoteSnapshot reports the failure as SnapshotPersistError.
    deps = Dependencies().bind_value("snaps", store)
    snapshot = RemoteSnapshotSpec(client_dependency_key="snaps").build("s3")
    with pytest.raises(SnapshotPersistError):
        await snapshot.persist(io.BufferedReader(_Broken()), dependencies=deps)
    assert not await snapshot.restorable(dependencies=deps)
    # A bucket that does not exist is an error, not a silent success.
    missing = FsspecSnapshotStore(
        moto.s3fs(use_listings_cache=False), root=f"no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    )
    with pytest.raises(Exception) as caught:
        await missing.upload("s1", io.BytesIO(b"x"))
    assert "s1.tar" in str(caught.value)
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="one path segment"):
            await store.upload(bad, io.BytesIO(b"x"))


@pytest.mark.s3
async def test_stop_persists_and_resume_restores_from_the_remote_snapshot(
    snapshot_store: tuple[FsspecSnapshotStore, str], moto: MotoServer
) -> None:
    store, prefix = snapshot_store
    client = AgentVFSSandboxClient(dependencies=Dependencies().bind_value("snaps", store))
    spec = RemoteSnapshotSpec(client_dependency_key="snaps")
    first = await client.create(
        snapshot=spec, manifest=Manifest(entries={"m.txt": File(content=b"m\n")})
    )
    async with first:
        await first.exec("mkdir -p work && echo progress > work/state.txt")
    payload = json.loads(json.dumps(client.serialize_session_state(first.state)))
    await client.delete(first)
    snapshot_id = str(first.state.session_id)
    raw = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    with tarfile.open(fileobj=io.BytesIO(raw.cat(f"{prefix}/{snapshot_id}.tar"))) as tar:
        assert {"m.txt", "work/state.txt"} <= set(tar.getnames())
    # Another client (another process, in effect): the default memory storage is empty, so
    # the files come back from the snapshot in the bucket.
    other = AgentVFSSandboxClient(dependencies=Dependencies().bind_value("snaps", store))
    resumed = await other.resume(other.deserialize_session_state(payload))
    async with resumed:
        assert (await resumed.exec("cat work/state.txt m.txt")).stdout == b"progress\nm\n"
    await other.delete(resumed)


# -- agent runs ----------------------------------------------------------------------------------


@pytest.mark.s3
async def test_runner_with_a_sandbox_agent_writes_into_the_bucket(moto: MotoServer) -> None:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('run')}"
    client = AgentVFSSandboxClient(FsspecFilesystem(raw, root=prefix))
    tools = await function_tools(Workspace(filesystem=FsspecFilesystem(raw, root=prefix)))
    model = ScriptedModel(
        [
            [
                function_call(
                    "exec_command", {"cmd": "echo from-shell > shell.txt && ls"}, call_id="c1"
                )
            ],
            [
                function_call(
                    "mastra_workspace_write_file",
                    {"path": "reports/tool.txt", "content": "from a tool\n", "overwrite": None},
                    call_id="c2",
                )
            ],
            [function_call("mastra_workspace_read_file", {"path": "shell.txt"}, call_id="c3")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(name="writer", model=model, tools=list[Any](tools))
    config = RunConfig(tracing_disabled=True, sandbox=SandboxRunConfig(client=client))
    result = await Runner.run(agent, "write two files", run_config=config)
    assert result.final_output == "done"
    outputs = [
        str(getattr(item, "output", ""))
        for item in result.new_items
        if type(item).__name__ == "ToolCallOutputItem"
    ]
    assert "shell.txt" in outputs[0]
    assert "from-shell" in outputs[2]
    check = moto.s3fs(use_listings_cache=False, skip_instance_cache=True)
    assert check.cat(f"{prefix}/shell.txt") == b"from-shell\n"
    assert check.cat(f"{prefix}/reports/tool.txt") == b"from a tool\n"


@pytest.fixture
def memory_workspace() -> Workspace:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/w")
    return Workspace(filesystem=fs)


async def test_function_tools_dispatch_and_return_errors_as_text(
    memory_workspace: Workspace,
) -> None:
    tools = await function_tools(memory_workspace)
    by_name = {tool.name: tool for tool in tools}
    assert set(by_name) == set(await memory_workspace.create_tools())
    write = by_name["mastra_workspace_write_file"]
    assert write.strict_json_schema and write.params_json_schema["additionalProperties"] is False
    model = ScriptedModel(
        [
            [
                function_call(
                    "mastra_workspace_write_file",
                    {"path": "a.txt", "content": "A\n", "overwrite": None},
                    call_id="w",
                )
            ],
            [function_call("mastra_workspace_read_file", {"path": "missing.txt"}, call_id="r")],
            [assistant_message("ok")],
        ]
    )
    result = await Runner.run(
        Agent(name="t", model=model, tools=list(tools)), "go", run_config=NO_TRACING
    )
    outputs = [
        str(getattr(item, "output", ""))
        for item in result.new_items
        if type(item).__name__ == "ToolCallOutputItem"
    ]
    assert outputs[0] == "Wrote 2 bytes to a.txt"
    assert outputs[1].startswith("Error: ") and "missing.txt" in outputs[1]
    assert await memory_workspace.filesystem.read_file("a.txt", encoding="utf-8") == "A\n"  # type: ignore[union-attr]

    async def call(name: str, arguments: str) -> Any:
        context = ToolContext(
            context=None, tool_name=name, tool_call_id="x", tool_arguments=arguments
        )
        return await by_name[name].on_invoke_tool(context, arguments)

    assert "not valid JSON" in await call("mastra_workspace_read_file", "{not json")
    assert "must be a JSON object" in await call("mastra_workspace_read_file", "[1]")
    assert (await call("mastra_workspace_read_file", '{"path": 7}')).startswith("Error: ")
    with pytest.raises(KeyError, match="no such workspace tool: nope"):
        await function_tools(memory_workspace, names=["nope"])


async def test_require_approval_becomes_needs_approval() -> None:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/w")
    config = {
        "mastra_workspace_write_file": {"require_approval": True},
        "mastra_workspace_delete": {
            "require_approval": lambda ctx: ctx["args"]["path"].startswith("important")
        },
    }
    tools = {
        tool.name: tool for tool in await function_tools(Workspace(filesystem=fs, tools=config))
    }
    assert tools["mastra_workspace_read_file"].needs_approval is False
    policy = tools["mastra_workspace_delete"].needs_approval
    assert callable(policy)
    wrapper = RunContextWrapper(context=None)
    assert await policy(wrapper, {"path": "important.txt", "recursive": None}, "c") is True
    assert await policy(wrapper, {"path": "scratch.txt", "recursive": None}, "c") is False
    # In a run, the call waits for approval and nothing is written.
    model = ScriptedModel(
        [
            [
                function_call(
                    "mastra_workspace_write_file",
                    {"path": "x.txt", "content": "x", "overwrite": None},
                    call_id="w",
                )
            ]
        ]
    )
    agent = Agent(name="t", model=model, tools=list(tools.values()))
    result = await Runner.run(agent, "go", run_config=NO_TRACING)
    assert [item.name for item in result.interruptions] == ["mastra_workspace_write_file"]
    assert not await fs.exists("x.txt")


# -- adapted from the SDK's tests/sandbox/test_unix_local.py -------------------------------------


async def test_host_path_grants_are_refused_before_the_workspace_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    client = AgentVFSSandboxClient()
    grant = SandboxPathGrant(path="/mnt/shared-data", host_path=str(tmp_path))
    with pytest.raises(ValueError, match="host_path"):
        await client.create(manifest=Manifest(extra_path_grants=(grant,)))
    assert made == [], "a refused manifest still created a host directory"
    # The same manifest without host_path is accepted (the grant alone is not the problem).
    live = await client.create(manifest=Manifest(extra_path_grants=(SandboxPathGrant(path="/mnt"),)))
    assert len(made) == 1
    await client.delete(live)
    assert not os.path.exists(made[0])


async def test_user_scoped_file_operations_are_refused_and_change_nothing(
    memory_session: SandboxSession,
) -> None:
    await memory_session.write(Path("stale.txt"), io.BytesIO(b"stale"))
    for user in ("sandbox-user", User(name="sandbox-user")):
        with pytest.raises(ValueError, match="one user"):
            await memory_session.mkdir("nested", user=user)
        with pytest.raises(ValueError, match="one user"):
            await memory_session.rm("stale.txt", user=user)
        with pytest.raises(ValueError, match="one user"):
            await memory_session.ls(".", user=user)
    names = {entry.name for entry in await _inner(memory_session).filesystem.readdir("")}
    assert names == {"stale.txt"}
    assert await _text(memory_session, "stale.txt") == "stale"


async def test_pty_is_not_offered_so_the_shell_tool_runs_commands_whole(
    memory_session: SandboxSession,
) -> None:
    assert memory_session.supports_pty() is False
    with pytest.raises(NotImplementedError):
        await memory_session.pty_exec_start("sleep", "1", shell=False, tty=True)
    shell = Shell()
    shell.bind(_inner(memory_session))
    shell_tools = {tool.name for tool in shell.tools()}
    assert "write_stdin" not in shell_tools
    # Without a PTY a command still runs to the end and returns its output.
    result = await memory_session.exec("printf ready; sleep 0.2; printf ' done'")
    assert (result.stdout, result.exit_code) == (b"ready done", 0)


# -- adapted from the SDK's integration_tests (_helpers.py, test_runner_pause_resume.py) ---------


_DURABLE = {
    "inline.txt": "inline file v1\n",
    "delete_me.txt": "delete me v1\n",
    "tree/nested.txt": "nested file v1\n",
    "copied_file.txt": "local file source v1\n",
    "copied_dir/child.txt": "local dir child v1\n",
    "copied_dir/nested/grandchild.txt": "local dir grandchild v1\n",
}
_EPHEMERAL = {"tree/ephemeral.txt": "ephemeral file v1\n"}
_RUNTIME = {"runtime_note.txt": "runtime note v1\n"}
_PATCHED = {"inline.txt": "inline file v2\n", "created_by_patch.txt": "created by patch"}
_ARCHIVED = {"archive_dir/hello.txt": "hello from tar archive\n"}
_RESTORED_DIRS = {"archive_dir", "copied_dir", "copied_dir/nested", "tree"}
_RESTORED_FILES = {
    "archive_dir/hello.txt",
    "bundle.tar",
    "copied_dir/child.txt",
    "copied_dir/nested/grandchild.txt",
    "copied_file.txt",
    "created_by_patch.txt",
    "inline.txt",
    "runtime_note.txt",
    "tree/ephemeral.txt",
    "tree/nested.txt",
}


def _lifecycle_manifest(sources: Path) -> Manifest:
    (sources / "local-dir/nested").mkdir(parents=True)
    (sources / "local-file.txt").write_text(_DURABLE["copied_file.txt"])
    (sources / "local-dir/child.txt").write_text(_DURABLE["copied_dir/child.txt"])
    (sources / "local-dir/nested/grandchild.txt").write_text(
        _DURABLE["copied_dir/nested/grandchild.txt"]
    )
    return Manifest(
        extra_path_grants=(SandboxPathGrant(path=str(sources)),),
        entries={
            "inline.txt": File(content=_DURABLE["inline.txt"].encode()),
            "delete_me.txt": File(content=_DURABLE["delete_me.txt"].encode()),
            "tree": Dir(
                children={
                    "nested.txt": File(content=_DURABLE["tree/nested.txt"].encode()),
                    "ephemeral.txt": File(
                        content=_EPHEMERAL["tree/ephemeral.txt"].encode(), ephemeral=True
                    ),
                }
            ),
            "copied_file.txt": LocalFile(src=sources / "local-file.txt"),
            "copied_dir": LocalDir(src=sources / "local-dir"),
        },
    )


async def _expect_texts(session: BaseSandboxSession, expected: Mapping[str, str]) -> None:
    assert {path: await _text(session, path) for path in expected} == dict(expected)  # type: ignore[arg-type]


async def _expect_missing(session: BaseSandboxSession, path: str) -> None:
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path(path))


async def _tree(session: BaseSandboxSession) -> tuple[set[str], set[str]]:
    root = Path(session.state.manifest.root)
    dirs: set[str] = set()
    files: set[str] = set()

    async def walk(path: Path) -> None:
        for entry in await session.ls(path):
            relative = Path(entry.path).relative_to(root).as_posix()
            if entry.kind == EntryKind.DIRECTORY:
                dirs.add(relative)
                await walk(Path(relative))
            else:
                assert entry.kind == EntryKind.FILE, (relative, entry.kind)
                files.add(relative)

    await walk(Path("."))
    return dirs, files


async def _expect_escapes_blocked(session: BaseSandboxSession) -> None:
    for path in ("../outside.txt", "/tmp/agentvfs-sandbox-outside.txt"):
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path(path))
        with pytest.raises(InvalidManifestPathError):
            await session.write(Path(path), io.BytesIO(b"outside write\n"))
        with pytest.raises((ApplyPatchPathError, InvalidManifestPathError)):
            await session.apply_patch(
                ApplyPatchOperation(type="create_file", path=path, diff="+outside patch\n")
            )
    assert not os.path.exists("/tmp/agentvfs-sandbox-outside.txt")
    # A symlink out of the workspace, made by a command: the file API must not follow it.
    root = Path(session.state.manifest.root)
    outside = root.parent / "symlink-outside.txt"
    outside.write_text("outside symlink target\n")
    try:
        made = await session.exec(f"ln -s {outside} symlink_escape.txt")
        if made.exit_code == 0:
            with pytest.raises((InvalidManifestPathError, WorkspaceReadNotFoundError)):
                await session.read(Path("symlink_escape.txt"))
            with pytest.raises((InvalidManifestPathError, WorkspaceArchiveWriteError)):
                await session.write(Path("symlink_escape.txt"), io.BytesIO(b"through the link\n"))
            await session.exec("rm -f symlink_escape.txt")
        assert outside.read_text() == "outside symlink target\n"
    finally:
        outside.unlink(missing_ok=True)


class _LifecycleProbe(Capability):
    """Tools that run the lifecycle steps against the bound session and report each one."""

    type: str = "agentvfs-lifecycle-probe"

    def _live(self) -> BaseSandboxSession:
        assert self.session is not None, "the probe is not bound to a session"
        return self.session

    def tools(self) -> list[Tool]:
        @function_tool(name_override="check_manifest", failure_error_function=None)
        async def check_manifest() -> str:
            await _expect_texts(self._live(), {**_DURABLE, **_EPHEMERAL})
            return "manifest materialized"

        @function_tool(name_override="write_note", failure_error_function=None)
        async def write_note() -> str:
            await self._live().write(
                Path("runtime_note.txt"), io.BytesIO(_RUNTIME["runtime_note.txt"].encode())
            )
            return "note written"

        @function_tool(name_override="patch", failure_error_function=None)
        async def patch() -> str:
            live = self._live()
            outcome = await live.apply_patch(
                [
                    ApplyPatchOperation(
                        type="update_file",
                        path="inline.txt",
                        diff="@@\n-inline file v1\n+inline file v2\n",
                    ),
                    ApplyPatchOperation(
                        type="create_file", path="created_by_patch.txt", diff="+created by patch\n"
                    ),
                    ApplyPatchOperation(type="delete_file", path="delete_me.txt"),
                ]
            )
            assert outcome == "Done!"
            await _expect_texts(live, _PATCHED)
            await _expect_missing(live, "delete_me.txt")
            return "patched"

        @function_tool(name_override="check_escapes", failure_error_function=None)
        async def check_escapes() -> str:
            await _expect_escapes_blocked(self._live())
            return "escapes blocked"

        @function_tool(name_override="extract", failure_error_function=None)
        async def extract() -> str:
            live = self._live()
            await live.extract("bundle.tar", _tar({k: v.encode() for k, v in _ARCHIVED.items()}))
            await _expect_texts(live, _ARCHIVED)
            return "extracted"

        @function_tool(name_override="check_restored", failure_error_function=None)
        async def check_restored() -> str:
            live = self._live()
            kept = {k: v for k, v in _DURABLE.items() if k != "delete_me.txt"}
            await _expect_texts(live, {**kept, **_RUNTIME, **_PATCHED, **_ARCHIVED, **_EPHEMERAL})
            await _expect_missing(live, "delete_me.txt")
            assert await _tree(live) == (_RESTORED_DIRS, _RESTORED_FILES)
            return "restored"

        return [check_manifest, write_note, patch, check_escapes, extract, check_restored]


def _outputs(result: Any) -> list[str]:
    return [
        str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
    ]


async def test_a_paused_run_resumes_with_the_workspace_restored_from_the_snapshot(
    storage: Storage, tmp_path: Path
) -> None:
    # Each session gets a fresh in-memory workspace (the client's default), so after the
    # pause nothing survives but the snapshot, kept in the backend under test.
    store = FsspecSnapshotStore(storage.filesystem)
    client = AgentVFSSandboxClient(dependencies=Dependencies().bind_value("snaps", store))
    sources = tmp_path / "sources"
    manifest = _lifecycle_manifest(sources)
    config = RunConfig(
        tracing_disabled=True,
        sandbox=SandboxRunConfig(
            client=client, snapshot=RemoteSnapshotSpec(client_dependency_key="snaps")
        ),
    )

    @function_tool(name_override="approval_tool", needs_approval=True)
    def approval_tool() -> str:
        return "approved"

    def agent(model: ScriptedModel) -> SandboxAgent:
        return SandboxAgent(
            name="sandbox",
            model=model,
            default_manifest=manifest,
            tools=[approval_tool],
            capabilities=[_LifecycleProbe()],
        )

    steps = ["check_manifest", "write_note", "patch", "check_escapes", "extract"]
    first_agent = agent(
        ScriptedModel(
            [[function_call(name, {}, call_id=f"c-{name}")] for name in steps]
            + [[function_call("approval_tool", {}, call_id="c-approval")]]
        )
    )
    first = await Runner.run(first_agent, "run the lifecycle", run_config=config)
    assert _outputs(first) == [
        "manifest materialized",
        "note written",
        "patched",
        "escapes blocked",
        "extracted",
    ]
    assert len(first.interruptions) == 1
    state = first.to_state()
    assert state._sandbox is not None and state._sandbox["backend_id"] == "agentvfs"
    session_state = state._sandbox["session_state"]
    assert isinstance(session_state, dict)
    snapshot_id = session_state["snapshot"]["id"]
    # The pause stopped the session: its snapshot is in the backend, its host directory gone.
    with tarfile.open(fileobj=io.BytesIO(storage.read_raw(f"{snapshot_id}.tar"))) as tar:
        assert {"runtime_note.txt", "created_by_patch.txt", "archive_dir/hello.txt"} <= set(
            tar.getnames()
        )
    assert not os.path.exists(session_state["working_directory"])

    second_agent = agent(
        ScriptedModel(
            [
                [function_call("check_restored", {}, call_id="c-restored")],
                [assistant_message("done")],
            ]
        )
    )
    restored = await RunState.from_json(second_agent, state.to_json())
    restored.approve(restored.get_interruptions()[0])
    second = await Runner.run(second_agent, restored, run_config=config)
    assert second.final_output == "done"
    assert _outputs(second)[-2:] == ["approved", "restored"]
    assert not os.path.exists(session_state["working_directory"])
