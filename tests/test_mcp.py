"""``agentvfs mcp``: the official MCP client SDK talking to the server as a real subprocess over stdio."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.session import ElicitationFnT
from mcp.client.stdio import stdio_client

from agentvfs import WORKSPACE_TOOLS, LocalFilesystem, Workspace
from agentvfs._config import load_config, workspace_from_config
from agentvfs.cli import main
from agentvfs.tools import NOT_APPROVED

pytestmark = pytest.mark.anyio
FS = WORKSPACE_TOOLS.FILESYSTEM
ALL_TOOLS = [FS.READ_FILE, FS.WRITE_FILE, FS.EDIT_FILE, FS.LIST_FILES, FS.DELETE, FS.FILE_STAT, FS.MKDIR, FS.GREP]
TIMEOUT = 20  # seconds for one whole session: start, calls, shutdown
PNG = bytes.fromhex("89504E470D0A1A0A0000000D49484452")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "ws"
    base.mkdir()
    (base / "a.txt").write_bytes(b"Hello World\nsecond line\n")
    return base


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """The server's stderr, kept in a file (pytest's captured stderr has no file descriptor)."""
    with open(tmp_path / "server-stderr.log", "w+") as handle:
        yield handle


@asynccontextmanager
async def session(
    errlog: TextIO, *args: str, elicit: ElicitationFnT | None = None
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentvfs.cli", "mcp", *args],
        env={"PATH": os.environ.get("PATH", "")},
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, read_timeout_seconds=timedelta(seconds=10), elicitation_callback=elicit) as client,
    ):
        await client.initialize()
        yield client


def text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1, result.content
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def ok(client: ClientSession, name: str, **args: Any) -> str:
    result = await client.call_tool(name, args)
    assert result.isError is False, result.content
    return text(result)


async def failed(client: ClientSession, name: str, **args: Any) -> str:
    result = await client.call_tool(name, args)
    assert result.isError is True, result.content
    return text(result)


async def test_root_takes_slash_paths_from_the_workspace_root(root: Path, errlog: TextIO) -> None:
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--root", str(root)) as client:
            assert (await ok(client, FS.READ_FILE, path="/a.txt")).startswith("a.txt (24 bytes)")
            assert await ok(client, FS.WRITE_FILE, path="/made/here.txt", content="x") == "Wrote 1 bytes to /made/here.txt"
            assert (root / "made/here.txt").read_text() == "x"
            assert await failed(client, FS.READ_FILE, path="/../outside.txt") != ""


async def test_lists_the_filesystem_tools(root: Path, errlog: TextIO) -> None:
    expected = await Workspace(filesystem=LocalFilesystem(root)).create_tools()
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--root", str(root)) as client:
            listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == ALL_TOOLS
    for tool in listed:
        assert tool.description == expected[tool.name].description
        assert tool.inputSchema == expected[tool.name].input_schema
        assert tool.annotations is not None
        assert tool.annotations.readOnlyHint is (tool.name in (FS.READ_FILE, FS.LIST_FILES, FS.FILE_STAT, FS.GREP))
    assert {t.name for t in listed if t.annotations and t.annotations.destructiveHint} == {FS.WRITE_FILE, FS.EDIT_FILE, FS.DELETE}


async def test_calls_return_the_tool_outputs_and_errors_keep_the_server_serving(root: Path, errlog: TextIO) -> None:
    (root / "img.png").write_bytes(PNG)
    (root / "doc.pdf").write_bytes(b"%PDF-1.4\n%%EOF\n")
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--root", str(root)) as client:
            assert await ok(client, FS.READ_FILE, path="a.txt") == "a.txt (24 bytes)\n     1→Hello World\n     2→second line\n     3→"
            # A missing file is a tool error, and the next call works.
            assert await failed(client, FS.READ_FILE, path="missing.txt") == "File not found: missing.txt"
            assert await ok(client, FS.WRITE_FILE, path="notes/b.txt", content="alpha\nbeta\n") == "Wrote 11 bytes to notes/b.txt"
            assert (root / "notes" / "b.txt").read_text() == "alpha\nbeta\n"
            assert await ok(client, FS.EDIT_FILE, path="notes/b.txt", old_string="beta", new_string="gamma") == (
                "Replaced 1 occurrence in notes/b.txt (lines 2)"
            )
            assert (root / "notes" / "b.txt").read_text() == "alpha\ngamma\n"
            # A failed edit is the reference's text, flagged as a tool error.
            not_found = await failed(client, FS.EDIT_FILE, path="notes/b.txt", old_string="nope", new_string="x")
            assert not_found.startswith("The specified text was not found")
            (root / "notes" / "twice.txt").write_text("x x\n")
            twice = await failed(client, FS.EDIT_FILE, path="notes/twice.txt", old_string="x", new_string="y")
            assert "2" in twice and (root / "notes" / "twice.txt").read_text() == "x x\n"
            assert await ok(client, FS.GREP, pattern="o") == (
                "2 matches across 1 file\n---\n./a.txt:1:5: Hello World\n./a.txt:2:4: second line"
            )
            assert await ok(client, FS.READ_FILE, path="a.txt", offset=2, limit=1) == (
                "a.txt (lines 2-2 of 3, 24 bytes)\n     2→second line"
            )
            # Nulls for optional fields mean "not given".
            assert await ok(client, FS.READ_FILE, path="a.txt", offset=None, limit=None, showLineNumbers=None) == (
                "a.txt (24 bytes)\n     1→Hello World\n     2→second line\n     3→"
            )
            # Invalid input: unknown field, missing field, wrong type, unknown tool.
            assert await failed(client, FS.READ_FILE, path="a.txt", bogus=1) == (
                "mastra_workspace_read_file: unknown field 'bogus' (expected one of: path, offset, limit, showLineNumbers, encoding)"
            )
            assert await failed(client, FS.WRITE_FILE, path="x.txt") == "mastra_workspace_write_file: missing required field 'content'"
            assert await failed(client, FS.READ_FILE, path=3) == "mastra_workspace_read_file: field 'path' must be string, got int"
            assert await failed(client, "no_such_tool") == "Unknown tool: no_such_tool"
            assert await failed(client, FS.READ_FILE, path="../outside.txt") != ""
            # Media: caption plus an image, or plus an embedded resource for a PDF.
            image = await client.call_tool(FS.READ_FILE, {"path": "img.png"})
            assert image.isError is False
            caption, picture = image.content
            assert isinstance(caption, types.TextContent) and caption.text == "img.png (16 bytes, image/png)"
            assert isinstance(picture, types.ImageContent) and picture.mimeType == "image/png"
            assert base64.b64decode(picture.data) == PNG
            pdf = await client.call_tool(FS.READ_FILE, {"path": "doc.pdf"})
            caption, embedded = pdf.content
            assert isinstance(caption, types.TextContent) and caption.text == "doc.pdf (15 bytes, application/pdf)"
            assert isinstance(embedded, types.EmbeddedResource)
            assert isinstance(embedded.resource, types.BlobResourceContents)
            assert embedded.resource.mimeType == "application/pdf" and str(embedded.resource.uri) == "agentvfs://workspace/doc.pdf"
            assert base64.b64decode(embedded.resource.blob) == b"%PDF-1.4\n%%EOF\n"
            assert await failed(client, FS.FILE_STAT, path="missing.txt") == "missing.txt: not found"
            assert await ok(client, FS.DELETE, path="notes", recursive=True) == "Deleted notes"
    assert not (root / "notes").exists()
    errlog.seek(0)
    assert "Traceback" not in errlog.read()


async def test_read_only_offers_no_write_tools(root: Path, errlog: TextIO) -> None:
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--root", str(root), "--read-only") as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == [FS.READ_FILE, FS.LIST_FILES, FS.FILE_STAT, FS.GREP]
            assert (await ok(client, FS.READ_FILE, path="a.txt")).startswith("a.txt (24 bytes)")
            assert await failed(client, FS.WRITE_FILE, path="x.txt", content="x") == f"Unknown tool: {FS.WRITE_FILE}"
    assert not (root / "x.txt").exists()


def approval_config(tmp_path: Path, root: Path) -> Path:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"root": str(root), "tools": {FS.DELETE: {"require_approval": True}}}))
    return config


async def test_approval_is_asked_by_elicitation(tmp_path: Path, root: Path, errlog: TextIO) -> None:
    (root / "b.txt").write_text("b")
    (root / "c.txt").write_text("c")
    answers: list[types.ElicitResult] = [
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),
        types.ElicitResult(action="accept", content={}),
    ]
    asked: list[types.ElicitRequestParams] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return answers.pop(0)

    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--config", str(approval_config(tmp_path, root)), elicit=elicit) as client:
            assert await failed(client, FS.DELETE, path="a.txt") == NOT_APPROVED
            assert (root / "a.txt").exists()
            assert await failed(client, FS.DELETE, path="a.txt") == NOT_APPROVED
            assert (root / "a.txt").exists()
            assert await ok(client, FS.DELETE, path="a.txt") == "Deleted a.txt"
            assert not (root / "a.txt").exists()
            # Tools without require_approval run without asking; bad input is refused before asking.
            assert await ok(client, FS.WRITE_FILE, path="b.txt", content="bb") == "Wrote 2 bytes to b.txt"
            assert (await failed(client, FS.DELETE, path="c.txt", bogus=True)).startswith("mastra_workspace_delete: unknown field 'bogus'")
    assert len(asked) == 3
    assert isinstance(asked[0], types.ElicitRequestFormParams)
    assert FS.DELETE in asked[0].message and '"path": "a.txt"' in asked[0].message
    assert (root / "c.txt").exists()


async def test_approval_without_elicitation_support_refuses(tmp_path: Path, root: Path, errlog: TextIO) -> None:
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--config", str(approval_config(tmp_path, root))) as client:
            message = await failed(client, FS.DELETE, path="a.txt")
            assert message.startswith(f"Tool {FS.DELETE} requires approval, but this MCP client does not support elicitation")
            assert await ok(client, FS.FILE_STAT, path="a.txt") != "a.txt: not found"
    assert (root / "a.txt").exists()


async def test_toml_config_with_an_fsspec_url(tmp_path: Path, root: Path, errlog: TextIO) -> None:
    config = tmp_path / "mcp.toml"
    config.write_text(f'url = "file://{root}"\nread_only = false\n\n[storage_options]\nauto_mkdir = true\n')
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--config", str(config)) as client:
            assert len((await client.list_tools()).tools) == 8
            assert await ok(client, FS.WRITE_FILE, path="deep/new.txt", content="hi") == "Wrote 2 bytes to deep/new.txt"
            assert (await ok(client, FS.READ_FILE, path="a.txt")).startswith("a.txt (24 bytes)")
    assert (root / "deep" / "new.txt").read_text() == "hi"


# -- configuration, in process ---------------------------------------------------------------------


def test_config_files(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{"root": "ws", "read_only": true, "tools": {"mastra_workspace_delete": {"enabled": false}}}')
    config = load_config(tmp_path / "c.json")
    assert config["root"] == os.path.join(str(tmp_path), "ws")  # relative to the file
    assert config["read_only"] is True
    (tmp_path / "bad.json").write_text('{"rot": "ws"}')
    with pytest.raises(ValueError, match="unknown configuration key"):
        load_config(tmp_path / "bad.json")
    (tmp_path / "bad.toml").write_text("root = [")
    with pytest.raises(ValueError, match="invalid configuration"):
        load_config(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="exactly one of root"):
        workspace_from_config({})
    with pytest.raises(ValueError, match="exactly one of root"):
        workspace_from_config({"root": str(tmp_path), "url": "memory://"})
    with pytest.raises(ValueError, match="storage_options apply to url"):
        workspace_from_config({"root": str(tmp_path), "storage_options": {"a": 1}})
    ws = workspace_from_config({"url": "memory://x", "read_only": True})
    assert ws.filesystem is not None and ws.filesystem.read_only


async def test_config_with_a_sandbox_and_search_offers_those_tools(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the walrus note\n")
    ws = workspace_from_config(
        {"root": str(tmp_path), "sandbox": {"isolation": "none"}, "bm25": True, "auto_index_paths": ["."]}
    )
    async with ws:
        tools = await ws.create_tools()
        assert "mastra_workspace_execute_command" in tools
        assert "mastra_workspace_search" in tools
        assert await tools["mastra_workspace_execute_command"].execute({"command": "cat notes.txt"}) == "the walrus note\n"
        assert str(await tools["mastra_workspace_search"].execute({"query": "walrus"})).startswith("notes.txt:1-1:")
    with pytest.raises(ValueError, match="sandbox: unknown key"):
        workspace_from_config({"root": str(tmp_path), "sandbox": {"isolate": "bwrap"}})
    with pytest.raises(ValueError, match="auto_index_paths"):
        workspace_from_config({"root": str(tmp_path), "auto_index_paths": "docs"})


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["mcp"])
    assert exit_info.value.code == 2
    assert "give exactly one of root" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["mcp", "--root", str(tmp_path), "--url", "memory://"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["mcp", "--url", "memory://", "-o", "novalue"])
    assert "expected key=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["mcp", "--config", str(tmp_path / "absent.json")])
    assert "absent.json" in capsys.readouterr().err


def test_cli_builds_the_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import agentvfs._config as config_module
    import agentvfs.tools as tools_module

    seen: list[dict[str, Any]] = []

    def capture(config: dict[str, Any]) -> Workspace:
        seen.append(dict(config))
        return workspace_from_config(config)

    async def serve(workspace: Workspace) -> None:
        seen.append({"filesystem": workspace.filesystem})

    monkeypatch.setattr(config_module, "workspace_from_config", capture)
    monkeypatch.setattr(tools_module, "serve_stdio", serve)
    # Values are JSON where they parse, else strings (s3fs connects at its first request only).
    argv = ["-o", "max_concurrency=1", "-o", "endpoint_url=http://127.0.0.1:9", "-o", 'key="2"', "-o", "anon=true"]
    assert main(["mcp", "--url", "s3://bucket", *argv, "--read-only"]) == 0
    assert seen[0] == {
        "url": "s3://bucket", "read_only": True,
        "storage_options": {"max_concurrency": 1, "endpoint_url": "http://127.0.0.1:9", "key": "2", "anon": True},
    }  # fmt: skip
    fs = seen[1]["filesystem"]
    assert fs is not None and fs.read_only
    seen.clear()
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"url": "memory://y", "storage_options": {"max_paths": 1}, "tools": {"x": {}}}))
    assert main(["mcp", "--config", str(config), "-o", "listings_expiry_time=2"]) == 0
    assert seen[0] == {"url": "memory://y", "storage_options": {"max_paths": 1, "listings_expiry_time": 2}, "tools": {"x": {}}}
    seen.clear()
    assert main(["mcp", "--config", str(config), "--root", str(tmp_path)]) == 0  # the url's options go too
    assert seen[0] == {"root": str(tmp_path), "tools": {"x": {}}}


MCP2_PYTHON = Path(__file__).resolve().parents[1] / ".venv/opt/mcp2/bin/python"
MCP2_CLIENT = """
import asyncio, json, sys
from mcp import Client
from mcp.client.stdio import StdioServerParameters

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["-m", "agentvfs", "mcp", "--root", sys.argv[2]])
    async with Client(params) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        read = await client.call_tool("mastra_workspace_read_file", {"path": "/a.txt"})
        edit = await client.call_tool("mastra_workspace_edit_file", {"path": "a.txt", "old_string": "zz", "new_string": "y"})
        print(json.dumps({"names": names, "read": [read.is_error, read.content[0].text],
                          "edit": [edit.is_error, edit.content[0].text]}))
