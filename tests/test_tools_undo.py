"""Checkpoints (``tools={"checkpoints": True}``) and ``mastra_workspace_undo``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentvfs import Workspace
from agentvfs.tools import WORKSPACE_TOOLS, ToolFailure, WorkspaceTool
from agentvfs.vfs import BackendFilesystem, MemoryBackend

pytestmark = pytest.mark.anyio

FS = WORKSPACE_TOOLS.FILESYSTEM
UNDO = WORKSPACE_TOOLS.CHECKPOINTS.UNDO
ON = {"checkpoints": True, UNDO: {"enabled": True}}


async def run(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> Any:
    return await tools[name].execute(args)


async def state(ws: Workspace) -> dict[str, str]:
    fs = ws.filesystem
    assert fs is not None
    entries = await fs.readdir("", recursive=True)
    out: dict[str, str] = {}
    for e in entries:
        if e.name.startswith(".agentvfs"):
            continue
        out[e.name] = (
            "<dir>" if e.type == "directory" else str(await fs.read_file(e.name, encoding="utf-8"))
        )
    return out


async def workspace(tools: dict[str, Any] | None) -> Workspace:
    ws = Workspace(filesystem=BackendFilesystem(MemoryBackend()), tools=tools)
    await ws.init()
    await ws.filesystem.write_file("a.txt", "alpha\n")  # type: ignore[union-attr]
    return ws


async def test_undo_restores_the_state_before_each_batch() -> None:
    ws = await workspace(ON)
    tools = await ws.create_tools()
    start = await state(ws)
    # Batch 1: an edit, a new file in a new directory, a unicode name.
    await run(tools, FS.READ_FILE, path="a.txt")
    await run(tools, FS.EDIT_FILE, path="a.txt", old_string="alpha", new_string="ALPHA")
    await run(tools, FS.MKDIR, path="d/e")
    await run(tools, FS.WRITE_FILE, path="d/ü.txt", content="x")
    after_one = await state(ws)
    # Batch 2 (a read in between starts it): a delete and a write.
    await run(tools, FS.LIST_FILES, path="")
    await run(tools, FS.DELETE, path="a.txt")
    await run(tools, FS.WRITE_FILE, path="b.txt", content="b")
    assert len(await ws.list_snapshots()) == 2

    out = await run(tools, UNDO)
    assert out.startswith("Undid 2 write tool calls: restored ")
    assert "1 checkpoint left" in out
    assert await state(ws) == after_one
    # Tools built again share the workspace's checkpoints.
    out = await run(await ws.create_tools(), UNDO)
    assert out.startswith("Undid 3 write tool calls")
    assert await state(ws) == start
    nothing = await run(tools, UNDO)
    assert isinstance(nothing, ToolFailure)
    assert nothing.startswith("Nothing to undo")
    await ws.destroy()


async def test_undo_keeps_and_reports_later_changes() -> None:
    ws = await workspace(ON)
    tools = await ws.create_tools()
    await run(tools, FS.WRITE_FILE, path="b.txt", content="agent")
    await run(tools, FS.WRITE_FILE, path="c.txt", content="agent")
    await ws.filesystem.write_file("b.txt", "someone else")  # type: ignore[union-attr]
    await ws.filesystem.write_file("z.txt", "elsewhere")  # type: ignore[union-attr]
    out = await run(tools, UNDO)
    assert "Kept 1 path that changed since (not restored):\n  b.txt: changed since" in out
    now = await state(ws)
    assert now == {"a.txt": "alpha\n", "b.txt": "someone else", "z.txt": "elsewhere"}
    await ws.destroy()


async def test_quiet_period_starts_a_new_batch() -> None:
    ws = await workspace({"checkpoints": {"quiet_ms": 1}, UNDO: {"enabled": True}})
    tools = await ws.create_tools()
    import anyio

    await run(tools, FS.WRITE_FILE, path="b.txt", content="1")
    await anyio.sleep(0.01)
    await run(tools, FS.WRITE_FILE, path="c.txt", content="2")
    assert len(await ws.list_snapshots()) == 2
    await ws.destroy()


async def test_checkpoints_past_keep_and_undone_ones_are_deleted_from_the_store() -> None:
    ws = await workspace({"checkpoints": {"quiet_ms": 60_000, "keep": 2}, UNDO: {"enabled": True}})
    tools = await ws.create_tools()
    states = []
    for i in range(4):  # four batches, a read between each
        states.append(await state(ws))
        await run(tools, FS.READ_FILE, path="a.txt")
        await run(tools, FS.WRITE_FILE, path=f"f{i}.txt", content=str(i))
    # Only the newest two checkpoints are kept, in the stack and in the store.
    listed = await ws.list_snapshots()
    assert [s.name for s in listed] == ["checkpoint", "checkpoint"]
    out = await run(tools, UNDO)
    assert "1 checkpoint left" in out
    assert await state(ws) == states[3]
    assert len(await ws.list_snapshots()) == 1  # the undone checkpoint's snapshot is gone
    out = await run(tools, UNDO)
    assert "0 checkpoints left" in out and await state(ws) == states[2]
    assert await ws.list_snapshots() == []
    nothing = await run(tools, UNDO)
    assert isinstance(nothing, ToolFailure) and nothing.startswith("Nothing to undo")
    # A snapshot the caller took is never one of them.
    mine = await ws.snapshot("mine")
    await run(tools, FS.WRITE_FILE, path="g.txt", content="g")
    await run(tools, UNDO)
    assert [s.id for s in await ws.list_snapshots()] == [mine.id]
    await ws.destroy()


async def test_a_write_is_not_held_up_long_by_a_garbage_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentvfs.tools import _checkpoints

    monkeypatch.setattr(_checkpoints, "LOCK_WAIT", 0.3)
    ws = await workspace(ON)
    tools = await ws.create_tools()
    from agentvfs.snapshots._store import _lock_record, _lock_signed_bytes

    # A collection's claim, signed as the host's own are (one that is not holds a write off
    # for the checkpoint's wait once, then not at all).
    claim = ".agentvfs/snapshots/locks/gc-0123456789abcdef.json"
    fields = {**_lock_record(600.0), "host": "elsewhere", "pid": 1}
    fields["mac"] = ws.snapshot_store().key.sign("lock", _lock_signed_bytes(claim, fields))
    await ws.filesystem.write_file(claim, json.dumps(fields))  # type: ignore[union-attr]
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no checkpoint could be taken before this write: a garbage collection"):
        await run(tools, FS.WRITE_FILE, path="b.txt", content="b")
    assert time.monotonic() - started < 5
    assert not await ws.filesystem.exists("b.txt")  # type: ignore[union-attr]
    await ws.filesystem.delete_file(claim)  # type: ignore[union-attr]
    await run(tools, FS.WRITE_FILE, path="b.txt", content="b")
    assert "Undid 1 write tool call" in await run(tools, UNDO)
    await ws.destroy()


async def test_checkpoints_off_takes_no_snapshot_and_lists_no_undo() -> None:
    ws = await workspace(None)
    tools = await ws.create_tools()
    assert UNDO not in tools
    await run(tools, FS.WRITE_FILE, path="b.txt", content="1")
    assert await ws.list_snapshots() == []
    await ws.destroy()


async def test_tool_listing_and_config() -> None:
    plain = await workspace(None)
    default_names = list(await plain.create_tools())
    # Checkpoints on: the same tools, undo still off until enabled.
    ws = await workspace({"checkpoints": True})
    assert list(await ws.create_tools()) == default_names
    ws.set_tools_config(ON)
    names = list(await ws.create_tools())
    assert names == [
        *default_names[: default_names.index(FS.GREP) + 1],
        UNDO,
        *default_names[default_names.index(FS.GREP) + 1 :],
    ]
    ws.set_tools_config({"checkpoints": True, UNDO: {"enabled": True, "name": "undo"}})
    assert "undo" in await ws.create_tools()
    # A top-level enabled does not turn undo on; a top-level off turns it off only where own is unset.
    ws.set_tools_config({"checkpoints": True, "enabled": True})
    assert UNDO not in await ws.create_tools()
    for bad, match in (
        ({"checkpoints": "yes"}, "checkpoints must be True, False"),
        ({"checkpoints": {"quiet_ms": 0}}, "quiet_ms must be a positive"),
        ({"checkpoints": {"quietMs": 5}}, "unknown option"),
        ({"checkpoints": {"keep": 0}}, "keep must be a whole number"),
        ({"checkpoints": {"keep": True}}, "keep must be a whole number"),
        ({"checkpoints": {"keep": 2.5}}, "keep must be a whole number"),
        ({"checkpoints": {"commands": "yes"}}, "commands must be True or False"),
        ({UNDO: {"enabled": True}}, "needs checkpoints"),
    ):
        ws.set_tools_config(bad)
        with pytest.raises(ValueError, match=match):
            await ws.create_tools()
    dynamic = Workspace(
        filesystem=lambda ctx: BackendFilesystem(MemoryBackend()), tools={"checkpoints": True}
    )
    with pytest.raises(ValueError, match="static filesystem"):
        await dynamic.create_tools()
    await ws.destroy()
    await plain.destroy()


async def test_undo_honours_approval_and_hooks() -> None:
    seen: list[str] = []

    def before(info: dict[str, Any]) -> Any:
        seen.append(info["workspace_tool_name"])
        if info["workspace_tool_name"] == UNDO:
            return {"proceed": False, "output": "blocked"}
        return None

    ws = await workspace(
        {
            "checkpoints": True,
            UNDO: {"enabled": True, "require_approval": True},
            "hooks": {"before_tool_call": before},
        }
    )
    tools = await ws.create_tools()
    assert tools[UNDO].require_approval
    assert await tools[UNDO].needs_approval({})
    assert not await tools[FS.WRITE_FILE].needs_approval({"path": "b.txt", "content": "x"})
    await run(tools, FS.WRITE_FILE, path="b.txt", content="x")
    assert await run(tools, UNDO) == "blocked"
    assert seen == [FS.WRITE_FILE, UNDO]
    await ws.destroy()


async def test_fork_has_its_own_checkpoints() -> None:
    ws = await workspace(ON)
    async with ws.fork() as fork:
        tools = await fork.create_tools()
        await run(tools, FS.WRITE_FILE, path="b.txt", content="fork")
        assert "restored 1 path" in await run(tools, UNDO)
        assert await fork.changes() == []
        assert await ws.list_snapshots() == []
    await ws.destroy()


SB = WORKSPACE_TOOLS.SANDBOX


async def local_workspace(root: Any, tools: dict[str, Any]) -> Workspace:
    from agentvfs import LocalFilesystem
    from agentvfs.sandbox import LocalSandbox

    (root / "a.txt").write_text("alpha\n")
    (root / "keep").mkdir()
    (root / "keep" / "k.txt").write_text("kept\n")
    ws = Workspace(
        filesystem=LocalFilesystem(str(root)), sandbox=LocalSandbox(working_directory=str(root)), tools=tools
    )
    await ws.init()
    return ws


async def test_undo_takes_back_what_a_shell_command_changed(tmp_path: Any) -> None:
    ws = await local_workspace(tmp_path, ON)
    tools = await ws.create_tools()
    start = await state(ws)
    await run(tools, FS.WRITE_FILE, path="b.txt", content="by a tool")
    after_write = await state(ws)
    out = await run(
        tools, SB.EXECUTE_COMMAND,
        command="rm a.txt && rm -r keep && mkdir -p new/sub && echo hi > new/sub/x.txt && echo more >> b.txt",
    )  # fmt: skip
    assert "Exit code" not in out or "Exit code: 0" in out, out
    assert await state(ws) == {"b.txt": "by a toolmore\n", "new": "<dir>", "new/sub": "<dir>", "new/sub/x.txt": "hi\n"}
    # A command is a checkpoint of its own: undo takes back the command, then the write.
    out = await run(tools, UNDO)
    assert out.startswith("Undid 1 command: restored 7 paths to checkpoint "), out
    assert await state(ws) == after_write
    out = await run(tools, UNDO)
    assert out.startswith("Undid 1 write tool call")
    assert await state(ws) == start
    await ws.destroy()


async def test_undo_of_a_command_keeps_later_changes_and_skips_background_ones(tmp_path: Any) -> None:
    ws = await local_workspace(tmp_path, ON)
    tools = await ws.create_tools()
    await run(tools, SB.EXECUTE_COMMAND, command="echo one > one.txt && echo two > two.txt && rm a.txt")
    (tmp_path / "two.txt").write_text("changed by someone else\n")
    out = await run(tools, UNDO)
    assert "Kept 1 path that changed since (not restored):\n  two.txt: changed since" in out
    assert not (tmp_path / "one.txt").exists() and (tmp_path / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "two.txt").read_text() == "changed by someone else\n"
    # A background command is not checkpointed (its changes come after its call returns).
    before = len(await ws.list_snapshots())
    await run(tools, SB.EXECUTE_COMMAND, command="true", background=True)
    assert len(await ws.list_snapshots()) == before
    await ws.destroy()


async def test_commands_off_takes_no_checkpoint_before_a_command(tmp_path: Any) -> None:
    ws = await local_workspace(tmp_path, {"checkpoints": {"commands": False}, UNDO: {"enabled": True}})
    tools = await ws.create_tools()
    await run(tools, SB.EXECUTE_COMMAND, command="rm a.txt")
    assert await ws.list_snapshots() == []
    assert isinstance(await run(tools, UNDO), ToolFailure)
    await ws.destroy()
