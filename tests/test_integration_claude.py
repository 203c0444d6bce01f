"""The Claude Agent SDK adapter: the SDK's own in-process MCP transport, approvals through
``can_use_tool``, a FUSE mount as Claude's working directory, and the fsspec SessionStore
(the SDK's conformance suite on memory, local disk, S3 and GCS; concurrent writers; restarts).

No model is called: the Claude CLI is not run, and everything it would drive is driven here
through the SDK's own code (its MCP bridge, its session helpers, its conformance suite).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from claude_agent_sdk import (
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ToolPermissionContext,
    Transport,
    fold_session_summary,
    get_session_messages_from_store,
    list_sessions_from_store,
    project_key_for_directory,
)
from claude_agent_sdk.testing import run_session_store_conformance
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, MountError, Workspace
from agentvfs.integrations.claude import (
    FsspecSessionStore,
    claude_allowed_tools,
    claude_can_use_tool,
    claude_mcp_server,
    mounted_cwd,
)
from agentvfs.mounts import fuse_available
from agentvfs.testing import FakeGcsServer, MotoServer
from agentvfs.tools import WORKSPACE_TOOLS
from conftest import GCS_BUCKET, S3_BUCKET, unique

pytestmark = pytest.mark.anyio
FS = WORKSPACE_TOOLS.FILESYSTEM
REPO = Path(__file__).resolve().parents[1]
MCP2_PYTHON = REPO / ".venv" / "opt" / "mcp2" / "bin" / "python"


# -- the SDK's in-process transport ------------------------------------------------------------


class FakeCli(Transport):
    """The Claude CLI's end of the SDK's control channel, through the SDK's public
    ``Transport`` interface: it answers the SDK's own requests (``initialize``) and sends the
    requests the CLI sends (``mcp_message`` for an SDK MCP server, ``can_use_tool``), so every
    call goes through the SDK's real dispatch (its ``Query`` and in-process MCP bridge)."""

    def __init__(self) -> None:
        self.to_sdk, self.from_cli = anyio.create_memory_object_stream[dict[str, Any]](100)
        self.waiting: dict[str, anyio.Event] = {}
        self.answers: dict[str, dict[str, Any]] = {}
        self.next_id = 0

    async def connect(self) -> None:
        pass

    async def write(self, data: str) -> None:
        for line in data.splitlines():
            message = json.loads(line)
            if message.get("type") == "control_request":  # the SDK's initialize and the like
                answer = {"subtype": "success", "request_id": message["request_id"], "response": {}}
                await self.to_sdk.send({"type": "control_response", "response": answer})
            elif message.get("type") == "control_response":
                request_id = message["response"]["request_id"]
                self.answers[request_id] = message["response"]
                self.waiting.pop(request_id).set()

    async def _messages(self) -> AsyncIterator[dict[str, Any]]:
        async with self.from_cli:
            async for message in self.from_cli:
                yield message

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        return self._messages()

    async def close(self) -> None:
        await self.to_sdk.aclose()

    def is_ready(self) -> bool:
        return True

    async def end_input(self) -> None:
        pass

    async def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a control request as the CLI does, and the SDK's answer."""
        self.next_id += 1
        request_id = f"cli_{self.next_id}"
        self.waiting[request_id] = done = anyio.Event()
        await self.to_sdk.send(
            {"type": "control_request", "request_id": request_id, "request": request}
        )
        with anyio.fail_after(20):
            await done.wait()
        answer = self.answers.pop(request_id)
        assert answer["subtype"] == "success", answer
        response: dict[str, Any] = answer["response"]
        return response


