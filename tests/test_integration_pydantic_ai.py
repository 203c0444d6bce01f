"""The Pydantic AI adapter: its conformance suite on four storages, agent runs, bad input.

Pydantic AI's own ``WorkspaceBackendSuite`` checks every rule of its backend contract through
``AgentVFSWorkspace`` on memory, a local directory, S3 (moto) and GCS (fake-gcs-server), each
with a bubblewrap sandbox that sees the same files (the storage FUSE-mounted into it, or the
directory itself), and once more on memory without a sandbox (file operations only). Agent runs
use Pydantic AI's ``FunctionModel``: the scripted model calls the tools, no model is asked.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import posixpath
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.workspaces import (
    FileEntry,
    SupportsCommands,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceRef,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces import Workspace as PydanticWorkspace
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite
from pydantic_ai_harness import FileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, LocalSandbox, Workspace
from agentvfs.integrations.pydantic_ai import (
    DEFAULT_MAX_READ_BYTES,
    AgentVFSWorkspace,
    FileTooLargeError,
    search_toolset,
)
from agentvfs.testing import FakeGcsServer, MotoServer
from conftest import GCS_BUCKET, S3_BUCKET

pytestmark = pytest.mark.anyio

BACKENDS = ["memory", "local", "s3", "gcs"]


def _s3_options(moto: MotoServer) -> dict[str, Any]:
    return {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": moto.endpoint_url,
        "client_kwargs": {"verify": False},
        "config_kwargs": {"region_name": "us-east-1"},
    }


def _gcs_options(fake_gcs: FakeGcsServer) -> dict[str, Any]:
    return {"token": "anon", "project": "test", "endpoint_url": fake_gcs.endpoint_url}


class _Storage:
    """How to reach one storage kind: a new root on it, and the options a ref needs."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp: str) -> None:
        self.kind = kind
        self.tmp = tmp
        self.options: dict[str, Any] = {}
        if kind == "s3":
            self.options = _s3_options(request.getfixturevalue("moto"))
        elif kind == "gcs":
            self.options = _gcs_options(request.getfixturevalue("fake_gcs"))

    def url(self) -> str:
        name = f"pyd-{uuid.uuid4().hex[:10]}"
        if self.kind == "memory":
            return f"memory:///{name}"
        bucket = S3_BUCKET if self.kind == "s3" else GCS_BUCKET
        return f"{self.kind}://{bucket}/{name}"

    def workspace(self, *, sandbox: bool) -> Workspace:
        """A fresh workspace on this storage; with a bwrap sandbox that sees the same files."""
        name = f"pyd-{uuid.uuid4().hex[:10]}"
        if self.kind == "local":
            directory = f"{self.tmp}/{name}"
            fs = LocalFilesystem(directory)
            if not sandbox:
                return Workspace(filesystem=fs)
            return Workspace(
                filesystem=fs, sandbox=LocalSandbox(working_directory=directory, isolation="bwrap")
            )
        storage = FsspecFilesystem(self.url(), storage_options=dict(self.options))
        if not sandbox:
            return Workspace(filesystem=storage)
        sbx = LocalSandbox(working_directory=f"{self.tmp}/{name}", isolation="bwrap")
        return Workspace(sandbox=sbx, mounts={"/data": storage})


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("pydantic-ai"))


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module-wide, so class-scoped async fixtures may use it (see _Suite._made).
    return "asyncio"


