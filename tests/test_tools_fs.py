"""The filesystem tools against the reference's golden outputs, identical on every backend."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentvfs import (
    WORKSPACE_TOOLS,
    FileReadRequiredError,
    LocalFilesystem,
    RequestContext,
    StaleFileError,
    ToolMedia,
    Workspace,
    WorkspaceReadOnlyError,
    WorkspaceTool,
)
from agentvfs.testing import Harness
from agentvfs.tools import ToolFailure
from conftest import BACKENDS, harness_for

pytestmark = pytest.mark.anyio
FS = WORKSPACE_TOOLS.FILESYSTEM

def exact(message: str) -> str:
    """A pattern matching ``message`` and nothing else."""
    return f"^{re.escape(message)}$"


FIXTURE_A = {
    "a.txt": b"Hello World\nsecond line\n",
    "five.txt": b"Line 1\nLine 2\nLine 3\nLine 4\nLine 5",
    "bin.bin": bytes.fromhex("89504E47"),
    "img.png": bytes.fromhex("89504E470D0A1A0A"),
    "data.zip": bytes.fromhex("010203"),
}


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    h = harness_for(request.param, request, tmp_path)
    for name, data in FIXTURE_A.items():
        h.put(name, data)
    return h


async def tools_for(harness: Harness, config: dict[str, Any] | None = None) -> dict[str, WorkspaceTool]:
    await harness.fs.mkdir("sub")
    return await Workspace(filesystem=harness.fs, tools=config).create_tools()


async def run(tools: dict[str, WorkspaceTool], name: str, **args: Any) -> Any:
    return await tools[name].execute(args)


async def test_registration_order(harness: Harness) -> None:
    tools = await tools_for(harness)
    assert list(tools) == [FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP]
    assert all(t.workspace_tool_name == n and t.name == n for n, t in tools.items())
    assert tools[FS.READ_FILE].input_schema["required"] == ["path"]


async def test_read_file_goldens(harness: Harness) -> None:
    t = await tools_for(harness)
    assert await run(t, FS.READ_FILE, path="a.txt") == "a.txt (24 bytes)\n     1→Hello World\n     2→second line\n     3→"
    assert await run(t, FS.READ_FILE, path="five.txt", offset=2, limit=2, showLineNumbers=False) == "five.txt (lines 2-3 of 5, 34 bytes)\nLine 2\nLine 3"
    assert await run(t, FS.READ_FILE, path="five.txt", offset=4) == "five.txt (lines 4-5 of 5, 34 bytes)\n     4→Line 4\n     5→Line 5"
    assert await run(t, FS.READ_FILE, path="five.txt", offset=10) == "five.txt (lines 0-0 of 5, 34 bytes)\n"
    binary = await run(t, FS.READ_FILE, path="bin.bin")
    assert binary.startswith("bin.bin (4 bytes, application/x-binary) — binary file not readable as text.")
    for extra in ({}, {"encoding": "base64"}):
        media = await run(t, FS.READ_FILE, path="img.png", **extra)
        assert isinstance(media, ToolMedia)
        assert (media.text, media.media_type, media.data) == ("img.png (8 bytes, image/png)", "image/png", "iVBORw0KGgo=")
        assert media.to_model_output()[1] == {"type": "media", "data": "iVBORw0KGgo=", "media_type": "image/png"}
    assert await run(t, FS.READ_FILE, path="data.zip", encoding="hex") == "data.zip (3 bytes, hex)\n010203"


async def test_read_file_errors_and_limits(harness: Harness) -> None:
    t = await tools_for(harness)
    with pytest.raises(FileNotFoundError, match=exact("File not found: nope.txt")):
        await run(t, FS.READ_FILE, path="nope.txt")
    with pytest.raises(IsADirectoryError, match=exact("Path is a directory: sub")):
        await run(t, FS.READ_FILE, path="sub")
    with pytest.raises(PermissionError, match=re.escape("Permission denied: access on ../x.txt")):
        await run(t, FS.READ_FILE, path="../x.txt")
    harness.put("big.txt", "".join(f"line number {i} with some words\n" for i in range(2000)).encode())
    big = await run(t, FS.READ_FILE, path="big.txt")
    assert big.startswith("big.txt (")
    assert re.search(r"\n\[output truncated: showing first ~2000 of ~\d+ tokens\]$", big)
    for bad, message in (
        ({"path": "a.txt", "offset": 0}, "field 'offset' must be at least 1"),
        ({"path": "a.txt", "limit": "x"}, "field 'limit' must be integer"),
        ({"path": "a.txt", "bogus": 1}, "unknown field 'bogus'"),
        ({}, "missing required field 'path'"),
        ({"path": "a.txt", "encoding": "latin9"}, "field 'encoding' must be one of"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            await t[FS.READ_FILE].execute(bad)


async def test_write_edit_stat_mkdir_delete(harness: Harness) -> None:
    t = await tools_for(harness)
    assert await run(t, FS.WRITE_FILE, path="n1/n2/new.txt", content="New content") == "Wrote 11 bytes to n1/n2/new.txt"
    assert harness.get("n1/n2/new.txt") == b"New content"
    with pytest.raises(FileExistsError, match=exact("File already exists: a.txt")):
        await run(t, FS.WRITE_FILE, path="a.txt", content="x", overwrite=False)
    assert harness.get("a.txt") == FIXTURE_A["a.txt"]
    assert await run(t, FS.WRITE_FILE, path="u.txt", content="héllo") == "Wrote 6 bytes to u.txt"

    harness.put("e.txt", b"foo\nbar\nfoo\nbaz $x\n")
    not_found = "The specified text was not found. Make sure you use the exact text from the file."
    missing = await run(t, FS.EDIT_FILE, path="e.txt", old_string="qux", new_string="y")
    # The reference's text, flagged as a failure for protocols that have one (MCP isError).
    assert missing == not_found and isinstance(missing, ToolFailure)
    assert await run(t, FS.EDIT_FILE, path="e.txt", old_string="", new_string="y") == not_found
    assert (await run(t, FS.EDIT_FILE, path="e.txt", old_string="foo", new_string="F")).startswith("The specified text appears 2 times. ")
    assert await run(t, FS.EDIT_FILE, path="e.txt", old_string="bar", new_string="BAR\nBAR2") == "Replaced 1 occurrence in e.txt (lines 2-3)"
    assert await run(t, FS.EDIT_FILE, path="e.txt", old_string="foo", new_string="F", replace_all=True) == "Replaced 2 occurrences in e.txt (lines 1, 4)"
    assert await run(t, FS.EDIT_FILE, path="e.txt", old_string="baz $x", new_string="$& $$ $1") == "Replaced 1 occurrence in e.txt (lines 5)"
    assert harness.get("e.txt") == b"F\nBAR\nBAR2\nF\n$& $$ $1\n"
    with pytest.raises(FileNotFoundError):
        await run(t, FS.EDIT_FILE, path="missing.txt", old_string="a", new_string="b")

    assert re.fullmatch(r"a\.txt Type: file Size: 24 bytes Modified: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", await run(t, FS.FILE_STAT, path="a.txt"))
    stat_missing = await run(t, FS.FILE_STAT, path="zzz")
    assert stat_missing == "zzz: not found" and isinstance(stat_missing, ToolFailure)
    assert not isinstance(await run(t, FS.FILE_STAT, path="a.txt"), ToolFailure)

    assert await run(t, FS.MKDIR, path="m/a/b") == "Created directory m/a/b"
    assert harness.isdir("m/a/b")
    with pytest.raises(FileExistsError):
        await run(t, FS.MKDIR, path="a.txt")
    with pytest.raises(FileNotFoundError, match=exact("Directory not found: x")):
        await run(t, FS.MKDIR, path="x/y", recursive=False)

    harness.put("full/f.txt", b"f")
    with pytest.raises(OSError, match=exact("Directory not empty: full")):
        await run(t, FS.DELETE, path="full")
    assert await run(t, FS.DELETE, path="full", recursive=True) == "Deleted full"
    assert harness.get("full/f.txt") is None
    with pytest.raises(FileNotFoundError):
        await run(t, FS.DELETE, path="nope.txt")
    assert await run(t, FS.DELETE, path="sub") == "Deleted sub"


async def test_read_only_tool_set(harness: Harness) -> None:
    ro = harness.reopen(read_only=True)
    tools = await Workspace(filesystem=ro).create_tools()
    assert list(tools) == [FS.READ_FILE, FS.LIST_FILES, FS.FILE_STAT, FS.GREP]
    with pytest.raises(WorkspaceReadOnlyError, match=exact("Workspace is in read-only mode. Cannot perform: write_file")):
        await ro.write_file("a.txt", "x")


async def test_resolved_read_only_filesystem_refuses_at_run_time(harness: Harness) -> None:
    ro = harness.reopen(read_only=True)
    tools = await Workspace(filesystem=lambda ctx: ro).create_tools()
    assert FS.WRITE_FILE in tools
    with pytest.raises(WorkspaceReadOnlyError, match=re.escape("Cannot perform: write_file") + "$"):
        await run(tools, FS.WRITE_FILE, path="a.txt", content="x")
    assert harness.get("a.txt") == FIXTURE_A["a.txt"]


async def test_read_before_write_policy(harness: Harness) -> None:
    config = {name: {"require_read_before_write": True} for name in (FS.WRITE_FILE, FS.EDIT_FILE)}
    t = await tools_for(harness, config)
    harness.put("t.txt", b"one\n")
    with pytest.raises(FileReadRequiredError, match=exact('File "t.txt" has not been read. You must read a file before writing to it.')):
        await run(t, FS.WRITE_FILE, path="t.txt", content="x")
    await run(t, FS.READ_FILE, path="./t.txt")  # ./t.txt and t.txt are one file
    await anyio.sleep(1.1)  # object stores keep modification times to the second
    harness.put("t.txt", b"changed outside\n")
    with pytest.raises(FileReadRequiredError, match=r'^File "t.txt" was modified since last read \(read at: .+Z, current: .+Z\)\. Please re-read the file to get the latest contents\.$'):
        await run(t, FS.EDIT_FILE, path="t.txt", old_string="changed", new_string="edited")
    assert harness.get("t.txt") == b"changed outside\n"
    await run(t, FS.READ_FILE, path="t.txt")
    assert await run(t, FS.EDIT_FILE, path="t.txt", old_string="changed", new_string="edited") == "Replaced 1 occurrence in t.txt (lines 1)"
    with pytest.raises(FileReadRequiredError, match="has not been read"):
        await run(t, FS.EDIT_FILE, path="t.txt", old_string="edited", new_string="again")
    assert await run(t, FS.WRITE_FILE, path="brand-new.txt", content="ok") == "Wrote 2 bytes to brand-new.txt"


async def test_stale_write_without_policy(harness: Harness) -> None:
    t = await tools_for(harness)
    harness.put("s.txt", b"v1\n")
    await run(t, FS.READ_FILE, path="s.txt")
    harness.put("s.txt", b"v2 from elsewhere\n")
    with pytest.raises(StaleFileError, match=r"^File was modified externally: s.txt \(expected mtime "):
        await run(t, FS.EDIT_FILE, path="s.txt", old_string="v", new_string="w")
    assert harness.get("s.txt") == b"v2 from elsewhere\n"


async def test_hooks(harness: Harness) -> None:
    log: list[tuple[str, ...]] = []

    def before(ctx: dict[str, Any]) -> dict[str, Any] | None:
        log.append(("before", ctx["tool_name"], ctx["workspace_tool_name"], ctx["input"]["path"]))
        if ctx["input"]["path"] == "blocked.txt":
            return {"proceed": False, "output": "BLOCKED BY HOOK"}
        return None

    async def after(ctx: dict[str, Any]) -> None:
        log.append(("after", type(ctx["error"]).__name__ if ctx["error"] else "ok", str(ctx["output"])[:5]))

    config = {"hooks": {"before_tool_call": before, "after_tool_call": after}, FS.READ_FILE: {"name": "view"}}
    t = await tools_for(harness, config)
    assert await run(t, "view", path="blocked.txt") == "BLOCKED BY HOOK"
    await run(t, "view", path="a.txt")
    with pytest.raises(FileNotFoundError):
        await run(t, "view", path="missing.txt")
    assert log == [
        ("before", "view", FS.READ_FILE, "blocked.txt"),
        ("before", "view", FS.READ_FILE, "a.txt"),
        ("after", "ok", "a.txt"),
        ("before", "view", FS.READ_FILE, "missing.txt"),
        ("after", "FileNotFound", "None"),
    ]


async def test_enabled_approval_and_renames(harness: Harness) -> None:
    only_read = await tools_for(harness, {"enabled": False, FS.READ_FILE: {"enabled": True}})
    assert list(only_read) == [FS.READ_FILE]

    def boom(ctx: dict[str, Any]) -> bool:
        raise RuntimeError("no")

    assert FS.MKDIR not in await tools_for(harness, {FS.MKDIR: {"enabled": boom}})
    admin_only = {FS.DELETE: {"enabled": lambda ctx: ctx["request_context"].get("role") == "admin"}}
    ws = Workspace(filesystem=harness.fs, tools=admin_only)
    assert FS.DELETE not in await ws.create_tools()
    assert FS.DELETE in await ws.create_tools(request_context=RequestContext([("role", "admin")]))
    approvals = await tools_for(harness, {"require_approval": True, FS.READ_FILE: {"require_approval": False}})
    assert {n: t.require_approval for n, t in approvals.items()}[FS.READ_FILE] is False
    assert all(t.require_approval for n, t in approvals.items() if n != FS.READ_FILE)
    dynamic = await tools_for(harness, {FS.DELETE: {"require_approval": lambda ctx: ctx["args"]["path"].startswith("important")}})
    assert dynamic[FS.DELETE].require_approval
    assert await dynamic[FS.DELETE].needs_approval({"path": "important/x"}) is True
    assert await dynamic[FS.DELETE].needs_approval({"path": "scratch/x"}) is False
    renamed = await tools_for(harness, {FS.READ_FILE: {"name": "view"}})
    assert "view" in renamed and renamed["view"].id == "view" and renamed["view"].workspace_tool_name == FS.READ_FILE
    with pytest.raises(ValueError, match="^" + re.escape('Duplicate workspace tool name "x": tool "mastra_workspace_edit_file" conflicts with an already-registered tool.')):
        await tools_for(harness, {FS.WRITE_FILE: {"name": "x"}, FS.EDIT_FILE: {"name": "x"}})
    ws = Workspace(filesystem=harness.fs)
    assert FS.MKDIR in await ws.create_tools()
    ws.set_tools_config({FS.MKDIR: {"enabled": False}})
    assert FS.MKDIR not in await ws.create_tools()


async def test_write_lock(harness: Harness) -> None:
    t = await tools_for(harness)
    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(run_positional, t, FS.WRITE_FILE, "race.txt", f"write-{i}")
            await anyio.lowlevel.checkpoint()

    assert harness.get("race.txt") == b"write-2"


async def run_positional(tools: dict[str, WorkspaceTool], name: str, path: str, content: str) -> None:
    await tools[name].execute({"path": path, "content": content})


async def test_write_lock_timeout(tmp_path: Path) -> None:
    class Slow(LocalFilesystem):
        async def write_file(self, path: str, content: str | bytes, **kw: Any) -> None:
            await anyio.sleep(0.2)
            await super().write_file(path, content, **kw)

    ws = Workspace(filesystem=Slow(tmp_path), tools={"write_lock_timeout_ms": 50})
    tools = await ws.create_tools()
    with pytest.raises(TimeoutError, match=exact('write-lock timeout on "slow.txt" after 50ms')):
        await run(tools, FS.WRITE_FILE, path="slow.txt", content="x")


async def test_symlink_escape_through_tools(tmp_path: Path) -> None:
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (outside / "existing.txt").write_text("secret")
    os.symlink(outside, base / "alias")
    t = await Workspace(filesystem=LocalFilesystem(base)).create_tools()
    with pytest.raises(PermissionError):
        await run(t, FS.READ_FILE, path="alias/existing.txt")
    with pytest.raises(PermissionError):
        await run(t, FS.WRITE_FILE, path="alias/escaped.txt", content="x")
    with pytest.raises(PermissionError, match="path is outside the workspace"):
        await run(t, FS.READ_FILE, path="/etc/passwd")
    assert sorted(os.listdir(outside)) == ["existing.txt"]



async def test_large_file_reads_in_chunks(tmp_path: Path) -> None:
    import tracemalloc

    line = b"0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ KLMNOPQRST\n"  # 64 bytes
    count = (48 * 1024 * 1024) // len(line) // 4096 * 4096  # a 48 MiB file
    (tmp_path / "big.log").write_bytes(line * count)
    tools = await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()
    await run(tools, FS.READ_FILE, path="big.log", limit=1)  # loads tiktoken's tables (~20 MB, once)
    tracemalloc.start()
    try:
        out = await run(tools, FS.READ_FILE, path="big.log", offset=1_000, limit=50)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * 1024 * 1024, peak  # a few 2 MiB chunks, never the whole 48 MiB
    lines = out.split("\n")
    assert lines[0] == f"big.log (lines 1000-1049 of {count + 1}, {count * len(line)} bytes)"
    assert lines[1] == "  1000→" + line.decode().rstrip("\n") and len(lines) == 51
    head = await run(tools, FS.READ_FILE, path="big.log")
    assert head.startswith(f"big.log ({count * len(line)} bytes)\n     1→0123456789")
    assert re.search(r"\[output truncated: showing first ~2000 of ~\d+ tokens\]$", head)
    estimated = int(re.findall(r"of ~(\d+) tokens", head)[0])
    assert estimated > 10 * 2000  # scaled from the prefix read to the whole file


async def test_chunked_reads_match_whole_reads(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentvfs.tools import _filesystem

    t = await tools_for(harness)
    harness.put("lines.txt", "".join(f"line {i}\n" for i in range(1, 40)).encode())
    cases: list[dict[str, Any]] = [
        {"path": "a.txt"}, {"path": "five.txt", "offset": 2, "limit": 2, "showLineNumbers": False},
        {"path": "five.txt", "offset": 4}, {"path": "five.txt", "offset": 10}, {"path": "lines.txt", "offset": 7, "limit": 9},
        {"path": "lines.txt", "limit": 1}, {"path": "lines.txt", "offset": 39},
    ]
    whole = [await run(t, FS.READ_FILE, **case) for case in cases]
    # Tiny chunks that split lines everywhere, on every backend's ranged reads.
    monkeypatch.setattr(_filesystem, "STREAM_THRESHOLD", 0)
    monkeypatch.setattr(_filesystem, "STREAM_CHUNK", 7)
    chunked = [await run(t, FS.READ_FILE, **case) for case in cases]
    assert chunked == whole


async def test_media_options(harness: Harness) -> None:
    small = await tools_for(harness, {FS.READ_FILE: {"max_media_bytes": 4}})
    assert await run(small, FS.READ_FILE, path="img.png") == (
        "img.png (8 bytes, image/png) — exceeds max_media_bytes (4). Returning metadata only; "
        "configure `max_media_bytes` on the read_file tool to raise this cap."
    )
    off = await tools_for(harness, {FS.READ_FILE: {"media_types": False}})
    assert (await run(off, FS.READ_FILE, path="img.png")).startswith("img.png (8 bytes, image/png) — binary file not readable as text.")
    images = await tools_for(harness, {FS.READ_FILE: {"media_types": ["image/*"]}})
    assert isinstance(await run(images, FS.READ_FILE, path="img.png"), ToolMedia)
    bad = await tools_for(harness, {FS.READ_FILE: {"media_types": ["not a type"]}})
    with pytest.raises(ValueError, match=re.escape("Invalid `media_types` pattern: 'not a type'")):
        await run(bad, FS.READ_FILE, path="img.png")
    assert await run(await tools_for(harness), FS.READ_FILE, path="data.zip", encoding="binary") == "data.zip (3 bytes, binary)\n\x01\x02\x03"


async def test_tools_config_is_checked(tmp_path: Path) -> None:
    fs = LocalFilesystem(tmp_path)
    for config, message in (
        ({FS.DELETE: {"requireApproval": True}}, "unknown option 'requireApproval' for mastra_workspace_delete (did you mean 'require_approval'?)"),
        ({"mastra_workspace_delete_file": {}}, "unknown key 'mastra_workspace_delete_file'"),
        ({"writeLockTimeoutMs": 5}, "unknown key 'writeLockTimeoutMs' (did you mean 'write_lock_timeout_ms'?)"),
        ({FS.DELETE: {"enabled": "false"}}, "mastra_workspace_delete.enabled must be a bool or a function"),
        ({"write_lock_timeout_ms": 0}, "write_lock_timeout_ms must be a positive number"),
        ({FS.DELETE: True}, "mastra_workspace_delete must be a mapping of options"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            await Workspace(filesystem=fs, tools=config).create_tools()


async def test_edit_refuses_to_corrupt_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("café TODO\n".encode("latin-1"))
    tools = await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()
    with pytest.raises(ValueError, match="is not valid UTF-8 text"):
        await run(tools, FS.EDIT_FILE, path="latin.txt", old_string="TODO", new_string="DONE")
    assert (tmp_path / "latin.txt").read_bytes() == "café TODO\n".encode("latin-1")


async def test_binary_answers_count_as_reads(harness: Harness) -> None:
    t = await tools_for(harness, {FS.WRITE_FILE: {"require_read_before_write": True}})
    assert "binary file not readable as text" in await run(t, FS.READ_FILE, path="bin.bin")
    assert await run(t, FS.WRITE_FILE, path="bin.bin", content="text now") == "Wrote 8 bytes to bin.bin"


async def test_grep_root_slash_on_local_is_outside(tmp_path: Path) -> None:
    tools = await Workspace(filesystem=LocalFilesystem(tmp_path)).create_tools()
    with pytest.raises(PermissionError):
        await run(tools, FS.GREP, pattern="x", path="/")


async def test_reads_and_edits_are_bounded_on_every_backend(harness: Harness) -> None:
    data = bytes(range(256)) * 2400  # 600 KiB: more than the output can show in any encoding
    harness.put("blob.dat", data)
    harness.put("notes.txt", b"old\n" * 1000)
    t = await tools_for(harness, {FS.EDIT_FILE: {"max_file_bytes": 1000}})
    for encoding, need in (("base64", 195_075), ("hex", 130_049), ("binary", 260_097)):
        out = await run(t, FS.READ_FILE, path="blob.dat", encoding=encoding)
        assert out.startswith(f"blob.dat ({len(data)} bytes, {encoding}, first {need} bytes read)\n")
        assert re.search(r"\n\[output truncated: showing first ~2000 of ~\d+ tokens\]$", out)
    with pytest.raises(ValueError, match=re.escape("notes.txt is larger than edit_file edits (1000 bytes, max_file_bytes")):
        await run(t, FS.EDIT_FILE, path="notes.txt", old_string="old", new_string="new", replace_all=True)
    assert harness.get("notes.txt") == b"old\n" * 1000
