#!/usr/bin/env python
"""Overhead of the OpenAI Agents adapter (function_tools) on memory storage, against agentvfs.

Each round writes ``--files`` small files and reads them back through the SDK's
``FunctionTool.on_invoke_tool`` (JSON arguments in, output string back), and makes the same
calls directly with ``WorkspaceTool.execute``, on one ``MemoryFileSystem``. The SDK builds the
``ToolContext`` of a call whatever the tool is, so the contexts are made up front: the timing
is of the adapter (JSON decoding, dispatch, output), not of the SDK. After one warm-up round
of each, the two alternate in interleaved rounds (which runs first swaps round by round), and
the median of ``--rounds`` rounds of each is reported with the ratio adapter/direct.

A second table times the sandbox session's file API (``session.write`` / ``session.read``,
which check each path, following symlinks through the mount, then go to the storage)
against the same calls on the storage directly, interleaved the same way, on a local
directory (``--session-files`` of each per round; 0 skips it).

Usage::

    python benchmarks/bench_integration_openai_agents.py --files 1000 --rounds 7 --session-files 200
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.tool_context import ToolContext
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace
from agentvfs.integrations.openai_agents import AgentVFSSandboxClient, function_tools

Calls = list[tuple[ToolContext[None], str]]


async def run(files: int, rounds: int) -> None:
    fs = FsspecFilesystem(MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/b")
    ws = Workspace(filesystem=fs)
    direct = await ws.create_tools()
    adapted = {t.name: t for t in await function_tools(direct)}
    write, read = "mastra_workspace_write_file", "mastra_workspace_read_file"

    async def via_direct(r: int) -> None:
        for i in range(files):
            await direct[write].execute(
                {"path": f"d{r}/{i}.txt", "content": f"file {i}\n", "overwrite": None}
            )
        for i in range(files):
            await direct[read].execute({"path": f"d{r}/{i}.txt"})

    def calls(r: int) -> tuple[Calls, Calls]:
        writes: Calls = []
        reads: Calls = []
        for i in range(files):
            args = json.dumps(
                {"path": f"a{r}/{i}.txt", "content": f"file {i}\n", "overwrite": None}
            )
            ctx = ToolContext(
                context=None, tool_name=write, tool_call_id=str(i), tool_arguments=args
            )
            writes.append((ctx, args))
            args = json.dumps({"path": f"a{r}/{i}.txt"})
            ctx = ToolContext(
                context=None, tool_name=read, tool_call_id=str(i), tool_arguments=args
            )
            reads.append((ctx, args))
        return writes, reads

    prepared = {r: calls(r) for r in range(-1, rounds)}

    async def via_adapter(r: int) -> None:
        writes, reads = prepared[r]
        for ctx, args in writes:
            await adapted[write].on_invoke_tool(ctx, args)
        for ctx, args in reads:
            await adapted[read].on_invoke_tool(ctx, args)

    runners: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
        ("direct", via_direct),
        ("adapter", via_adapter),
    ]
    times: dict[str, list[float]] = {"direct": [], "adapter": []}
    await via_direct(-1)
    await via_adapter(-1)  # warm-up
    for r in range(rounds):
        for name, fn in runners if r % 2 else runners[::-1]:
            start = time.perf_counter()
            await fn(r)
            times[name].append(time.perf_counter() - start)
    d = statistics.median(times["direct"]) * 1000
    a = statistics.median(times["adapter"]) * 1000
    print(f"{files} writes + {files} reads, median of {rounds} interleaved rounds")
    print(f"{'operation':<16}{'direct ms':>11}{'adapter ms':>12}{'ratio':>8}")
    print(f"{'write, read':<16}{d:>11.1f}{a:>12.1f}{a / d:>7.2f}x")


async def interleaved(
    runners: list[tuple[str, Callable[[int], Awaitable[None]]]], rounds: int
) -> dict[str, float]:
    """Median milliseconds of each runner over interleaved rounds, after one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name, _ in runners}
    for _, fn in runners:
        await fn(-1)
    for r in range(rounds):
        for name, fn in runners if r % 2 else runners[::-1]:
            start = time.perf_counter()
            await fn(r)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


async def run_session(files: int, rounds: int, client_class: Any = AgentVFSSandboxClient) -> None:
    """The session file API against the storage it writes to (``client_class`` lets another
    version of the client be compared on the same machine)."""
    with tempfile.TemporaryDirectory() as directory:
        fs = LocalFilesystem(directory)
        client = client_class(fs, isolation="none")
        session = await client.create()
        async with session:

            async def via_storage(r: int) -> None:
                for i in range(files):
                    await fs.write_file(f"s{r}/{i}.txt", f"file {i}\n".encode(), recursive=True)
                for i in range(files):
                    await fs.read_file(f"s{r}/{i}.txt")

            async def via_session(r: int) -> None:
                for i in range(files):
                    await session.write(Path(f"x{r}/{i}.txt"), io.BytesIO(f"file {i}\n".encode()))
                for i in range(files):
                    (await session.read(Path(f"x{r}/{i}.txt"))).read()

            medians = await interleaved([("storage", via_storage), ("session", via_session)], rounds)
        await client.delete(session)
    d, a = medians["storage"], medians["session"]
    print(f"{files} session writes + {files} reads, median of {rounds} interleaved rounds")
    print(f"{'operation':<16}{'storage ms':>11}{'session ms':>12}{'ratio':>8}")
    print(f"{'write, read':<16}{d:>11.1f}{a:>12.1f}{a / d:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files written and read a round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each")
    parser.add_argument(
        "--session-files", type=int, default=200, help="session files written and read a round"
    )
    args = parser.parse_args()
    asyncio.run(run(args.files, args.rounds))
    if args.session_files:
        asyncio.run(run_session(args.session_files, args.rounds))


if __name__ == "__main__":
    main()
