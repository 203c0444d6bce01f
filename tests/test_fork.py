"""Workspace.fork: a private overlay over the workspace (or a snapshot of it), committed into
the original with guarded writes, or discarded.

Changes "made by someone else" in the original go straight to storage (the harness's
oracle: ``os``, raw fsspec, boto3 for S3), never through the workspace.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from agentvfs import LocalFilesystem, Workspace, WorkspaceError
from agentvfs.errors import SnapshotNotFoundError
from agentvfs.testing import Harness
from agentvfs.tools import WORKSPACE_TOOLS, WorkspaceTool
from agentvfs.vfs import BackendFilesystem, MemoryBackend
from conftest import BACKENDS, harness_for

pytestmark = pytest.mark.anyio

FS = WORKSPACE_TOOLS.FILESYSTEM


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Any) -> Harness:
    h = harness_for(request.param, request, tmp_path)
    h.put("notes.txt", b"one\ntwo\n")
    h.put("src/app.py", b"print('hi')\n")
    h.put("old/gone.txt", b"bye\n")
    return h


async def run(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> Any:
    return await tools[name].execute(args)


async def agent_session(fork: Workspace) -> None:
    """What an agent does: read, edit, write new files (a unicode name too), delete, mkdir."""
    tools = await fork.create_tools()
    assert "one" in await run(tools, FS.READ_FILE, path="notes.txt")
    await run(tools, FS.EDIT_FILE, path="notes.txt", old_string="two", new_string="TWO")
    await run(tools, FS.WRITE_FILE, path="docs/résumé ü.md", content="# ünïcode\n")
    await run(tools, FS.DELETE, path="old/gone.txt")
    await run(tools, FS.MKDIR, path="empty/inner")


async def test_fork_is_private_until_commit(harness: Harness) -> None:
    async with Workspace(filesystem=harness.fs) as ws, ws.fork() as fork:
        assert fork.is_fork and not ws.is_fork
        await agent_session(fork)
        # The fork sees its changes; the original, in storage, does not.
        assert await fork.filesystem.read_file("notes.txt", encoding="utf-8") == "one\nTWO\n"  # type: ignore[union-attr]
        assert harness.get("notes.txt") == b"one\ntwo\n"
        assert harness.get("docs/résumé ü.md") is None
        assert harness.get("old/gone.txt") == b"bye\n"
        assert not await ws.filesystem.exists("empty/inner")  # type: ignore[union-attr]
        assert "notes.txt" in await fork.changes()

        report = await fork.commit()
        assert report.ok, report.reasons
        assert {"notes.txt", "docs/résumé ü.md", "old/gone.txt", "empty/inner"} <= set(
            report.applied
        )
        assert harness.get("notes.txt") == b"one\nTWO\n"
        assert harness.get("docs/résumé ü.md") == "# ünïcode\n".encode()
        assert harness.get("old/gone.txt") is None
        assert (await ws.filesystem.stat("empty/inner")).type == "directory"  # type: ignore[union-attr]
        assert await fork.changes() == []


async def test_commit_reports_a_change_made_in_the_original(harness: Harness) -> None:
    async with Workspace(filesystem=harness.fs) as ws, ws.fork() as fork:
        await agent_session(fork)
        harness.put("notes.txt", b"someone else\n")  # straight into storage
        report = await fork.commit()
        assert report.conflicts == ("notes.txt",)
        assert "changed in the target" in report.reasons["notes.txt"]
        assert harness.get("notes.txt") == b"someone else\n"  # not overwritten
        assert harness.get("docs/résumé ü.md") == "# ünïcode\n".encode()
        assert harness.get("old/gone.txt") is None
        # The conflict stays in the fork; force applies it.
        assert await fork.changes() == ["notes.txt"]
        assert (await fork.commit(force=True)).applied == ("notes.txt",)
        assert harness.get("notes.txt") == b"one\nTWO\n"


async def test_fork_of_a_snapshot_is_guarded_by_the_snapshots_versions(harness: Harness) -> None:
    async with Workspace(filesystem=harness.fs) as ws:
        await ws.snapshot("before")
        harness.put("notes.txt", b"changed live\n")
        harness.put("src/app.py", b"print('live')\n")
        async with ws.fork("before") as fork:
            # The fork shows the snapshot, not the live state.
            assert await fork.filesystem.read_file("notes.txt", encoding="utf-8") == "one\ntwo\n"  # type: ignore[union-attr]
            await agent_session(fork)
            await fork.filesystem.write_file("new.txt", "fresh")  # type: ignore[union-attr]
            report = await fork.commit()
            # notes.txt changed live since the snapshot: a conflict, the live change kept.
            assert "notes.txt" in report.conflicts
            assert harness.get("notes.txt") == b"changed live\n"
            assert harness.get("new.txt") == b"fresh"
            assert harness.get("docs/résumé ü.md") == "# ünïcode\n".encode()
            # A path the fork did not touch keeps its live content.
            assert harness.get("src/app.py") == b"print('live')\n"


async def test_discard_drops_the_changes(tmp_path: Any) -> None:
    live = LocalFilesystem(str(tmp_path))
    (tmp_path / "a.txt").write_text("a")
    async with Workspace(filesystem=live) as ws, ws.fork() as fork:
        await agent_session_small(fork)
        await fork.discard()
        assert await fork.changes() == []
        assert await fork.filesystem.read_file("a.txt", encoding="utf-8") == "a"  # type: ignore[union-attr]
        assert not await fork.filesystem.exists("b.txt")  # type: ignore[union-attr]
        assert (await fork.commit()).applied == ()
        assert sorted(os.listdir(tmp_path)) == ["a.txt"]


async def agent_session_small(fork: Workspace) -> None:
    fs = fork.filesystem
    assert fs is not None
    await fs.write_file("a.txt", "changed")
    await fs.write_file("b.txt", "new")
    await fs.mkdir("dir")


async def test_fork_with_its_own_upper_layer_and_config(tmp_path: Any) -> None:
    live = BackendFilesystem(MemoryBackend())
    upper = LocalFilesystem(str(tmp_path / "upper"))
    config = {FS.DELETE: {"enabled": False}}
    async with Workspace(filesystem=live, tools=config) as ws:
        fork = ws.fork(upper=upper, name="trial")
        async with fork:
            assert fork.name == "trial"
            assert fork.get_tools_config() == config and fork.get_tools_config() is not config
            assert FS.DELETE not in await fork.create_tools()
            await agent_session_small(fork)
            assert (tmp_path / "upper" / "b.txt").read_text() == "new"
            assert not await live.exists("b.txt")
            assert (await fork.commit()).ok
            assert await live.read_file("b.txt", encoding="utf-8") == "new"
        # Snapshots of a fork are its own: never in the upper layer, so never committed.
        async with ws.fork() as fork2:
            await fork2.snapshot("in-fork")
            assert await fork2.changes() == []
            assert [s.name for s in await ws.list_snapshots()] == []


async def test_commit_and_discard_need_a_fork() -> None:
    async with Workspace(filesystem=BackendFilesystem(MemoryBackend())) as ws:
        for call in (ws.commit, ws.discard, ws.changes):
            with pytest.raises(WorkspaceError, match=r"workspace.fork\(\)") as info:
                await call()
            assert info.value.code == "NOT_A_FORK"
    with pytest.raises(WorkspaceError, match="static filesystem"):
        Workspace(filesystem=lambda ctx: BackendFilesystem(MemoryBackend())).fork()


async def test_fork_of_an_unknown_snapshot_fails_at_init() -> None:
    async with Workspace(filesystem=BackendFilesystem(MemoryBackend())) as ws:
        fork = ws.fork("no-such-snapshot")
        with pytest.raises(SnapshotNotFoundError):
            await fork.init()


async def test_commands_in_the_forks_sandbox_change_the_fork_only(tmp_path: Any) -> None:
    # The fork's own sandbox, with the fork's filesystem mounted into it (as the docstring
    # says): what a shell command writes or deletes there stays in the fork until commit.
    from _mounted import fuse_unavailable
    from agentvfs.mounts import Mount
    from agentvfs.sandbox import LocalSandbox

    if fuse_unavailable() is not None:
        pytest.skip(str(fuse_unavailable()))
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    (live_dir / "base.txt").write_text("from the base\n")
    (live_dir / "gone.txt").write_text("to delete\n")
    wd = tmp_path / "wd"
    (wd / "repo").mkdir(parents=True)
    async with Workspace(filesystem=LocalFilesystem(str(live_dir))) as ws:
        async with ws.fork(sandbox=LocalSandbox(working_directory=str(wd))) as fork:
            assert fork.filesystem is not None and fork.sandbox is not None
            with Mount(fork.filesystem, str(wd / "repo")):
                result = await fork.sandbox.execute_command(
                    "cat repo/base.txt && echo made > repo/new.txt && echo more >> repo/base.txt && rm repo/gone.txt"
                )
                assert (result.exit_code, result.stdout) == (0, "from the base\n"), result.stderr
            # The original is untouched; the fork has every change.
            assert sorted(os.listdir(live_dir)) == ["base.txt", "gone.txt"]
            assert (live_dir / "base.txt").read_text() == "from the base\n"
            assert await fork.filesystem.read_file("new.txt", encoding="utf-8") == "made\n"
            assert not await fork.filesystem.exists("gone.txt")
            report = await fork.commit()
            assert report.ok, report
        assert sorted(os.listdir(live_dir)) == ["base.txt", "new.txt"]
        assert (live_dir / "base.txt").read_text() == "from the base\nmore\n"