class _Suite(WorkspaceBackendSuite):
    """The conformance suite, with a backend shared by a class (one sandbox and mount)."""

    kind = "memory"
    sandbox = True

    @pytest.fixture(scope="class")
    @classmethod
    def storage(cls, request: pytest.FixtureRequest, module_tmp: str) -> _Storage:
        return _Storage(cls.kind, request, module_tmp)

    @pytest.fixture(scope="class")
    @classmethod
    async def _made(cls, storage: _Storage) -> AsyncIterator[list[AgentVFSWorkspace]]:
        # An async fixture of the class holds anyio's test runner, so every rule of the class
        # runs in one event loop, as one agent's calls do: the shared sandbox, its mounts and
        # the storage clients stay in the loop they started in.
        made: list[AgentVFSWorkspace] = []
        yield made
        for backend in made:
            await backend.aclose()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, storage: _Storage, _made: list[AgentVFSWorkspace]) -> AgentVFSWorkspace:
        backend = AgentVFSWorkspace(storage.workspace(sandbox=cls.sandbox))
        _made.append(backend)
        return backend

    @pytest.fixture
    def can_detect_exit_with_inherited_output_pipes(self) -> bool:
        # LocalSandbox waits for the output pipes to close (a background child holding them
        # keeps the command running); without this override the rule waits 60 s, then fails.
        return False

    async def test_permission_denied_uses_builtin_error(
        self,
        backend: WorkspaceBackend,
        has_real_posix_shell: bool,
        filesystem_honors_shell_permissions: bool,
    ) -> None:
        if os.geteuid() == 0:
            # File operations run as this process; bubblewrap's command user is uid 1000 in
            # its namespace but root outside it, so the suite's `id -u` check does not see that
            # root reads a file the command made unreadable. As another user the rule runs.
            pytest.skip("tests run as root: root's file operations bypass permissions")
        await super().test_permission_denied_uses_builtin_error(
            backend, has_real_posix_shell, filesystem_honors_shell_permissions
        )

    async def test_cancellation_stops_foreground_work(
        self, backend: WorkspaceBackend, has_real_posix_shell: bool
    ) -> None:
        """The suite's rule, with a heartbeat file instead of ``kill -0 $pid``: each bubblewrap
        command has a PID namespace of its own, so a pid read from one command names another
        process (or none) in the next. The command is stopped when the file stops changing."""
        if not isinstance(backend, SupportsCommands):
            pytest.skip("backend does not implement SupportsCommands")
        commands = backend
        workspace = PydanticWorkspace(backend)
        root = posixpath.join(await workspace.working_dir(), f"cancel-{uuid.uuid4().hex}")
        await workspace.make_dir(root)
        beat = posixpath.join(root, "beat")
        script = 'i=0; while :; do i=$((i+1)); echo $i > "$1"; sleep 0.05; done'

        async def command() -> None:
            await commands.run(["sh", "-c", script, "sh", beat])

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(command)
                with anyio.fail_after(10):
                    while not await workspace.exists(beat):  # noqa: ASYNC110 (polls another process)
                        await anyio.sleep(0.05)
                group.cancel_scope.cancel()
            await anyio.sleep(0.3)  # a beat that was being written lands
            before = await workspace.read_bytes(beat)
            await anyio.sleep(0.5)  # ten beats, had the loop survived
            assert await workspace.read_bytes(beat) == before
        finally:
            await workspace.remove(root)

    @pytest.fixture
    def fresh_backend(
        self, storage: _Storage, _made: list[AgentVFSWorkspace]
    ) -> Callable[[], WorkspaceBackend]:
        def make() -> WorkspaceBackend:
            backend = AgentVFSWorkspace(storage.workspace(sandbox=self.sandbox))
            _made.append(backend)
            return backend

        return make

    @pytest.fixture
    def attach_backend(
        self, storage: _Storage, _made: list[AgentVFSWorkspace]
    ) -> Callable[[WorkspaceRef], WorkspaceBackend]:
        def attach(ref: WorkspaceRef) -> WorkspaceBackend:
            backend = AgentVFSWorkspace.from_ref(ref, storage_options=storage.options)
            _made.append(backend)
            return backend

        return attach

    @pytest.fixture
    def destroy_environment(self) -> Callable[[WorkspaceBackend], Awaitable[None]] | None:
        async def destroy(backend: WorkspaceBackend) -> None:
            assert isinstance(backend, AgentVFSWorkspace)
            fs = backend.workspace.filesystem
            assert fs is not None
            # The environment is the storage root: remove it whole.
            if self.kind == "local":
                assert isinstance(fs, LocalFilesystem)
                await anyio.to_thread.run_sync(_rmtree, fs.base_path)
            else:
                assert isinstance(fs, FsspecFilesystem)
                await anyio.to_thread.run_sync(lambda: fs.fs.rm(fs.root, recursive=True))

        if self.sandbox and self.kind != "local":
            # A FUSE mount point stays a directory after its storage is emptied, so a command
            # waiting for the directory to vanish never ends: the destroy rules need the
            # directory itself to go, which only the local variant has.
            return None
        return destroy


