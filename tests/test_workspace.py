"""Workspace core: construction rules, lifecycle, resolvers, instructions, info (asyncio and trio)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import (
    FsspecFilesystem,
    LocalFilesystem,
    RequestContext,
    Workspace,
    WorkspaceError,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def mem(**kw: Any) -> FsspecFilesystem:
    return FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/w", **kw)


@dataclass
class Entry:
    filesystem: Any
    state: str


@dataclass
class FakeMounts:
    entries: dict[str, Entry] = field(default_factory=dict)


class FakeSandbox:
    """The sandbox interface the workspace core relies on, recording lifecycle calls."""

    provider = "local"

    def __init__(self, working_directory: str = "/wd", fail_destroy: bool = False) -> None:
        self.working_directory = working_directory
        self.calls: list[str] = []
        self.status = "pending"
        self.mounts = FakeMounts()
        self.fail_destroy = fail_destroy

    async def execute_command(self, command: str) -> None:  # pragma: no cover - interface only
        raise NotImplementedError

    async def start(self) -> None:
        self.calls.append("start")
        self.status = "running"

    async def stop(self) -> None:
        await anyio.sleep(0.01)
        self.calls.append("stop")
        self.status = "stopped"

    async def destroy(self) -> None:
        self.calls.append("destroy")
        if self.fail_destroy:
            raise RuntimeError("boom")
        self.status = "destroyed"

    def get_instructions(self, request_context: Any = None) -> str:
        return f'Local command execution. Working directory: "{self.working_directory}".'

    async def get_info(self) -> dict[str, Any]:
        return {"provider": "local", "status": self.status, "resources": {"cpuCores": 2}}


async def test_ids_and_names() -> None:
    ws = Workspace(filesystem=mem())
    assert re.fullmatch(r"ws-[0-9a-z]+-[0-9a-z]{6}", ws.id)
    assert ws.name == f"workspace-{ws.id[:8]}" and ws.status == "pending"
    assert Workspace(id="abc", filesystem=mem()).name == "workspace-abc"
    assert Workspace(id="ws-mx2iiqvk-virshj", filesystem=mem()).name == "workspace-ws-mx2ii"
    assert Workspace(id="x", name="custom", filesystem=mem()).name == "custom"


async def test_constructor_errors_in_reference_order() -> None:
    def code(**kw: Any) -> tuple[str, str]:
        with pytest.raises(WorkspaceError) as info:
            Workspace(**kw)
        return info.value.code, str(info.value)

    assert code() == ("NO_PROVIDERS", "Workspace requires at least a filesystem, sandbox, or skills")
    assert code(skills=[])[0] == "NO_PROVIDERS"
    Workspace(skills=["skills"])
    Workspace(skills=lambda ctx: ["skills"])
    assert code(filesystem=mem(), mounts={"/a": mem()}) == ("INVALID_CONFIG", 'Cannot use both "filesystem" and "mounts"')
    kind, message = code(sandbox=lambda ctx: FakeSandbox(), mounts={"/a": mem()})
    assert kind == "INVALID_CONFIG" and message.startswith('Cannot use "mounts" with a dynamic sandbox resolver.')
    kind, message = code(filesystem=LocalFilesystem)
    assert kind == "INVALID_CONFIG"
    assert message.startswith("filesystem received a class constructor instead of an instance or resolver function.")
    assert code(sandbox=FakeSandbox)[0] == "INVALID_CONFIG"
    # the mounts check comes before the search check
    assert code(filesystem=mem(), mounts={"/a": mem()}, vector_store=object())[0] == "INVALID_CONFIG"
    assert code(filesystem=mem(), vector_store=object()) == ("INVALID_SEARCH_CONFIG", "vector_store requires an embedder")
    assert code(filesystem=mem(), operation_timeout=0)[0] == "INVALID_CONFIG"


async def test_search_index_names() -> None:
    def name(**kw: Any) -> str | None:
        return Workspace(filesystem=mem(), vector_store=object(), embedder=lambda t: [0.0], **kw)._search_index_name

    assert name(id="my-workspace-id") == "my_workspace_id_search"
    assert name(id="my.workspace@123") == "my_workspace_123_search"
    assert name(id="my-ws.1") == "my_ws_1_search"
    assert name(id="x", search_index_name="custom_idx") == "custom_idx"
    for kw, message in (
        ({"search_index_name": "1abc"}, 'Invalid search_index_name: "1abc". Must start with a letter or underscore, and contain only letters, numbers, or underscores.'),
        ({"search_index_name": "a" * 64}, "search_index_name exceeds 63 characters (got 64)"),
        ({"id": "123"}, 'Invalid search_index_name: "123_search".'),
    ):
        with pytest.raises(WorkspaceError) as info:
            name(**kw)
        assert info.value.code == "INVALID_SEARCH_CONFIG"
        assert str(info.value).startswith(message)
    # only vector search needs a table name
    assert Workspace(filesystem=mem(), bm25=True, search_index_name="1abc").can_bm25


async def test_search_flags() -> None:
    assert (Workspace(filesystem=mem()).can_bm25, Workspace(filesystem=mem()).can_vector) == (False, False)
    ws = Workspace(filesystem=mem(), bm25=True, vector_store=object(), embedder=lambda t: [0.0])
    assert (ws.can_bm25, ws.can_vector, ws.can_hybrid) == (True, True, True)


async def test_lifecycle() -> None:
    sandbox = FakeSandbox()
    fs = mem()
    ws = Workspace(filesystem=fs, sandbox=sandbox)
    seen = []
    await ws.init()
    seen.append((ws.status, sandbox.status, fs.status))
    await ws.stop()
    seen.append((ws.status, sandbox.status, fs.status))
    await ws.destroy()
    seen.append((ws.status, sandbox.status, fs.status))
    assert seen == [("ready", "running", "ready"), ("ready", "stopped", "ready"), ("destroyed", "destroyed", "destroyed")]
    await ws.destroy()  # idempotent
    await ws.stop()  # no-op after teardown
    assert sandbox.calls == ["start", "stop", "destroy"]


async def test_concurrent_stop_and_destroy_coalesce() -> None:
    sandbox = FakeSandbox()
    ws = Workspace(sandbox=sandbox)
    await ws.init()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ws.stop)
        tg.start_soon(ws.stop)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ws.destroy)
        tg.start_soon(ws.destroy)
    assert sandbox.calls == ["start", "stop", "destroy"]


async def test_init_and_destroy_failures_set_error() -> None:
    class Broken(FsspecFilesystem):
        async def setup(self) -> None:
            raise RuntimeError("cannot reach storage")

    ws = Workspace(filesystem=Broken(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/b"))
    with pytest.raises(RuntimeError, match="cannot reach storage"):
        await ws.init()
    assert ws.status == "error"
    ws2 = Workspace(sandbox=FakeSandbox(fail_destroy=True))
    await ws2.init()
    with pytest.raises(RuntimeError, match="boom"):
        await ws2.destroy()
    assert ws2.status == "error"


async def test_async_with() -> None:
    async with Workspace(filesystem=mem()) as ws:
        assert ws.status == "ready"
        assert ws.filesystem is not None
        await ws.filesystem.write_file("a.txt", "a")
    assert str(ws.status) == "destroyed"


async def test_filesystem_resolver_memoised_per_context() -> None:
    calls: list[str | None] = []
    stores: dict[str, FsspecFilesystem] = {}

    async def resolve(ctx: RequestContext) -> FsspecFilesystem:
        user = ctx.get("user-id")
        calls.append(user)
        return stores.setdefault(user, mem())

    ws = Workspace(filesystem=resolve)
    assert ws.filesystem is None and ws.has_filesystem_config()
    await ws.init()
    assert calls == []  # init never resolves
    alice = RequestContext([("user-id", "alice")])
    fs1 = await ws.resolve_filesystem(request_context=alice)
    fs2 = await ws.resolve_filesystem(request_context=alice)
    assert fs1 is fs2 and calls == ["alice"]
    bob = RequestContext([("user-id", "bob")])
    assert await ws.resolve_filesystem(request_context=bob) is not fs1
    info = await ws.get_info(resolve_dynamic_providers=False)
    assert info["filesystem"] == {"id": f"{ws.id}-dynamic-filesystem", "name": "DynamicFilesystem", "provider": "dynamic", "status": "pending"}
    assert (await ws.get_info(request_context=alice))["filesystem"]["provider"] == "memory"


async def test_sandbox_cache_key() -> None:
    made: list[FakeSandbox] = []
    failures = {"n": 1}

    def resolve(ctx: RequestContext) -> FakeSandbox:
        if ctx.get("fail") and failures["n"]:
            failures["n"] -= 1
            raise RuntimeError("resolver failed")
        made.append(FakeSandbox())
        return made[-1]

    ws = Workspace(sandbox=resolve, sandbox_cache_key=lambda ctx: ctx.get("thread"))
    a = await ws.resolve_sandbox(request_context=RequestContext([("thread", "t1")]))
    b = await ws.resolve_sandbox(request_context=RequestContext([("thread", "t1")]))
    assert a is b and len(made) == 1
    c = await ws.resolve_sandbox(request_context=RequestContext())  # key None -> per context
    assert c is not a
    with pytest.raises(RuntimeError):
        await ws.resolve_sandbox(request_context=RequestContext([("thread", "t2"), ("fail", True)]))
    d = await ws.resolve_sandbox(request_context=RequestContext([("thread", "t2"), ("fail", True)]))
    assert isinstance(d, FakeSandbox)  # failures are not cached
    ws.clear_sandbox_cache("t1")
    assert await ws.resolve_sandbox(request_context=RequestContext([("thread", "t1")])) is not a
    assert (await ws.get_info())["sandbox"] == {"provider": "dynamic", "status": "pending"}


async def test_instructions(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    sandbox = FakeSandbox(working_directory="/wd")
    assert Workspace(filesystem=fs, sandbox=sandbox).get_instructions() == (
        'Local command execution. Working directory: "/wd".\n\n'
        f'Local filesystem at "{tmp_path}". Relative paths resolve from this directory. File access is restricted to this directory.'
    )
    assert Workspace(skills=["s"]).get_instructions() == ""
    sandbox.mounts.entries = {
        "/data": Entry(LocalFilesystem(tmp_path / "a"), "mounted"),
        "/skip": Entry(LocalFilesystem(tmp_path / "b"), "unsupported"),
        "/custom": Entry(LocalFilesystem(tmp_path / "c", read_only=True), "error"),
    }
    assert Workspace(sandbox=sandbox).get_instructions() == textwrap.dedent("""\
        Local command execution. Working directory: "/wd".

        Sandbox-mounted filesystems (accessible in shell commands):
          - /wd/data: local (read-write)

        Workspace-only filesystems (use file tools, NOT available in shell commands):
          - /skip: local (read-write)
          - /custom: local (read-only)""")


async def test_instructions_async_dynamic_sandbox(tmp_path: Path) -> None:
    ws = Workspace(filesystem=lambda ctx: LocalFilesystem(tmp_path), sandbox=lambda ctx: FakeSandbox("/dyn"))
    text = await ws.get_instructions_async()
    assert text.startswith("Dynamic sandbox configured. Shell commands execute in a request-scoped sandbox resolved at tool execution time.\n\nLocal filesystem at")
    resolved = Workspace(sandbox=lambda ctx: FakeSandbox("/dyn"), instructions={"dynamic_sandbox": "resolve"})
    assert await resolved.get_instructions_async() == 'Local command execution. Working directory: "/dyn".'
    custom = Workspace(sandbox=lambda ctx: FakeSandbox(), instructions={"dynamic_sandbox": lambda ctx: f"user {ctx.get('u')}"})
    assert await custom.get_instructions_async(request_context=RequestContext([("u", "al")])) == "user al"


async def test_get_info(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    for name in ("a.txt", "d/b.txt", "d/e/c.txt"):
        await fs.write_file(name, "x")
    ws = Workspace(id="info", filesystem=fs, sandbox=FakeSandbox())
    info = await ws.get_info(include_file_count=True)
    assert (info["id"], info["name"], info["status"]) == ("info", "workspace-info", "pending")
    assert info["filesystem"]["provider"] == "local" and info["filesystem"]["total_files"] == 3
    assert info["filesystem"]["read_only"] is False
    assert info["sandbox"] == {"provider": "local", "status": "pending", "resources": {"cpuCores": 2}}
    assert "sandbox" not in await Workspace(filesystem=fs).get_info()
    composite = Workspace(mounts={"/a": LocalFilesystem(tmp_path / "d"), "/b": mem()})
    assert (await composite.get_info(include_file_count=True))["filesystem"]["total_files"] == 2


async def test_credentials_never_reported() -> None:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/r")
    for text in (repr(fs), str(fs.get_mount_config()), str(await fs.get_info())):
        assert "secret" not in text


async def test_tools_config_accessors() -> None:
    config: dict[str, Any] = {"mastra_workspace_write_file": {"enabled": False}}
    ws = Workspace(filesystem=mem(), tools=config)
    assert ws.get_tools_config() is config
    ws.set_tools_config(None)
    assert ws.get_tools_config() is None


async def test_operation_timeout_leaves_no_file(tmp_path: Path) -> None:
    class SlowLocal(LocalFileSystem):  # type: ignore[misc]
        def pipe_file(self, path: str, value: bytes, **kw: Any) -> None:
            time.sleep(0.4)
            super().pipe_file(path, value, **kw)

        def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
            time.sleep(0.4)
            return bytes(super().cat_file(path, start=start, end=end, **kw))

    root = tmp_path / "slow"
    root.mkdir()
    (root / "old.txt").write_text("old")
    # A backend with real directories that is not local disk (local disk has its own class):
    # slow storage behind fsspec's directory wrapper.
    slow = DirFileSystem(path=str(root), fs=SlowLocal(skip_instance_cache=True))
    ws = Workspace(filesystem=FsspecFilesystem(slow), operation_timeout=100)
    assert ws.filesystem is not None
    with pytest.raises(TimeoutError, match="timed out after 100ms"):
        await ws.filesystem.write_file("new.txt", "data")
    with pytest.raises(TimeoutError):
        await ws.filesystem.write_file("old.txt", "replacement")
    await anyio.sleep(0.9)
    assert sorted(p.name for p in root.iterdir()) == ["old.txt"]  # no new file, no staging file
    assert (root / "old.txt").read_text() == "old"
    with pytest.raises(TimeoutError):
        await ws.filesystem.read_file("old.txt")


async def test_operation_timeout_on_local_disk_leaves_no_file(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    root.mkdir()
    (root / "old.txt").write_text("old")
    ws = Workspace(filesystem=LocalFilesystem(str(root)), operation_timeout=5)
    assert ws.filesystem is not None
    # Far more than 5 ms of writing: a 64 MiB write can take 17 ms, and the deadline may be
    # delivered some milliseconds late while another abandoned write holds the interpreter.
    big = b"x" * (256 << 20)
    with pytest.raises(TimeoutError, match="timed out after 5ms"):
        await ws.filesystem.write_file("old.txt", big)
    with pytest.raises(TimeoutError):
        await ws.filesystem.write_file("new.txt", big)
    # The writes go on in their threads, find their callers gone and publish nothing.
    for _ in range(100):
        await anyio.sleep(0.1)
        if sorted(p.name for p in root.iterdir()) == ["old.txt"]:
            break
    assert sorted(p.name for p in root.iterdir()) == ["old.txt"]
    assert (root / "old.txt").read_text() == "old"


async def test_request_context_mapping() -> None:
    ctx = RequestContext([("user-id", "alice")])
    ctx.set("role", "admin")
    assert ctx.get("user-id") == "alice" and ctx["role"] == "admin" and len(ctx) == 2
    assert ctx.get("missing") is None and dict(ctx) == {"user-id": "alice", "role": "admin"}


def test_atexit_destroys_forgotten_workspaces(tmp_path: Path) -> None:
    marker = tmp_path / "destroyed"
    script = textwrap.dedent(f"""
        import anyio
        from agentvfs import Workspace

        class Sandbox:
            async def execute_command(self, c): ...
            async def start(self): pass
            async def destroy(self):
                open({str(marker)!r}, "w").write("yes")

        async def main():
            ws = Workspace(sandbox=Sandbox())
            await ws.init()

        anyio.run(main)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert marker.read_text() == "yes"
