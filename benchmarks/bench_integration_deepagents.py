#!/usr/bin/env python
"""Overhead of the Deep Agents adapter (AgentVFSBackend) on memory storage, against agentvfs.

Each round writes ``--files`` small files over ten directories, reads them all back, globs
``*.txt`` and greps for one line, once through ``AgentVFSBackend``'s async methods (``awrite``,
``aread``, ``aglob``, ``agrep``) and once directly through the agentvfs filesystem (the
functions the adapter is built on: ``write_file``, ``read_file``, ``walk``, ``read_many``),
each on a fresh ``MemoryFileSystem``. Direct and adapter alternate within each round; the
median of ``--rounds`` rounds is reported per operation, with the ratio adapter/direct.

Usage::

    python benchmarks/bench_integration_deepagents.py --files 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import cast

from fsspec.implementations.memory import MemoryFileSystem

from agentvfs import FsspecFilesystem
from agentvfs.integrations.deepagents import AgentVFSBackend
from agentvfs.vfs import read_many, walk


def fresh() -> FsspecFilesystem:
    return FsspecFilesystem(
        MemoryFileSystem(global_store=False, skip_instance_cache=True), root="/bench"
    )


async def direct(fs: FsspecFilesystem, files: int) -> dict[str, float]:
    t: dict[str, float] = {}
    start = time.perf_counter()
    for i in range(files):
        await fs.write_file(f"d{i % 10}/f{i}.txt", f"line one\nneedle {i}\n")
    t["write"] = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(files):
        text = cast(bytes, await fs.read_file(f"d{i % 10}/f{i}.txt")).decode()
        text.splitlines(keepends=True)
    t["read"] = time.perf_counter() - start
    start = time.perf_counter()
    entries = [e for e in await walk(fs, "") if e.type == "file" and e.name.endswith(".txt")]
    t["glob"] = time.perf_counter() - start
    start = time.perf_counter()
    listed = [e for e in await walk(fs, "") if e.type == "file"]
    data = await read_many(fs, sorted(e.name for e in listed))
    hits = [
        (p, n)
        for p, b in data.items()
        if isinstance(b, bytes)
        for n, line in enumerate(b.decode().split("\n"), 1)
        if "needle 99" in line
    ]
    t["grep"] = time.perf_counter() - start
    assert len(entries) == files
    assert hits
    return t


async def adapter(backend: AgentVFSBackend, files: int) -> dict[str, float]:
    t: dict[str, float] = {}
    start = time.perf_counter()
    for i in range(files):
        await backend.awrite(f"/d{i % 10}/f{i}.txt", f"line one\nneedle {i}\n")
    t["write"] = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(files):
        await backend.aread(f"/d{i % 10}/f{i}.txt")
    t["read"] = time.perf_counter() - start
    start = time.perf_counter()
    found = await backend.aglob("*.txt")
    t["glob"] = time.perf_counter() - start
    start = time.perf_counter()
    hits = await backend.agrep("needle 99")
    t["grep"] = time.perf_counter() - start
    assert found.matches is not None
    assert len(found.matches) == files
    assert hits.matches
    return t


async def run(files: int, rounds: int) -> None:
    results: dict[str, dict[str, list[float]]] = {"direct": {}, "adapter": {}}
    for _ in range(rounds):
        for name in ("direct", "adapter"):
            fs = fresh()
            t = await (
                direct(fs, files) if name == "direct" else adapter(AgentVFSBackend(fs), files)
            )
            for op, value in t.items():
                results[name].setdefault(op, []).append(value)
    print(f"{files} files, median of {rounds} interleaved rounds")
    print(f"{'operation':<12}{'direct ms':>11}{'adapter ms':>12}{'ratio':>8}")
    for op in results["direct"]:
        d = statistics.median(results["direct"][op]) * 1000
        a = statistics.median(results["adapter"][op]) * 1000
        print(f"{op:<12}{d:>11.1f}{a:>12.1f}{a / d:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files written and read a round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each")
    args = parser.parse_args()
    asyncio.run(run(args.files, args.rounds))


if __name__ == "__main__":
    main()