def _xfail(base: Any, reason: str) -> Any:
    """An inherited rule, expected to fail here for ``reason`` (non-strict: it is a finding)."""

    @functools.wraps(base)
    async def rule(self: Any, *args: Any, **kwargs: Any) -> None:
        await base(self, *args, **kwargs)

    return pytest.mark.xfail(reason=reason, strict=False)(rule)


_SPECIAL_OBJECTS = (
    "adapter limit: the FUSE mount keeps a symlink or FIFO a command makes as an object with POSIX "
    "metadata; the adapter's file operations do not interpret them (realpath, following a link, "
    "refusing to read a FIFO)"
)


class _ObjectStoreSuite(_Suite):
    """S3 and GCS, mounted into the sandbox by FUSE."""

    test_fifo_read_does_not_wait_for_writer = _xfail(
        WorkspaceBackendSuite.test_fifo_read_does_not_wait_for_writer, _SPECIAL_OBJECTS
    )
    test_realpath_and_entries_follow_symlinks = _xfail(
        WorkspaceBackendSuite.test_realpath_and_entries_follow_symlinks, _SPECIAL_OBJECTS
    )
    test_writes_go_through_a_symlink = _xfail(
        WorkspaceBackendSuite.test_writes_go_through_a_symlink, _SPECIAL_OBJECTS
    )


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path)


class TestMemorySandbox(_Suite):
    kind = "memory"

    test_symlink_loop_does_not_break_listing = _xfail(
        WorkspaceBackendSuite.test_symlink_loop_does_not_break_listing,
        "memory storage holds no symlinks: the FUSE mount keeps a link a command makes in the "
        "mount only, so the file API does not list it",
    )


class TestLocalSandbox(_Suite):
    kind = "local"


@pytest.mark.s3
class TestS3Sandbox(_ObjectStoreSuite):
    kind = "s3"


@pytest.mark.gcs
class TestGcsSandbox(_ObjectStoreSuite):
    kind = "gcs"


class TestMemoryFilesOnly(_Suite):
    """No sandbox: the command rules skip (``SupportsCommands`` is absent), the rest run."""

    kind = "memory"
    sandbox = False


# -- agent runs -----------------------------------------------------------------------------------------