class Bridge:
    """JSON-RPC to an SDK MCP server the way the Claude CLI sends it: ``mcp_message``
    control requests into a connected ``ClaudeSDKClient``."""

    def __init__(self, config: Any, can_use_tool: Any = None) -> None:
        self.name = config["name"]
        self.cli = FakeCli()
        options = ClaudeAgentOptions(mcp_servers={self.name: config}, can_use_tool=can_use_tool)
        self.client = ClaudeSDKClient(options, transport=self.cli)
        self.next_id = 0

    async def __aenter__(self) -> Bridge:
        await self.client.connect()
        await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "claude-code", "version": "test"},
            },
        )
        await self.cli.control(
            {
                "subtype": "mcp_message",
                "server_name": self.name,
                "message": {"jsonrpc": "2.0", "method": "notifications/initialized"},
            }
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.disconnect()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        answer = await self.cli.control(
            {"subtype": "mcp_message", "server_name": self.name, "message": message}
        )
        response = answer["mcp_response"]
        assert "error" not in response, response
        result: dict[str, Any] = response["result"]
        return result

    async def call(
        self, tool: str, tool_use_id: str | None = None, **args: Any
    ) -> tuple[bool, str]:
        """Call ``tool``; with ``tool_use_id``, in the ``_meta`` key the Claude CLI uses."""
        params: dict[str, Any] = {"name": tool, "arguments": args}
        if tool_use_id is not None:
            params["_meta"] = {"claudecode/toolUseId": tool_use_id}
        result = await self.request("tools/call", params)
        text = "\n".join(block["text"] for block in result["content"] if block["type"] == "text")
        return bool(result.get("isError")), text

    async def permission(
        self, tool: str, args: dict[str, Any], tool_use_id: str = "toolu_9"
    ) -> dict[str, Any]:
        """Ask the SDK's ``can_use_tool`` as the CLI does before running a tool."""
        return await self.cli.control(
            {
                "subtype": "can_use_tool",
                "tool_name": tool,
                "input": args,
                "tool_use_id": tool_use_id,
            }
        )


@pytest.fixture
async def s3_workspace(moto: MotoServer) -> AsyncIterator[tuple[Workspace, Any, str]]:
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('claude')}"
    workspace = Workspace(
        filesystem=FsspecFilesystem(raw, root=prefix),
        tools={FS.DELETE: {"require_approval": True}, FS.WRITE_FILE: {"require_approval": True}},
    )
    async with workspace:
        yield workspace, raw, prefix


def bucket_text(raw: Any, path: str) -> str | None:
    raw.invalidate_cache()
    return raw.cat_file(path).decode() if raw.exists(path) else None


async def test_sdk_bridge_lists_and_calls_tools_on_s3(
    s3_workspace: tuple[Workspace, Any, str],
) -> None:
    workspace, _, _ = s3_workspace
    await workspace.filesystem.write_file("notes/a.txt", "alpha\nbeta\n")  # type: ignore[union-attr]
    config = await claude_mcp_server(workspace, name="files")
    assert config["type"] == "sdk" and config["name"] == "files"
    # The config is what ClaudeAgentOptions takes.
    options = ClaudeAgentOptions(
        mcp_servers={"files": config}, allowed_tools=claude_allowed_tools(config)
    )
    assert options.mcp_servers == {"files": config}

    async with Bridge(config) as bridge:
        listed = await bridge.request("tools/list")
        names = [tool["name"] for tool in listed["tools"]]
        assert names == list((await workspace.create_tools()).keys())
        by_name = {tool["name"]: tool for tool in listed["tools"]}
        assert by_name[FS.READ_FILE]["inputSchema"]["required"] == ["path"]
        assert by_name[FS.READ_FILE]["annotations"]["readOnlyHint"] is True

        failed, text = await bridge.call(FS.READ_FILE, path="notes/a.txt")
        assert not failed and "alpha" in text and "beta" in text
        failed, text = await bridge.call(FS.GREP, pattern="bet")
        assert not failed and "notes/a.txt" in text
        failed, text = await bridge.call(FS.MKDIR, path="made")
        assert not failed, text
        # Bad input and a missing file are tool errors; the server goes on serving.
        failed, text = await bridge.call(FS.READ_FILE)
        assert failed and "path" in text
        failed, text = await bridge.call(FS.READ_FILE, path="missing.txt")
        assert failed and "missing.txt" in text
        failed, text = await bridge.call(FS.LIST_FILES, path="/")
        assert not failed and "notes" in text


