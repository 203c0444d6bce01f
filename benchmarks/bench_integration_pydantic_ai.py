#!/usr/bin/env python
"""Overhead of the Pydantic AI adapter (AgentVFSWorkspace) on memory storage, against agentvfs.

The workload writes ``--files`` small files (256 bytes each), reads them back and lists their
directory, once through the Pydantic AI backend (absolute paths, ``FileEntry`` results) and
once directly through the agentvfs filesystem under it, on one ``memory://`` filesystem. The
two alternate in interleaved rounds (which runs first swaps round by round; round 0 warms up
and is not counted), and the median of ``--rounds`` rounds of each is reported with the ratio
adapter/direct.

Usage::

    python benchmarks/bench_integration_pydantic_ai.py --files 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import anyio

from agentvfs import FsspecFilesystem, Workspace
from agentvfs.integrations.pydantic_ai import AgentVFSWorkspace

DATA = b"x" * 256


async def direct(fs: FsspecFilesystem, prefix: str, files: int) -> None:
    for i in range(files):
        await fs.write_file(f"{prefix}/f{i}.txt", DATA)
    for i in range(files):
        await fs.read_file(f"{prefix}/f{i}.txt")
    await fs.readdir(prefix)


async def adapted(backend: AgentVFSWorkspace, root: str, prefix: str, files: int) -> None:
    for i in range(files):
        await backend.write_bytes(f"{root}/{prefix}/f{i}.txt", DATA)
    for i in range(files):
        await backend.read_bytes(f"{root}/{prefix}/f{i}.txt")
    await backend.list_dir(f"{root}/{prefix}")


async def run(files: int, rounds: int) -> None:
    fs = FsspecFilesystem(f"memory:///bench-{uuid.uuid4().hex[:8]}")
    ws = Workspace(filesystem=fs)
    backend = AgentVFSWorkspace(ws)
    root = await backend.working_dir()
    times: dict[str, list[float]] = {"direct": [], "adapter": []}
    for n in range(rounds + 1):  # round 0 warms up
        for name in ("direct", "adapter") if n % 2 else ("adapter", "direct"):
            start = time.perf_counter()
            if name == "direct":
                await direct(fs, f"d{n}", files)
            else:
                await adapted(backend, root, f"a{n}", files)
            if n:
                times[name].append(time.perf_counter() - start)
    await backend.aclose()
    d = statistics.median(times["direct"]) * 1000
    a = statistics.median(times["adapter"]) * 1000
    print(f"{files} writes + {files} reads + 1 listing, median of {rounds} interleaved rounds")
    print(f"{'operation':<28}{'direct ms':>11}{'adapter ms':>12}{'ratio':>8}")
    print(f"{'write, read, list':<28}{d:>11.1f}{a:>12.1f}{a / d:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files written and read a round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each")
    args = parser.parse_args()
    anyio.run(run, args.files, args.rounds)


if __name__ == "__main__":
    main()