def _script(*calls: tuple[str, dict[str, Any]]) -> FunctionModel:
    """A model that makes ``calls`` one turn each, then answers with the last tool result."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for message in messages if isinstance(message, ModelResponse))
        if turn < len(calls):
            name, args = calls[turn]
            return ModelResponse(parts=[ToolCallPart(name, json.dumps(args))])
        returns = [
            p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart(str(returns[-1].content) if returns else "no tools")])

    return FunctionModel(respond)


@pytest.mark.s3
async def test_agent_writes_an_object_to_s3_through_the_filesystem_capability(
    moto: MotoServer,
) -> None:
    """The harness's FileSystem write tool, on an AgentVFSWorkspace over S3, puts the object in
    the bucket: read back with a raw s3fs client that knows nothing of agentvfs."""
    prefix = f"pyd-agent-{uuid.uuid4().hex[:10]}"
    fs = FsspecFilesystem(f"s3://{S3_BUCKET}/{prefix}", storage_options=_s3_options(moto))
    backend = AgentVFSWorkspace(Workspace(filesystem=fs))
    agent = Agent(
        _script(
            ("create_directory", {"path": "reports"}),
            ("write_file", {"path": "reports/q3.md", "content": "# Q3\nrevenue up\n"}),
        ),
        capabilities=[FileSystem()],
    )
    try:
        result = await agent.run("write the report", workspace=backend)
    finally:
        await backend.aclose()
    raw = moto.s3fs()
    assert raw.cat_file(f"{S3_BUCKET}/{prefix}/reports/q3.md") == b"# Q3\nrevenue up\n"
    assert "q3.md" in result.output
    assert (
        backend.ref is not None
        and json.loads(backend.ref.id)["storage"] == f"s3://{S3_BUCKET}/{prefix}"
    )


async def test_agent_reads_and_lists_through_the_filesystem_capability() -> None:
    """Reads and listings of the harness's tools come from the agentvfs storage (memory)."""
    fs = FsspecFilesystem(f"memory:///pyd-read-{uuid.uuid4().hex[:10]}")
    await fs.write_file("notes/todo.txt", "ship the adapter\n")
    backend = AgentVFSWorkspace(Workspace(filesystem=fs))
    agent = Agent(_script(("read_file", {"path": "notes/todo.txt"})), capabilities=[FileSystem()])
    result = await agent.run("read my notes", workspace=backend)
    await backend.aclose()
    assert "ship the adapter" in result.output


async def test_agent_searches_with_the_search_toolset() -> None:
    """search_toolset hands agentvfs's BM25 search to the agent; the hit is the indexed file."""
    fs = FsspecFilesystem(f"memory:///pyd-search-{uuid.uuid4().hex[:10]}")
    await fs.write_file("docs/mount.md", "Mounting a bucket: agentvfs mount s3://bucket /mnt\n")
    await fs.write_file("docs/other.md", "Nothing relevant here about cooking pasta.\n")
    async with Workspace(filesystem=fs, bm25=True, auto_index_paths=["docs"]) as ws:
        toolset = await search_toolset(ws)
        agent = Agent(
            _script(("mastra_workspace_search", {"query": "mount bucket"})), toolsets=[toolset]
        )
        result = await agent.run("how do I mount a bucket?")
    assert "docs/mount.md" in result.output
    assert "pasta" not in result.output.split("docs/mount.md")[0]


async def test_writes_through_the_backend_keep_the_search_index_current() -> None:
    """With ``tools={"auto_reindex": True}`` a file the backend rewrites is found by the search
    tool right after, its old words are gone, and a removed file leaves the index; as with
    agentvfs's own write tools, a file the index does not hold stays out of it."""
    fs = FsspecFilesystem(f"memory:///pyd-reindex-{uuid.uuid4().hex[:10]}")
    await fs.write_file("docs/mount.md", "Cooking pasta takes ten minutes.\n")
    ws = Workspace(
        filesystem=fs, bm25=True, auto_index_paths=["docs"], tools={"auto_reindex": True}
    )
    async with ws:
        backend = AgentVFSWorkspace(ws)
        wd = await backend.working_dir()
        toolset = await search_toolset(ws)
        await backend.write_bytes(
            f"{wd}/docs/mount.md", b"Mounting a bucket: agentvfs mount s3://bucket /mnt\n"
        )
        agent = Agent(
            _script(("mastra_workspace_search", {"query": "mount bucket"})), toolsets=[toolset]
        )
        assert "docs/mount.md" in (await agent.run("how do I mount a bucket?")).output
        assert await ws.search("pasta") == []
        await backend.write_bytes(f"{wd}/docs/new.md", b"a brand new page about buckets\n")
        assert await ws.search("brand") == []  # not indexed before: left alone
        await backend.remove(f"{wd}/docs/mount.md")
        assert await ws.search("mount bucket") == []