async def test_allowed_tools_leave_out_tools_needing_approval(
    s3_workspace: tuple[Workspace, Any, str],
) -> None:
    workspace, _, _ = s3_workspace
    config = await claude_mcp_server(workspace)
    allowed = claude_allowed_tools(config)
    assert f"mcp__agentvfs__{FS.READ_FILE}" in allowed
    assert (
        f"mcp__agentvfs__{FS.WRITE_FILE}" not in allowed
        and f"mcp__agentvfs__{FS.DELETE}" not in allowed
    )
    everything = claude_allowed_tools(config, include_approval=True)
    assert len(everything) == len(await workspace.create_tools())
    with pytest.raises(TypeError, match="claude_mcp_server"):
        claude_allowed_tools({"type": "sdk", "name": "x", "instance": object()})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="double underscore"):
        await claude_mcp_server(workspace, name="a__b")


async def test_approval_through_can_use_tool(s3_workspace: tuple[Workspace, Any, str]) -> None:
    workspace, raw, prefix = s3_workspace
    config = await claude_mcp_server(workspace)
    asked: list[tuple[str, dict[str, Any]]] = []
    verdict = {"ok": False}

    async def approve(name: str, args: dict[str, Any], context: ToolPermissionContext) -> bool:
        asked.append((name, args))
        return verdict["ok"]

    other_calls: list[str] = []

    async def other(name: str, args: dict[str, Any], context: ToolPermissionContext) -> Any:
        other_calls.append(name)
        return PermissionResultAllow()

    can_use = claude_can_use_tool(config, approve)
    delegating = claude_can_use_tool(config, approve, otherwise=other)
    context = ToolPermissionContext(tool_use_id="toolu_1")
    write = f"mcp__agentvfs__{FS.WRITE_FILE}"
    args = {"path": "out.txt", "content": "approved"}
    async with Bridge(config, can_use_tool=can_use) as bridge:
        # No approval at all (the tool was in allowed_tools, say): refused, nothing written.
        failed, text = await bridge.call(FS.WRITE_FILE, **args)
        assert failed and "not approved" in text
        assert bucket_text(raw, f"{prefix}/out.txt") is None

        # A tool needing no approval is allowed without asking.
        assert isinstance(
            await can_use(f"mcp__agentvfs__{FS.READ_FILE}", {"path": "x"}, context),
            PermissionResultAllow,
        )
        assert asked == []

        # Denied by the user.
        answer = await can_use(write, args, context)
        assert isinstance(answer, PermissionResultDeny) and asked == [(write, args)]
        failed, _ = await bridge.call(FS.WRITE_FILE, **args)
        assert failed and bucket_text(raw, f"{prefix}/out.txt") is None

        # Approved: exactly that call runs, once.
        verdict["ok"] = True
        assert isinstance(await can_use(write, args, context), PermissionResultAllow)
        failed, _ = await bridge.call(FS.WRITE_FILE, path="out.txt", content="other content")
        assert failed, "an approval covers only the arguments approved"
        failed, text = await bridge.call(FS.WRITE_FILE, **args)
        assert not failed, text
        assert bucket_text(raw, f"{prefix}/out.txt") == "approved"
        failed, _ = await bridge.call(FS.WRITE_FILE, path="out.txt", content="approved")
        assert failed, "an approval is used up by its call"

        # Other tools: denied unless a callback for them is given.
        assert isinstance(await can_use("Bash", {"command": "ls"}, context), PermissionResultDeny)
        assert isinstance(
            await delegating("Bash", {"command": "ls"}, context), PermissionResultAllow
        )
        assert other_calls == ["Bash"]

        # The same through the SDK's control channel, as the CLI asks before a tool call.
        assert (await bridge.permission(write, args))["behavior"] == "allow"
        failed, text = await bridge.call(FS.WRITE_FILE, **args)
        assert not failed, text
        verdict["ok"] = False
        assert (await bridge.permission(write, args))["behavior"] == "deny"
        failed, _ = await bridge.call(FS.WRITE_FILE, **args)
        assert failed


