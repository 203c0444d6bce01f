#!/usr/bin/env python
"""Overhead of the Claude adapter (MCP server, session store) on memory storage, against agentvfs.

Two workloads, each on a ``MemoryFileSystem``. Tools: ``--ops`` write_file calls then
``--ops`` read_file calls three ways: ``WorkspaceTool.execute`` directly; through the
in-process SDK MCP server as Claude Code's calls reach it (``mcp_message`` control requests
into a ``ClaudeSDKClient``, over the SDK's public ``Transport`` interface standing in for the
CLI); and through ``agentvfs mcp --url memory://...``, the stdio server a user would run
without this adapter, from an ``mcp`` ``ClientSession``. Transcripts: ``--ops`` appends then
a load through ``FsspecSessionStore``, of a main transcript and of a subagent's, against
writing the same JSONL objects with fsspec directly (``pipe_file``) and reading them back
(``find`` + ``cat``). Everything runs once a round, in ``--rounds`` interleaved rounds, and
the median of each is reported with the ratio to the direct column.

Usage::

    python benchmarks/bench_integration_claude.py --ops 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

import anyio
from claude_agent_sdk import (
    ClaudeAgentOptions,
    ClaudeSDKClient,
    SessionKey,
    SessionStoreEntry,
    Transport,
)
from fsspec.implementations.memory import MemoryFileSystem
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentvfs import FsspecFilesystem, Workspace
from agentvfs.integrations.claude import FsspecSessionStore, claude_mcp_server
from agentvfs.tools import WorkspaceTool

WRITE, READ = "mastra_workspace_write_file", "mastra_workspace_read_file"


def memory() -> MemoryFileSystem:
    return MemoryFileSystem(global_store=False, skip_instance_cache=True)


async def tools_direct(tools: Mapping[str, WorkspaceTool], round_no: int, n: int) -> None:
    for i in range(n):
        await tools[WRITE].execute({"path": f"d{round_no}/f{i}.txt", "content": f"line {i}\n"})
    for i in range(n):
        await tools[READ].execute({"path": f"d{round_no}/f{i}.txt"})


class FakeCli(Transport):
    """The Claude CLI's end of the SDK's control channel (the SDK's public ``Transport``):
    answers the SDK's own requests and sends ``mcp_message`` requests as the CLI does."""

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
            if message.get("type") == "control_request":
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

    async def mcp(self, server: str, message: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        request_id = f"cli_{self.next_id}"
        self.waiting[request_id] = done = anyio.Event()
        request = {"subtype": "mcp_message", "server_name": server, "message": message}
        await self.to_sdk.send(
            {"type": "control_request", "request_id": request_id, "request": request}
        )
        await done.wait()
        response: dict[str, Any] = self.answers.pop(request_id)["response"]["mcp_response"]
        return response


STEPS: tuple[tuple[str, Callable[[str, int], dict[str, Any]]], ...] = (
    (WRITE, lambda d, i: {"path": f"{d}/f{i}.txt", "content": f"line {i}\n"}),
    (READ, lambda d, i: {"path": f"{d}/f{i}.txt"}),
)


async def tools_sdk(cli: FakeCli, round_no: int, n: int) -> None:
    ids = iter(range(10, 10**9))
    for name, make in STEPS:
        for i in range(n):
            answer = await cli.mcp(
                "agentvfs",
                {
                    "jsonrpc": "2.0",
                    "id": next(ids),
                    "method": "tools/call",
                    "params": {"name": name, "arguments": make(f"b{round_no}", i)},
                },
            )
            assert not answer["result"].get("isError"), answer


async def tools_stdio(session: ClientSession, round_no: int, n: int) -> None:
    for name, make in STEPS:
        for i in range(n):
            result = await session.call_tool(name, make(f"s{round_no}", i))
            assert not result.isError, result


def entries(i: int) -> list[SessionStoreEntry]:
    # A user turn as the CLI writes it; ``message`` is outside the SDK's minimal TypedDict.
    entry = {"type": "user", "uuid": f"u{i}", "message": {"role": "user", "content": f"turn {i}"}}
    return [cast(SessionStoreEntry, entry)]


async def store_adapter(fs: MemoryFileSystem, round_no: int, key_kind: str, n: int) -> None:
    store = FsspecSessionStore(fs, f"/s{round_no}")
    key: SessionKey = {"project_key": "p", "session_id": "s"}
    if key_kind == "subagent":
        key["subpath"] = "subagents/agent-1"
    for i in range(n):
        await store.append(key, entries(i))
    loaded = await store.load(key)
    assert loaded is not None
    assert len(loaded) == n


async def store_direct(fs: MemoryFileSystem, round_no: int, n: int) -> None:
    base = f"/d{round_no}/p/s"
    for i in range(n):
        body = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries(i)).encode()
        fs.pipe_file(f"{base}/{time.time_ns():020d}-{i:08d}.jsonl", body)
    paths = sorted(fs.find(base))
    data = fs.cat(paths)
    loaded = [json.loads(line) for p in paths for line in data[p].decode().splitlines()]
    assert len(loaded) == n


async def timed(coro: Coroutine[Any, Any, None]) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def run(n: int, rounds: int) -> None:
    fs = memory()
    # The stdio server: the console script next to this interpreter, on its own memory store.
    server = StdioServerParameters(
        command=str(Path(sys.executable).with_name("agentvfs")),
        args=["mcp", "--url", f"memory://bench-{uuid.uuid4().hex[:8]}"],
    )
    async with (
        Workspace(filesystem=FsspecFilesystem(fs, root="/ws")) as ws,
        stdio_client(server) as (read, write),
        ClientSession(read, write) as stdio,
    ):
        await stdio.initialize()
        tools = await ws.create_tools()
        config = await claude_mcp_server(tools)
        cli = FakeCli()
        client = ClaudeSDKClient(
            ClaudeAgentOptions(mcp_servers={"agentvfs": config}), transport=cli
        )
        await client.connect()
        await cli.mcp(
            "agentvfs",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
            },
        )
        await cli.mcp("agentvfs", {"jsonrpc": "2.0", "method": "notifications/initialized"})
        names = (
            "tools direct",
            "tools via SDK MCP",
            "tools via stdio",
            "store direct",
            "store main",
            "store subagent",
        )
        times: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rounds):
            times["tools direct"].append(await timed(tools_direct(tools, r, n)))
            times["tools via SDK MCP"].append(await timed(tools_sdk(cli, r, n)))
            times["tools via stdio"].append(await timed(tools_stdio(stdio, r, n)))
            times["store direct"].append(await timed(store_direct(memory(), r, n)))
            times["store main"].append(await timed(store_adapter(memory(), r, "main", n)))
            times["store subagent"].append(await timed(store_adapter(memory(), r, "subagent", n)))
        await client.disconnect()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"{n} operations each, median of {rounds} interleaved rounds")
    d = med["tools direct"]
    print(f"{'tool calls':<24}{'direct ms':>11}{'SDK in-process':>16}{'stdio server':>14}")
    sdk, stdio_ms = med["tools via SDK MCP"], med["tools via stdio"]
    print(
        f"{'write+read_file':<24}{d:>11.1f}{sdk:>9.1f} {sdk / d:>5.2f}x"
        f"{stdio_ms:>7.1f} {stdio_ms / d:>5.2f}x"
    )
    print(f"{'session store':<24}{'direct ms':>11}{'adapter ms':>12}{'ratio':>8}")
    for label, key in (("main transcript", "store main"), ("subagent", "store subagent")):
        base = med["store direct"]
        print(f"{label:<24}{base:>11.1f}{med[key]:>12.1f}{med[key] / base:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="calls of each kind a round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each")
    args = parser.parse_args()
    anyio.run(run, args.ops, args.rounds)


if __name__ == "__main__":
    main()