async def test_without_auto_reindex_backend_writes_leave_the_index_alone() -> None:
    fs = FsspecFilesystem(f"memory:///pyd-reindex-{uuid.uuid4().hex[:10]}")
    await fs.write_file("docs/a.md", "old words\n")
    async with Workspace(filesystem=fs, bm25=True, auto_index_paths=["docs"]) as ws:
        backend = AgentVFSWorkspace(ws)
        await backend.write_bytes(f"{await backend.working_dir()}/docs/a.md", b"fresh words\n")
        assert [r.id for r in await ws.search("old")] == ["docs/a.md"]
        assert await ws.search("fresh") == []


async def test_listing_entries_equal_those_the_constructor_makes() -> None:
    """A listing's entries are built without FileEntry's __init__ (for speed): they must be
    the very objects the constructor makes, equal, hashable and frozen."""
    fs = FsspecFilesystem(f"memory:///pyd-list-{uuid.uuid4().hex[:10]}")
    await fs.write_file("d/f.txt", b"abc")
    backend = AgentVFSWorkspace(Workspace(filesystem=fs))
    wd = await backend.working_dir()
    entries = await backend.list_dir(f"{wd}/d/")
    assert entries == [FileEntry(name="f.txt", path=f"{wd}/d/f.txt", is_dir=False, size=3)]
    assert entries[0] == await backend.stat(f"{wd}/d/f.txt")
    assert hash(entries[0]) == hash(await backend.stat(f"{wd}/d/f.txt"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        entries[0].size = 4
    assert await backend.list_dir(wd) == [
        FileEntry(name="d", path=f"{wd}/d", is_dir=True, size=None)
    ]
    await backend.aclose()


async def test_search_tool_errors_reach_the_model_as_text() -> None:
    """A failing tool call (here a bad mode) is an ``Error: ...`` result, not a crashed run."""
    fs = FsspecFilesystem(f"memory:///pyd-search-{uuid.uuid4().hex[:10]}")
    await fs.write_file("a.md", "alpha\n")
    async with Workspace(filesystem=fs, bm25=True, auto_index_paths=["."]) as ws:
        toolset = await search_toolset(ws)
        agent = Agent(
            _script(("mastra_workspace_search", {"query": "alpha", "mode": "telepathy"})),
            toolsets=[toolset],
        )
        result = await agent.run("search")
    assert result.output.startswith("Error:")


async def test_ref_reattaches_in_a_new_backend_on_local_disk(tmp_path: Any) -> None:
    """A backend rebuilt from the ref alone (as another process would) sees the same files."""
    backend = AgentVFSWorkspace(Workspace(filesystem=LocalFilesystem(str(tmp_path / "ws"))))
    wd = await backend.working_dir()
    await backend.write_bytes(f"{wd}/kept.txt", b"kept")
    assert backend.ref is not None
    # Only the ref's two strings travel, as they would to another process.
    wire = json.loads(json.dumps({"provider": backend.ref.provider, "id": backend.ref.id}))
    ref = WorkspaceRef(provider=wire["provider"], id=wire["id"])
    attached = AgentVFSWorkspace.from_ref(ref)
    assert await attached.read_bytes(f"{wd}/kept.txt") == b"kept"
    assert (tmp_path / "ws" / "kept.txt").read_bytes() == b"kept"


# -- bad input ---------------------------------------------------------------------------------------


def test_not_a_workspace_is_refused() -> None:
    with pytest.raises(TypeError, match=r"agentvfs\.Workspace, not str"):
        AgentVFSWorkspace("s3://bucket")  # type: ignore[arg-type]


def test_a_workspace_without_a_filesystem_is_refused(tmp_path: Any) -> None:
    ws = Workspace(sandbox=LocalSandbox(working_directory=str(tmp_path)))
    with pytest.raises(ValueError, match="static filesystem: this one has none"):
        AgentVFSWorkspace(ws)
    resolved = Workspace(filesystem=lambda ctx: FsspecFilesystem("memory:///x"))
    with pytest.raises(ValueError, match="filesystem resolver"):
        AgentVFSWorkspace(resolved)


def test_a_filesystem_the_sandbox_cannot_see_is_refused(tmp_path: Any) -> None:
    ws = Workspace(
        filesystem=FsspecFilesystem("memory:///x"),
        sandbox=LocalSandbox(working_directory=str(tmp_path)),
    )
    with pytest.raises(ValueError, match="mounts="):
        AgentVFSWorkspace(ws)
    other = Workspace(
        filesystem=LocalFilesystem(str(tmp_path / "a")),
        sandbox=LocalSandbox(working_directory=str(tmp_path / "b")),
    )
    with pytest.raises(ValueError, match="not the sandbox's working directory"):
        AgentVFSWorkspace(other)


async def test_paths_outside_the_storage_are_refused_and_nothing_is_written() -> None:
    fs = FsspecFilesystem(f"memory:///pyd-bad-{uuid.uuid4().hex[:10]}")
    backend = AgentVFSWorkspace(Workspace(filesystem=fs))
    with pytest.raises(
        PermissionError, match="outside the workspace storage, which appears at '/workspace'"
    ):
        await backend.write_bytes("/etc/passwd", b"x")
    with pytest.raises(PermissionError, match="outside"):
        await backend.read_bytes("/workspace/../etc/passwd")
    with pytest.raises(ValueError, match="must be absolute"):
        await backend.read_bytes("relative.txt")
    with pytest.raises(ValueError, match="working directory"):
        await backend.remove("/workspace")
    assert await fs.readdir("") == []
    assert not isinstance(backend, SupportsCommands)


def test_bad_refs_are_refused() -> None:
    with pytest.raises(ValueError, match="not an agentvfs workspace ref"):
        AgentVFSWorkspace.from_ref(WorkspaceRef(provider="local", id="/tmp"))
    with pytest.raises(ValueError, match="malformed"):
        AgentVFSWorkspace.from_ref(WorkspaceRef(provider="agentvfs", id="s3://bucket"))


async def test_search_toolset_needs_search_or_skills() -> None:
    with pytest.raises(TypeError, match=r"agentvfs\.Workspace"):
        await search_toolset(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="configure search"):
        await search_toolset(Workspace(filesystem=FsspecFilesystem("memory:///pyd-none")))


async def test_attaching_to_missing_storage_is_unavailable() -> None:
    body = json.dumps(
        {"storage": f"memory:///pyd-gone-{uuid.uuid4().hex}", "working_dir": "/w", "sandbox": None}
    )
    backend = AgentVFSWorkspace.from_ref(WorkspaceRef(provider="agentvfs", id=body))
    with pytest.raises(WorkspaceUnavailableError, match="no longer exists"):
        await backend.working_dir()


# -- bounded reads, contained symlinks ------------------------------------------------------------------

GIB = 1 << 30


def _sparse(path: Any) -> None:
    """A 1 GiB file of no blocks, as ``truncate -s 1G`` in a command makes it."""
    path.write_bytes(b"")
    os.truncate(path, GIB)


# Run in a fresh interpreter, so its peak memory (ru_maxrss) is that of the reads alone.
_BIG_READ = textwrap.dedent(
    """
    import os, resource, sys, time
    import anyio
    from agentvfs import LocalFilesystem, Workspace
    from agentvfs.integrations.pydantic_ai import AgentVFSWorkspace, FileTooLargeError

    def peak_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

    async def main(directory, cap):
        backend = AgentVFSWorkspace(Workspace(filesystem=LocalFilesystem(directory)), max_read_bytes=cap)
        wd = await backend.working_dir()
        await backend.read_bytes(wd + "/small.txt")  # everything imported and warm
        before, start = peak_mib(), time.monotonic()
        try:
            await backend.read_bytes(wd + "/big.bin")
        except FileTooLargeError as exc:
            print(exc.limit, peak_mib() - before, round(time.monotonic() - start, 3))
        await backend.aclose()

    anyio.run(main, sys.argv[1], int(sys.argv[2]))
    """
)


@pytest.mark.parametrize("cap", [1 << 20, DEFAULT_MAX_READ_BYTES])
async def test_a_huge_sparse_file_is_refused_having_read_no_more_than_the_limit(
    tmp_path: Any, cap: int
) -> None:
    """A 1 GiB sparse file (made in no time, as a command can) is refused by read_bytes, and
    the host's peak memory grows by about the limit, not the file."""
    (tmp_path / "small.txt").write_bytes(b"x")
    _sparse(tmp_path / "big.bin")
    done = await anyio.to_thread.run_sync(
        functools.partial(
            subprocess.run,
            [sys.executable, "-c", _BIG_READ, str(tmp_path), str(cap)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert done.returncode == 0, done.stderr
    limit, grown_mib, seconds = done.stdout.split()
    assert int(limit) == cap
    # The limit, once or twice over (read buffer and joined bytes), never the 1 GiB file.
    assert int(grown_mib) <= 2 * cap // (1 << 20) + 16
    assert float(seconds) < 10


@pytest.mark.parametrize("kind", ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)])
async def test_read_bytes_honours_max_read_bytes_on_each_storage(
    kind: str, request: pytest.FixtureRequest, module_tmp: str
) -> None:
    storage = _Storage(kind, request, module_tmp)
    ws = storage.workspace(sandbox=False)
    assert ws.filesystem is not None
    await ws.filesystem.write_file("d/limit.bin", b"a" * 1024)
    await ws.filesystem.write_file("d/over.bin", b"a" * 1025)
    backend = AgentVFSWorkspace(ws, max_read_bytes=1024)
    try:
        wd = await backend.working_dir()
        assert await backend.read_bytes(f"{wd}/d/limit.bin") == b"a" * 1024
        with pytest.raises(FileTooLargeError, match="larger than 1024 bytes") as caught:
            await backend.read_bytes(f"{wd}/d/over.bin")
        assert isinstance(caught.value, WorkspaceError) and isinstance(
            caught.value, PermissionError
        )
        assert caught.value.path == f"{wd}/d/over.bin" and wd not in str(caught.value)
        # The other errors are those of an unbounded read.
        with pytest.raises(FileNotFoundError):
            await backend.read_bytes(f"{wd}/d/missing.bin")
        with pytest.raises(IsADirectoryError):
            await backend.read_bytes(f"{wd}/d")
        unbounded = AgentVFSWorkspace(ws, max_read_bytes=None)
        assert await unbounded.read_bytes(f"{wd}/d/over.bin") == b"a" * 1025
    finally:
        await backend.aclose()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "64M"])
def test_a_bad_max_read_bytes_is_refused(bad: Any) -> None:
    ws = Workspace(filesystem=FsspecFilesystem("memory:///pyd-cap"))
    with pytest.raises(ValueError, match="max_read_bytes must be a positive number"):
        AgentVFSWorkspace(ws, max_read_bytes=bad)


async def test_agent_edit_of_a_huge_file_is_reported_to_the_model_and_write_replaces_it(
    tmp_path: Any,
) -> None:
    """The harness's edit_file reads the file whole: on a 1 GiB sparse file the model gets the
    refusal as the tool's result and the run goes on; write_file still replaces the file."""
    directory = tmp_path / "ws"
    directory.mkdir()
    _sparse(directory / "big.txt")
    backend = AgentVFSWorkspace(Workspace(filesystem=LocalFilesystem(str(directory))))
    try:
        edit = Agent(
            _script(("edit_file", {"path": "big.txt", "old_text": "a", "new_text": "b"})),
            capabilities=[FileSystem()],
        )
        result = await edit.run("edit it", workspace=backend)
        assert f"larger than {DEFAULT_MAX_READ_BYTES} bytes" in result.output
        assert str(directory) not in result.output
        assert (directory / "big.txt").stat().st_size == GIB
        write = Agent(
            _script(("write_file", {"path": "big.txt", "content": "small now\n"})),
            capabilities=[FileSystem()],
        )
        await write.run("replace it", workspace=backend)
        assert (directory / "big.txt").read_bytes() == b"small now\n"
    finally:
        await backend.aclose()


async def test_realpath_refuses_links_out_of_the_root_made_by_a_command(tmp_path: Any) -> None:
    """Links a sandbox command makes to /proc/self/{cwd,exe,fd/0}, /etc, / and ../outside are
    refused (PermissionError), never resolved on the host; links inside resolve, also one
    that leaves the root and comes back."""
    directory = tmp_path / "ws"
    directory.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    sandbox = LocalSandbox(working_directory=str(directory), isolation="bwrap")
    backend = AgentVFSWorkspace(
        Workspace(filesystem=LocalFilesystem(str(directory)), sandbox=sandbox)
    )
    try:
        assert isinstance(backend, SupportsCommands)
        wd = await backend.working_dir()
        made = await backend.run(
            "mkdir -p d/e && ln -s /proc/self/cwd cwd && ln -s /proc/self/exe exe && "
            "ln -s /proc/self/fd/0 fd0 && ln -s /etc etc && ln -s / slash && "
            "ln -s ../outside.txt out && ln -s d/e inner && ln -s ../ws/d back && "
            f"ln -s {wd}/d absolute && ln -s ../../d/e d/e/up",
            shell=True,
        )
        assert made.exit_code == 0, made.stderr
        for name in ("cwd", "exe", "fd0", "etc", "slash", "out", "etc/passwd", "cwd/x", "etc/.."):
            with pytest.raises(PermissionError, match="outside the workspace storage"):
                await backend.realpath(f"{wd}/{name}")
        assert await backend.realpath(f"{wd}/inner/missing") == f"{wd}/d/e/missing"
        assert await backend.realpath(f"{wd}/back") == f"{wd}/d"
        assert await backend.realpath(f"{wd}/absolute/e") == f"{wd}/d/e"
        assert await backend.realpath(f"{wd}/d/e/up/..") == f"{wd}/d"
    finally:
        await backend.aclose()


async def test_realpath_reports_a_long_link_chain_as_a_loop(tmp_path: Any) -> None:
    for i in range(50):
        os.symlink(f"l{i + 1}", tmp_path / f"l{i}")
    os.symlink("l0", tmp_path / "l50")
    backend = AgentVFSWorkspace(Workspace(filesystem=LocalFilesystem(str(tmp_path))))
    wd = await backend.working_dir()
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        await backend.realpath(f"{wd}/l0")


async def test_a_symlink_leading_out_of_the_root_is_removed_itself(tmp_path: Any) -> None:
    """remove takes away the link, never its target, also when the link leads outside."""
    directory = tmp_path / "ws"
    (directory / "d").mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("keep")
    os.symlink("../outside.txt", directory / "file-link")
    os.symlink(str(outside), directory / "dir-link")
    os.symlink("/etc", directory / "d" / "etc")
    os.symlink("../missing", directory / "dangling")
    backend = AgentVFSWorkspace(Workspace(filesystem=LocalFilesystem(str(directory))))
    wd = await backend.working_dir()
    for name in ("file-link", "dir-link", "d/etc", "dangling"):
        await backend.remove(f"{wd}/{name}")
        assert not os.path.lexists(directory / name)
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert (outside / "keep").is_dir() and os.path.isdir("/etc")
    os.symlink(str(outside), directory / "dir-link")
    with pytest.raises(PermissionError):  # through a link out: refused, nothing removed
        await backend.remove(f"{wd}/dir-link/keep")
    assert (outside / "keep").is_dir()