async def test_an_approval_covers_its_own_tool_use_only(tmp_path: Path) -> None:
    workspace = Workspace(
        filesystem=LocalFilesystem(base_path=str(tmp_path)),
        tools={FS.WRITE_FILE: {"require_approval": True}},
    )
    config = await claude_mcp_server(workspace)
    asked: list[str | None] = []

    def approve(name: str, args: dict[str, Any], context: ToolPermissionContext) -> bool:
        asked.append(context.tool_use_id)
        return True

    can_use = claude_can_use_tool(config, approve)
    write = f"mcp__agentvfs__{FS.WRITE_FILE}"
    args = {"path": "deploy.sh", "content": "approved\n"}
    target = tmp_path / "deploy.sh"
    async with workspace:
        async with Bridge(config, can_use_tool=can_use) as bridge:
            assert (await bridge.permission(write, args, "toolu_A"))["behavior"] == "allow"
            assert asked == ["toolu_A"], "the SDK hands the CLI's tool use id to the callback"
            # Another tool use with the very same arguments is not the approved one.
            failed, text = await bridge.call(FS.WRITE_FILE, tool_use_id="toolu_B", **args)
            assert failed and "not approved" in text and not target.exists()
            failed, text = await bridge.call(FS.WRITE_FILE, tool_use_id="toolu_A", **args)
            assert not failed, text
            assert target.read_text() == "approved\n"
            failed, _ = await bridge.call(FS.WRITE_FILE, tool_use_id="toolu_A", **args)
            assert failed, "the approval was used up by its call"

            # Approved, then the run is interrupted before the call is made...
            target.unlink()
            assert (await bridge.permission(write, args, "toolu_C"))["behavior"] == "allow"
        # ... so the grant goes with the session: a later one (tool in allowed_tools, say,
        # so nobody is asked) cannot use it, with or without an id.
        async with Bridge(config) as bridge:
            failed, text = await bridge.call(FS.WRITE_FILE, **args)
            assert failed and "not approved" in text
            failed, _ = await bridge.call(FS.WRITE_FILE, tool_use_id="toolu_C", **args)
            assert failed
        assert not target.exists()


async def test_an_approval_expires(tmp_path: Path) -> None:
    workspace = Workspace(
        filesystem=LocalFilesystem(base_path=str(tmp_path)),
        tools={FS.WRITE_FILE: {"require_approval": True}},
    )
    config = await claude_mcp_server(workspace)
    lifetime = 0.05
    can_use = claude_can_use_tool(config, lambda *_: True, grant_lifetime=lifetime)
    write = f"mcp__agentvfs__{FS.WRITE_FILE}"
    args = {"path": "late.txt", "content": "late"}
    async with workspace, Bridge(config, can_use_tool=can_use) as bridge:
        assert (await bridge.permission(write, args, "toolu_late"))["behavior"] == "allow"
        await anyio.sleep(lifetime * 3)
        failed, text = await bridge.call(FS.WRITE_FILE, tool_use_id="toolu_late", **args)
        assert failed and "not approved" in text
        assert not (tmp_path / "late.txt").exists()
        # In time, the same approval works (no id sent: matched on the arguments).
        assert (await bridge.permission(write, args, "toolu_soon"))["behavior"] == "allow"
        failed, text = await bridge.call(FS.WRITE_FILE, **args)
        assert not failed, text
    assert (tmp_path / "late.txt").read_text() == "late"
    with pytest.raises(ValueError, match="grant_lifetime"):
        claude_can_use_tool(config, lambda *_: True, grant_lifetime=0)