asyncio.run(main())
"""


@pytest.mark.skipif(not MCP2_PYTHON.exists(), reason="no mcp 2.x client in .venv/opt/mcp2 (scripts/setup.sh test makes it)")
def test_a_client_on_the_next_sdk_major_version(root: Path, tmp_path: Path) -> None:
    """Clients on mcp 2.x probe with ``server/discover`` first: answered "method not found",
    they fall back to ``initialize``, and the server logs nothing about it."""
    import subprocess

    done = subprocess.run(
        [os.fspath(MCP2_PYTHON), "-c", MCP2_CLIENT, sys.executable, os.fspath(root)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["names"] == ALL_TOOLS
    assert seen["read"] == [False, "a.txt (24 bytes)\n     1→Hello World\n     2→second line\n     3→"]
    assert seen["edit"][0] is True and seen["edit"][1].startswith("The specified text was not found")
    assert "validation error" not in done.stderr.lower() and "Traceback" not in done.stderr, done.stderr


@pytest.mark.s3
async def test_credentials_from_an_env_file_reach_a_server_started_bare(
    moto: Any, tmp_path: Path, errlog: TextIO
) -> None:
    """MCP clients start servers with a bare environment: the configuration's env_file is
    how AWS_* reach the storage client."""
    (tmp_path / "s3.env").write_text(
        "# credentials for the workspace\n"
        f"export AWS_ACCESS_KEY_ID=testing\nAWS_SECRET_ACCESS_KEY='testing'\nAWS_ENDPOINT_URL={moto.endpoint_url}\n"
    )
    config = tmp_path / "ws.json"
    config.write_text(json.dumps({"url": f"s3://agentvfs-test/mcp-{tmp_path.name}", "env_file": "s3.env"}))
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--config", os.fspath(config)) as client:
            assert await ok(client, FS.WRITE_FILE, path="/x.txt", content="in the bucket") == "Wrote 13 bytes to /x.txt"
    assert moto.s3fs().cat_file(f"agentvfs-test/mcp-{tmp_path.name}/x.txt") == b"in the bucket"


@pytest.mark.s3
async def test_a_workspace_that_cannot_start_says_why_to_the_client(
    moto: Any, tmp_path: Path, errlog: TextIO
) -> None:
    config = tmp_path / "ws.json"
    config.write_text(json.dumps({"url": "s3://agentvfs-test/x", "env": {"AWS_ENDPOINT_URL": moto.endpoint_url}}))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentvfs", "mcp", "--config", os.fspath(config)],
        env={"PATH": os.environ.get("PATH", ""), "AWS_SHARED_CREDENTIALS_FILE": os.fspath(tmp_path / "none"),
             "AWS_CONFIG_FILE": os.fspath(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true"},
    )  # fmt: skip
    with anyio.fail_after(TIMEOUT):
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as client:
            started = await client.initialize()
            assert started.instructions is not None and "no credentials were found" in started.instructions
            assert (await client.list_tools()).tools == []
            why = await failed(client, FS.READ_FILE, path="a.txt")
            assert why.startswith("agentvfs: the workspace did not start: Cannot use s3://agentvfs-test/x: no credentials")
    errlog.seek(0)
    lines = errlog.read().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentvfs mcp: the workspace did not start: Cannot use"), lines


async def test_url_with_a_sandbox_takes_paths_without_the_mount_prefix(tmp_path: Path) -> None:
    from agentvfs.mounts import fuse_available

    if fuse_available() is not None:
        pytest.skip(f"FUSE unavailable: {fuse_available()}")
    config = {"url": f"memory://mcp-{tmp_path.name}", "sandbox": {"isolation": "none", "working_directory": str(tmp_path)}}
    async with workspace_from_config(config) as ws:
        tools = await ws.create_tools()
        assert await tools[FS.WRITE_FILE].execute({"path": "mcp.txt", "content": "hi"}) == "Wrote 2 bytes to mcp.txt"
        shown = await tools[WORKSPACE_TOOLS.SANDBOX.EXECUTE_COMMAND].execute({"command": "cat workspace/mcp.txt"})
        assert "hi" in str(shown)
        assert "1→hi" in str(await tools[FS.READ_FILE].execute({"path": "workspace/mcp.txt"}))


async def test_a_configuration_typo_is_said_to_the_client(tmp_path: Path, errlog: TextIO) -> None:
    config = tmp_path / "ws.json"
    config.write_text(json.dumps({"root": str(tmp_path), "sandbx": {}}))
    with anyio.fail_after(TIMEOUT):
        async with session(errlog, "--config", os.fspath(config)) as client:
            why = await failed(client, FS.READ_FILE, path="a.txt")
    assert why.startswith("agentvfs: the configuration cannot be used: ") and "unknown configuration key(s): sandbx" in why
    errlog.seek(0)
    lines = errlog.read().splitlines()
    assert len(lines) == 1 and "unknown configuration key(s): sandbx" in lines[0], lines


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_server_whose_client_keeps_stdin_open(root: Path, signum: str) -> None:
    """A server told to stop while its client still holds stdin open stops at once (it used
    to wait for a line that never came), with the shell's code for the signal."""
    import signal
    import subprocess
    import time

    def default_sigint() -> None:
        # A test run started in the background (`.ci/run &`) passes SIGINT on ignored, and a
        # process that ignores SIGINT is right to go on serving.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentvfs", "mcp", "--root", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        request = json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }).encode()  # fmt: skip
        # One request in two writes: lines are joined across reads.
        proc.stdin.write(request[:20])
        proc.stdin.flush()
        time.sleep(0.2)
        proc.stdin.write(request[20:] + b"\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())
        assert reply["id"] == 1 and reply["result"]["serverInfo"]["name"], reply
        sent = getattr(signal, signum)
        started = time.monotonic()
        proc.send_signal(sent)
        code = proc.wait(timeout=20)
        assert code == 128 + sent if sent == signal.SIGTERM else code == 130
        assert time.monotonic() - started < 10
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _RawClient:
    """The server as a subprocess spoken to line by line, for messages no client SDK sends:
    each write from a thread of its own (a long line fills the pipe until the server reads)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentvfs", "mcp", "--root", str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
        )  # fmt: skip
        self.writers: list[Any] = []
        self.send({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        })  # fmt: skip
        assert self.answer()["id"] == 1
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, Any] | bytes) -> None:
        import threading

        line = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        stdin = self.proc.stdin
        assert stdin is not None
        previous = self.writers[-1] if self.writers else None

        def write() -> None:
            if previous is not None:
                previous.join()
            stdin.write(line)
            stdin.flush()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        self.writers.append(writer)

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> tuple[int, str]:
        """Close stdin; the exit code and stderr."""
        import subprocess

        for writer in self.writers:
            writer.join(timeout=60)
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return code, self.proc.stderr.read().decode(errors="replace")


def test_a_long_message_is_read_in_linear_time(root: Path) -> None:
    """A 48 MiB line (under the default limit) is read in about the time of copying it; the
    reader joined each 64 KiB read to all before it: 8/16/32 MiB took 0.4/1.6/6.4 s, 48 MiB
    fifteen seconds on an idle machine (and 45 on a busy one)."""
    import time

    client = _RawClient(root, {"AGENTVFS_MCP_MAX_MESSAGE_BYTES": "lots"})
    try:
        started = time.monotonic()
        reason = b"x" * (48 << 20)
        client.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99,"reason":"' + reason + b'"}}\n')
        client.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert client.answer() == {"jsonrpc": "2.0", "id": 2, "result": {}}
        elapsed = time.monotonic() - started
    finally:
        code, stderr = client.close()
    # The slack of a busy two-core machine: this takes about a second idle.
    assert elapsed < 8, f"a 48 MiB message took {elapsed:.1f} s to read"
    assert code == 0 and "Traceback" not in stderr, stderr
    # A limit that is no number of bytes is said, and the default used.
    assert "AGENTVFS_MCP_MAX_MESSAGE_BYTES='lots' is not a positive number of bytes; using the default, 67108864" in stderr


def test_a_message_past_the_limit_is_answered_and_the_server_goes_on(root: Path) -> None:
    """Past the limit a line is passed over unread: its request (the id found at its start or
    its end) gets an "invalid request" error naming the limit, a notification a line on
    stderr, and the server answers what follows and closes cleanly."""
    limit = 1 << 20
    client = _RawClient(root, {"AGENTVFS_MCP_MAX_MESSAGE_BYTES": str(limit)})
    try:
        content = "y" * (2 << 20)
        # The id last, as the TypeScript SDK orders a request's members.
        tail_id = json.dumps({"method": "tools/call", "params": {"name": FS.WRITE_FILE, "arguments": {"path": "b.txt", "content": content}}, "jsonrpc": "2.0", "id": "ts-3"})
        client.send(tail_id.encode() + b"\n")
        refused = client.answer()
        assert refused["id"] == "ts-3" and refused["error"]["code"] == types.INVALID_REQUEST, refused
        assert f"past this server's limit of {limit} bytes" in refused["error"]["message"]
        assert refused["error"]["data"] == {"size": len(tail_id), "limit": limit}
        client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5, "reason": content}})
        client.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert client.answer() == {"jsonrpc": "2.0", "id": 4, "result": {}}
    finally:
        code, stderr = client.close()
    assert code == 0 and "Traceback" not in stderr, stderr
    assert f"a message of {len(tail_id)} bytes was not read: the limit is {limit} bytes" in stderr
    assert "request 'ts-3' was answered with an error" in stderr
    assert "it named no request id to answer" in stderr
    assert not (root / "b.txt").exists()


async def test_the_official_client_is_told_its_message_is_too_long(root: Path, errlog: TextIO) -> None:
    from mcp.shared.exceptions import McpError

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentvfs", "mcp", "--root", str(root)],
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # the checkout under test, where it is one
            "AGENTVFS_MCP_MAX_MESSAGE_BYTES": str(1 << 20),
        },
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, read_timeout_seconds=timedelta(seconds=10)) as client,
    ):
        await client.initialize()
        with pytest.raises(McpError, match=r"past this server's limit of 1048576 bytes"):
            await client.call_tool(FS.WRITE_FILE, {"path": "big.txt", "content": "z" * (2 << 20)})
        assert await ok(client, FS.WRITE_FILE, path="small.txt", content="fits")
        assert (root / "small.txt").read_text() == "fits" and not (root / "big.txt").exists()
