"""Agent tools over a 2,000-file tree (local disk and moto S3) and a 200 MB read_file.

Measures the wall time of ``grep`` and ``list_files`` through ``Workspace.create_tools()``,
counts the S3 requests each call sends, and the peak memory of reading 50 lines from the
middle of a 200 MB file (tracemalloc, after tiktoken's tables are loaded).

Usage: ``python benchmarks/bench_tools.py [--files 2000] [--repeat 5] [--big-mb 200]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import anyio

from agentvfs import WORKSPACE_TOOLS, FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceTool
from agentvfs.testing import MotoServer

FS = WORKSPACE_TOOLS.FILESYSTEM


def tree(files: int) -> dict[str, bytes]:
    """A repository-shaped tree: 20 packages x 10 modules x N files, some lines with TODO."""
    out: dict[str, bytes] = {}
    for i in range(files):
        package, module = i % 20, (i // 20) % 10
        body = "".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(20))
        if i % 7 == 0:
            body += "# TODO: tidy this module\n"
        out[f"pkg{package:02d}/mod{module}/file{i:05d}.py"] = body.encode()
    return out


async def timed(tools: dict[str, WorkspaceTool], name: str, args: dict[str, Any], repeat: int) -> tuple[list[float], str]:
    samples: list[float] = []
    result = ""
    await tools[name].execute(args)  # warm-up
    for _ in range(repeat):
        started = time.perf_counter()
        result = str(await tools[name].execute(args))
        samples.append(time.perf_counter() - started)
    return samples, result


def row(label: str, samples: list[float], extra: str = "") -> str:
    median = statistics.median(samples) * 1000
    return f"| {label} | {median:,.1f} | {min(samples) * 1000:,.1f}–{max(samples) * 1000:,.1f} | {extra} |"


async def bench_tree(files: int, repeat: int, rows: list[str]) -> None:
    data = tree(files)
    with tempfile.TemporaryDirectory() as tmp:
        for path, body in data.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
            with open(os.path.join(tmp, path), "wb") as handle:
                handle.write(body)
        tools = await Workspace(filesystem=LocalFilesystem(tmp)).create_tools()
        grep_samples, grep_out = await timed(tools, FS.GREP, {"pattern": "TODO"}, repeat)
        list_samples, _ = await timed(tools, FS.LIST_FILES, {"maxDepth": 5}, repeat)
        rows.append(row(f"local: grep TODO over {files} files", grep_samples, grep_out.split("\n", 1)[0]))
        rows.append(row(f"local: list_files maxDepth 5 ({files} files)", list_samples, "—"))

    with MotoServer() as moto:
        moto.create_bucket("bench-tools")
        moto.s3fs().pipe({f"bench-tools/repo/{p}": b for p, b in data.items()})
        raw = moto.s3fs(use_listings_cache=False)
        raw.connect()
        sent: Counter[str] = Counter()
        raw.s3.meta.events.register("before-call.s3", lambda model, **kw: sent.update([model.name]))
        tools = await Workspace(filesystem=FsspecFilesystem(raw, root="bench-tools/repo")).create_tools()
        grep_samples, grep_out = await timed(tools, FS.GREP, {"pattern": "TODO"}, repeat)
        per_grep = {k: v // (repeat + 1) for k, v in sent.items()}
        sent.clear()
        list_samples, _ = await timed(tools, FS.LIST_FILES, {"maxDepth": 5}, repeat)
        per_list = {k: v // (repeat + 1) for k, v in sent.items()}
        rows.append(row(f"s3 (moto): grep TODO over {files} files", grep_samples, f"{grep_out.split(chr(10), 1)[0]}; requests per call {dict(sorted(per_grep.items()))}"))
        rows.append(row(f"s3 (moto): list_files maxDepth 5 ({files} files)", list_samples, f"requests per call {dict(sorted(per_list.items()))}"))


async def bench_big_read(megabytes: int, rows: list[str]) -> None:
    line = b"2026-11-30T03:00:00Z INFO request handled in 12 ms path=/api/items status=200\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.log")
        count = megabytes * 1024 * 1024 // len(line)
        with open(path, "wb") as handle:
            block = line * 8192
            for _ in range(count // 8192):
                handle.write(block)
        tools = await Workspace(filesystem=LocalFilesystem(tmp)).create_tools()
        await tools[FS.READ_FILE].execute({"path": "big.log", "limit": 1})  # tiktoken tables, once
        middle = count // 2
        tracemalloc.start()
        started = time.perf_counter()
        out = str(await tools[FS.READ_FILE].execute({"path": "big.log", "offset": middle, "limit": 50}))
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        size = os.path.getsize(path)
        rows.append(
            f"| local: read_file {size / 2**20:.0f} MiB, offset {middle}, limit 50 | {elapsed * 1000:,.1f} | one run | "
            f"peak Python memory {peak / 2**20:.1f} MiB (target < 50 MiB); header: {out.splitlines()[0]} |"
        )


async def main(args: argparse.Namespace) -> None:
    rows = ["| operation | median ms | min–max ms | result / requests |", "|---|---:|---|---|"]
    await bench_tree(args.files, args.repeat, rows)
    await bench_big_read(args.big_mb, rows)
    print(f"machine: {os.cpu_count()} cores, Linux {platform.release()}, Python {sys.version.split()[0]}")
    print(f"command: python benchmarks/bench_tools.py --files {args.files} --repeat {args.repeat} --big-mb {args.big_mb}")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--big-mb", type=int, default=200)
    anyio.run(main, parser.parse_args())