def mcp2_ready() -> str | None:
    if not MCP2_PYTHON.exists():
        return f"{MCP2_PYTHON} is missing (scripts/setup.sh --extras test installs it)"
    probe = subprocess.run(
        [str(MCP2_PYTHON), "-c", "import mcp, fsspec, tiktoken, wcmatch, regex, yaml, pathspec"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode:
        return f"{MCP2_PYTHON} lacks agentvfs's runtime dependencies (rerun scripts/setup.sh): {probe.stderr[-300:]}"
    return None


MCP2_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import anyio, fsspec
    import mcp
    from mcp import Client
    from agentvfs import FsspecFilesystem, Workspace
    from agentvfs.tools import create_server

    async def main():
        fs = fsspec.filesystem("memory", skip_instance_cache=True)
        async with Workspace(filesystem=FsspecFilesystem(fs, root="/w")) as ws:
            server = create_server(await ws.create_tools(), name="agentvfs")
            async with Client(server) as client:
                listed = await client.list_tools()
                wrote = await client.call_tool(
                    "mastra_workspace_write_file", {"path": "a.txt", "content": "on mcp 2"}
                )
                read = await client.call_tool("mastra_workspace_read_file", {"path": "a.txt"})
                missing = await client.call_tool("mastra_workspace_read_file", {"path": "nope.txt"})
        print(json.dumps({
            "version": mcp.__version__ if hasattr(mcp, "__version__") else None,
            "tools": [t.name for t in listed.tools],
            "wrote": [wrote.is_error, wrote.content[0].text],
            "read": [read.is_error, read.content[0].text],
            "missing": [missing.is_error, missing.content[0].text],
            "stored": fs.cat_file("/w/a.txt").decode(),
        }))

    anyio.run(main)
    """
)


async def test_create_server_on_mcp_2() -> None:
    reason = mcp2_ready()
    if reason is not None:
        pytest.skip(reason)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO / "src"),
        "HOME": os.environ.get("HOME", "/root"),
    }
    done = await anyio.run_process([str(MCP2_PYTHON), "-c", MCP2_SCRIPT], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    probe = [str(MCP2_PYTHON), "-c", "import importlib.metadata as m; print(m.version('mcp'))"]
    version = (await anyio.run_process(probe)).stdout.decode().strip()
    assert version.startswith("2."), version
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert FS.READ_FILE in out["tools"] and FS.WRITE_FILE in out["tools"]
    assert out["wrote"][0] is False and out["read"][0] is False and "on mcp 2" in out["read"][1]
    assert out["missing"][0] is True and "nope.txt" in out["missing"][1]
    assert out["stored"] == "on mcp 2"


# -- Claude's own tools on the bucket: the mount as cwd ----------------------------------------


async def test_mounted_cwd_shows_and_writes_the_bucket(moto: MotoServer) -> None:
    reason = fuse_available()
    if reason is not None:
        pytest.skip(f"FUSE is not available here: {reason}")
    raw = moto.s3fs(use_listings_cache=False)
    prefix = f"{S3_BUCKET}/{unique('cwd')}"
    raw.pipe_file(f"{prefix}/docs/readme.md", b"from the bucket\n")
    workspace = Workspace(filesystem=FsspecFilesystem(raw, root=prefix))
    async with workspace, mounted_cwd(workspace) as cwd:
        assert os.path.isabs(cwd) and os.path.ismount(cwd)
        options = ClaudeAgentOptions(cwd=cwd)
        assert str(options.cwd) == cwd
        assert sorted(os.listdir(cwd)) == ["docs"]
        assert Path(cwd, "docs", "readme.md").read_text() == "from the bucket\n"
        # What Claude's Bash does: a process with the mount as its working directory.
        done = await anyio.run_process(
            ["sh", "-c", "cat docs/readme.md && echo made > made.txt"], cwd=cwd
        )
        assert done.stdout == b"from the bucket\n"
        # What Claude's Write does: an ordinary file write.
        Path(cwd, "docs", "new.md").write_text("written by Claude\n")
    assert not os.path.exists(cwd), "the temporary mount point is removed"
    assert bucket_text(raw, f"{prefix}/made.txt") == "made\n"
    assert bucket_text(raw, f"{prefix}/docs/new.md") == "written by Claude\n"


async def test_mounted_cwd_of_local_and_resolved_workspaces(tmp_path: Path) -> None:
    local = Workspace(filesystem=LocalFilesystem(base_path=str(tmp_path)))
    async with mounted_cwd(local) as cwd:
        assert cwd == str(tmp_path), "a local directory needs no mount"
    resolved = Workspace(filesystem=lambda ctx: LocalFilesystem(base_path=str(tmp_path)))
    with pytest.raises(ValueError, match="static filesystem"):
        async with mounted_cwd(resolved):
            pass


async def test_mounted_cwd_of_a_read_only_local_directory(tmp_path: Path) -> None:
    reason = fuse_available()
    if reason is not None:
        pytest.skip(f"FUSE is not available here: {reason}")
    base = tmp_path / "base"
    base.mkdir()
    (base / "keep.txt").write_text("original\n")
    filesystem = LocalFilesystem(base_path=str(base), read_only=True)
    for workspace in (filesystem, Workspace(filesystem=filesystem)):
        async with mounted_cwd(workspace) as cwd:
            assert cwd != str(base) and os.path.ismount(cwd), "mounted, not the directory itself"
            assert Path(cwd, "keep.txt").read_text() == "original\n"
            # What Claude's Write, Edit and Bash would do in their working directory.
            with pytest.raises(OSError) as refused:
                Path(cwd, "keep.txt").write_text("overwritten\n")
            assert refused.value.errno == errno.EROFS
            with pytest.raises(OSError):
                Path(cwd, "new.txt").write_text("created\n")
            done = await anyio.run_process(["sh", "-c", "echo x > made.txt"], cwd=cwd, check=False)
            assert done.returncode != 0
    assert (base / "keep.txt").read_text() == "original\n"
    assert sorted(p.name for p in base.iterdir()) == ["keep.txt"]
    # Asking for a writable view of a read-only filesystem is refused, not granted.
    with pytest.raises(MountError, match="read-only"):
        async with mounted_cwd(filesystem, read_only=False):
            pass


# -- the SessionStore --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def memory_fs() -> MemoryFileSystem:
    return MemoryFileSystem(skip_instance_cache=True)


def store_on(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[FsspecSessionStore, Any, str]:
    """A store on a fresh prefix of ``backend``, its raw filesystem and root."""
    if backend == "memory":
        fs: Any = MemoryFileSystem(skip_instance_cache=True)
        root = f"/{unique('sessions')}"
    elif backend == "local":
        fs, root = LocalFileSystem(), str(tmp_path / unique("sessions"))
    elif backend == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        fs, root = moto.s3fs(), f"{S3_BUCKET}/{unique('sessions')}"
    else:
        gcs: FakeGcsServer = request.getfixturevalue("fake_gcs")
        fs, root = gcs.gcsfs(), f"{GCS_BUCKET}/{unique('sessions')}"
    return FsspecSessionStore(fs, root), fs, root


STORE_BACKENDS = [
    "memory",
    "local",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("gcs", marks=pytest.mark.gcs),
]


@pytest.mark.parametrize("backend", STORE_BACKENDS)
async def test_session_store_conformance(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    count = 0

    def make() -> FsspecSessionStore:
        nonlocal count
        count += 1
        return store_on(backend, request, tmp_path / str(count))[0]

    # All four optional methods are implemented, so all 14 contracts run.
    await run_session_store_conformance(make)
    assert count >= 14


def entry(n: int, writer: str = "w", **extra: Any) -> Any:
    return {"type": "user", "uuid": f"{writer}-{n}", "n": n, "writer": writer, **extra}


@pytest.mark.parametrize("backend", ["memory", pytest.param("s3", marks=pytest.mark.s3)])
async def test_concurrent_appends_lose_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store, fs, root = store_on(backend, request, tmp_path)
    second = FsspecSessionStore(fs, root)  # another writer on the same storage
    key: Any = {"project_key": "proj", "session_id": "busy"}
    batches = 60

    async with anyio.create_task_group() as tg:
        for i in range(batches):
            tg.start_soon(store.append, key, [entry(2 * i, "a"), entry(2 * i + 1, "a")])
            tg.start_soon(second.append, key, [entry(i, "b")])
    loaded: list[Any] | None = await FsspecSessionStore(fs, root).load(key)
    assert loaded is not None
    assert sorted(e["uuid"] for e in loaded) == sorted(
        [f"a-{n}" for n in range(2 * batches)] + [f"b-{n}" for n in range(batches)]
    )
    # Within one writer, entries come back in the order append was called.
    assert [e["n"] for e in loaded if e["writer"] == "a"] == list(range(2 * batches))
    assert [e["n"] for e in loaded if e["writer"] == "b"] == list(range(batches))
    # The summary saw every batch: its mtime is the newest one's.
    [summary] = await store.list_session_summaries("proj")
    [listed] = await store.list_sessions("proj")
    assert summary["mtime"] == listed["mtime"]
    # A retried batch (same uuids) is not doubled.
    await store.append(key, [entry(0, "b")])
    assert len(await store.load(key) or []) == 3 * batches


async def test_summary_written_only_when_changed_and_rebuilt_when_unsure() -> None:
    fs = MemoryFileSystem(skip_instance_cache=True)
    root = f"/{unique('summaries')}"
    store = FsspecSessionStore(fs, root)
    key: Any = {"project_key": "p", "session_id": "s"}
    path = f"{root}/p/s/summary.json"

    async def listed() -> Any:
        [summary] = await store.list_session_summaries("p")
        [session] = await store.list_sessions("p")
        assert summary["mtime"] == session["mtime"], "a summary listed is always fresh"
        whole = fold_session_summary(None, key, await store.load(key) or [])
        assert summary["data"] == whole["data"], "and is the fold of the whole transcript"
        return summary

    await store.append(key, [entry(0, cwd="/work")])
    first = fs.cat_file(path)
    for n in range(1, 5):
        await store.append(key, [entry(n)])
    assert fs.cat_file(path) == first, "a batch that changes nothing leaves the summary alone"
    await listed()
    assert fs.cat_file(path) == first, "a summary that covers every batch is not rebuilt"

    # Another writer (another process, say) changes the summary behind this store's back;
    # this store's next batches are folded onto what it last knew.
    other = FsspecSessionStore(fs, root)
    await other.append(key, [entry(5, customTitle="renamed")])
    await store.append(key, [entry(6)])
    assert (await listed())["data"]["custom_title"] == "renamed"
    rebuilt = fs.cat_file(path)
    await listed()
    assert fs.cat_file(path) == rebuilt, "the rebuilt summary was stored"
    await store.append(key, [entry(7, customTitle="mine")])
    assert (await listed())["data"]["custom_title"] == "mine"


WRITER = textwrap.dedent(
    """
    import json, sys, anyio
    import s3fs
    from agentvfs.integrations.claude import FsspecSessionStore

    options, root, writer = sys.argv[1:4]
    fs = s3fs.S3FileSystem(**json.loads(options))
    store = FsspecSessionStore(fs, root)

    async def main():
        key = {"project_key": "proj", "session_id": "shared"}
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(store.append, key, [{"type": "user", "uuid": f"{writer}-{i}", "n": i, "writer": writer}])

    anyio.run(main)
    """
)


@pytest.mark.s3
async def test_two_processes_append_to_one_session_on_s3(moto: MotoServer) -> None:
    root = f"{S3_BUCKET}/{unique('sessions')}"
    options = json.dumps(moto.s3fs(use_listings_cache=False).storage_options)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("AWS_CA_BUNDLE", None)
    results: list[Any] = []

    async def run(writer: str) -> None:
        results.append(
            await anyio.run_process(
                [sys.executable, "-c", WRITER, options, root, writer], env=env, check=False
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "p1")
        tg.start_soon(run, "p2")
    for done in results:
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    loaded: list[Any] | None = await FsspecSessionStore(moto.s3fs(), root).load(
        {"project_key": "proj", "session_id": "shared"}
    )
    assert loaded is not None and len(loaded) == 80
    for writer in ("p1", "p2"):
        assert [e["n"] for e in loaded if e["writer"] == writer] == list(range(40))


TRANSCRIPT: list[Any] = [
    {
        "type": "user",
        "uuid": "u1",
        "parentUuid": None,
        "sessionId": "9a1b6a52-4c59-4c5e-9d0c-1b2c3d4e5f60",
        "timestamp": "2025-01-01T00:00:00.000Z",
        "cwd": "/work",
        "message": {"role": "user", "content": "List the files in the bucket"},
    },
    {
        "type": "assistant",
        "uuid": "a1",
        "parentUuid": "u1",
        "sessionId": "9a1b6a52-4c59-4c5e-9d0c-1b2c3d4e5f60",
        "timestamp": "2025-01-01T00:00:01.000Z",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": "There are two files."}],
        },
    },
]


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
async def test_transcripts_survive_a_restart(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store, fs, root = store_on(backend, request, tmp_path)
    session = TRANSCRIPT[0]["sessionId"]
    # The project key the SDK derives from the working directory, so its helpers find it.
    key: Any = {"project_key": project_key_for_directory("/work"), "session_id": session}
    await store.append(key, [TRANSCRIPT[0]])
    await store.append(key, [TRANSCRIPT[1]])
    subkey: Any = {**key, "subpath": "subagents/agent-7"}
    await store.append(subkey, [{"type": "user", "uuid": "s1"}])
    del store

    # A new process: a new filesystem instance and a new store over the same storage.
    fresh_fs = type(fs)(**fs.storage_options) if backend == "s3" else LocalFileSystem()
    reopened = FsspecSessionStore(fresh_fs, root)
    assert await reopened.load(key) == TRANSCRIPT
    assert await reopened.list_subkeys(key) == ["subagents/agent-7"]
    # The SDK's own store helpers read it back.
    infos = await list_sessions_from_store(reopened, directory="/work")
    assert [info.session_id for info in infos] == [session]
    assert infos[0].first_prompt == "List the files in the bucket"
    read = await get_session_messages_from_store(reopened, session, directory="/work")
    assert [m.uuid for m in read] == ["u1", "a1"]
    await reopened.delete(key)
    assert await FsspecSessionStore(fresh_fs, root).load(key) is None
    assert await reopened.list_subkeys(key) == []


async def test_store_refuses_bad_input(memory_fs: MemoryFileSystem, tmp_path: Path) -> None:
    store = FsspecSessionStore(memory_fs, "/bad-input")
    with pytest.raises(ValueError, match="subpath"):
        await store.append({"project_key": "p", "session_id": "s", "subpath": ""}, [{"type": "x"}])
    with pytest.raises(ValueError, match="session_id"):
        await store.load({"project_key": "p", "session_id": ""})
    with pytest.raises(ValueError, match="root"):
        FsspecSessionStore(memory_fs)
    with pytest.raises(TypeError, match="fsspec filesystem or a URL"):
        FsspecSessionStore(42, "x")
    # Odd key parts stay inside the root and come back exactly.
    odd: Any = {"project_key": "../..", "session_id": "a/b%c", "subpath": "subagents/../x"}
    await store.append(odd, [{"type": "x", "v": 1}])  # type: ignore[typeddict-unknown-key]
    assert await store.load(odd) == [{"type": "x", "v": 1}]
    assert all(p.startswith("/bad-input/") for p in memory_fs.find("/bad-input"))
    assert await store.list_subkeys(odd) == ["subagents/../x"]
    # A URL works as storage.
    by_url = FsspecSessionStore(f"file://{tmp_path}", "sessions")
    await by_url.append({"project_key": "p", "session_id": "s"}, [{"type": "x"}])
    assert list((tmp_path / "sessions").rglob("*.jsonl"))


def test_module_layout() -> None:
    # Not the place for setup: the adapter's import must not be needed by agentvfs itself.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import agentvfs, agentvfs.integrations, sys; print('claude_agent_sdk' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"
