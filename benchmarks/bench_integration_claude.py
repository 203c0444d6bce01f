#!/usr/bin/env python
"""Overhead of the Claude adapter (MCP server, session store) on memory storage, against agentvfs.

Two workloads, each on a ``MemoryFileSystem``. Tools: ``--ops`` write_file calls then
``--ops`` read_file calls through the in-process SDK MCP server (the SDK's own bridge, the
path Claude Code's calls take), against the same ``WorkspaceTool.execute`` calls. Transcripts:
``--ops`` appends then a load through ``FsspecSessionStore``, of a main transcript and of a
subagent's (no summary), against writing the same JSONL objects with fsspec directly
(``pipe_file``) and reading them back (``find`` + ``cat``). All five run once a round, in
``--rounds`` interleaved rounds, and the median of each is reported with the ratio
adapter/direct.

Usage::

    python benchmarks/bench_integration_claude.py --ops 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, cast

import anyio
from claude_agent_sdk import SessionKey, SessionStoreEntry
from claude_agent_sdk._internal.sdk_mcp_bridge import SdkMcpBridge
from fsspec.implementations.memory import MemoryFileSystem

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


async def tools_bridge(bridge: Any, round_no: int, n: int) -> None:
    ids = iter(range(10**9))
    steps: tuple[tuple[str, Callable[[int], dict[str, Any]]], ...] = (
        (WRITE, lambda i: {"path": f"b{round_no}/f{i}.txt", "content": f"line {i}\n"}),
        (READ, lambda i: {"path": f"b{round_no}/f{i}.txt"}),
    )
    for name, make in steps:
        for i in range(n):
            answer = await bridge.handle(
                {
                    "jsonrpc": "2.0",
                    "id": next(ids) + 10,
                    "method": "tools/call",
                    "params": {"name": name, "arguments": make(i)},
                }
            )
            assert not answer["result"].get("isError"), answer


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
    async with Workspace(filesystem=FsspecFilesystem(fs, root="/ws")) as ws:
        tools = await ws.create_tools()
        config = await claude_mcp_server(tools)
        bridge = SdkMcpBridge("agentvfs", config["instance"])
        await bridge.handle(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
            }
        )
        await bridge.handle({"jsonrpc": "2.0", "method": "notifications/initialized"})
        names = (
            "tools direct",
            "tools via SDK MCP",
            "store direct",
            "store main",
            "store subagent",
        )
        times: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rounds):
            times["tools direct"].append(await timed(tools_direct(tools, r, n)))
            times["tools via SDK MCP"].append(await timed(tools_bridge(bridge, r, n)))
            times["store direct"].append(await timed(store_direct(memory(), r, n)))
            times["store main"].append(await timed(store_adapter(memory(), r, "main", n)))
            times["store subagent"].append(await timed(store_adapter(memory(), r, "subagent", n)))
        await bridge.aclose()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    rows = (
        ("tools: MCP bridge", "tools direct", "tools via SDK MCP"),
        ("store: main transcript", "store direct", "store main"),
        ("store: subagent", "store direct", "store subagent"),
    )
    print(f"{n} operations each, median of {rounds} interleaved rounds")
    print(f"{'operation':<24}{'direct ms':>11}{'adapter ms':>12}{'ratio':>8}")
    for label, d, a in rows:
        print(f"{label:<24}{med[d]:>11.1f}{med[a]:>12.1f}{med[a] / med[d]:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="calls of each kind a round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each")
    args = parser.parse_args()
    anyio.run(run, args.ops, args.rounds)


if __name__ == "__main__":
    main()
