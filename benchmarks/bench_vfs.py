#!/usr/bin/env python
"""Overhead of ``FsspecFilesystem`` over the raw fsspec instance it wraps.

For each backend (memory, local, s3 through a moto server started here) four operations are
timed over ``--files`` small files (100 bytes each), through the wrapper and through the same
call on the raw fsspec instance:

========  ==================================  ==================================
op        raw                                  wrapper
========  ==================================  ==================================
stat      ``raw.info(full)``                   ``await fs.stat(rel)``
read      ``raw.cat_file(full)``               ``await fs.read_file(rel)``
write     ``raw.pipe_file(full, data)``        ``await fs.write_file(rel, data)``
list      ``raw.ls(dir, detail=True)``         ``await fs.readdir(dir)``
========  ==================================  ==================================

Method: everything runs inside one ``anyio.run`` event loop (asyncio backend). Raw calls are
plain synchronous calls made from that loop; wrapper calls are awaited in it (the wrapper
itself decides whether to hop to a worker thread). One untimed warm-up repetition, then
``--repeat`` timed repetitions; inside each repetition every operation runs as a raw pass
followed by a wrapper pass (raw, wrapper, raw, wrapper, ...), each pass covering all files.
Writes go to a fresh directory per repetition and per side, so both sides create new files;
written directories are removed (untimed) after each repetition so the store size stays
constant. Reported: median µs/op per side, min–max over repetitions, and the median of the
per-repetition ratios wrapper/raw.

Usage::

    python benchmarks/bench_vfs.py --markdown
    python benchmarks/bench_vfs.py --backends memory,local --files 1000 --repeat 5 --json out.json
"""

from __future__ import annotations

import os

# Must be set before gcsfs can be imported (indirectly) anywhere.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import argparse
import contextlib
import gc
import importlib.metadata
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs.bench._system import machine_description as shared_machine_description
from agentvfs.vfs import FsspecFilesystem

BACKENDS = ("memory", "local", "s3")
OPS = ("stat", "read", "write", "list")
# Targets from the issue: wrapper/raw ratio ceilings (None: report only).
TARGETS: dict[str, float | None] = {"memory": 2.0, "local": None, "s3": 1.2}
DEFAULT_LIST_REPEAT = {"memory": 20, "local": 20, "s3": 3}
FILE_SIZE = 100
DATA_DIR = "data"
S3_BUCKET = "agentvfs-bench"


# -- machine ---------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_description() -> dict[str, Any]:
    return shared_machine_description({"moto": _version("moto"), "anyio": _version("anyio")})


def _loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def format_machine(m: dict[str, Any]) -> str:
    return (
        f"{m['cores']} cores ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}, "
        f"{m['python']}; fsspec {m['fsspec']}, s3fs {m['s3fs']}, moto {m['moto']}, "
        f"anyio {m['anyio']}, agentvfs {m['agentvfs']}"
    )


# -- backends --------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    raw: fsspec.AbstractFileSystem
    fs: FsspecFilesystem
    root: str  # backend path of the wrapper's root, as the raw instance spells it
    list_repeat: int
    needs_dirs: bool  # real directories: pre-create write directories for both sides

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}"


def make_memory() -> Backend:
    raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
    root = "/bench"
    raw.makedirs(root, exist_ok=True)
    # Same instance (and store) on both sides: the memory store is the backend.
    fs = FsspecFilesystem(raw, root=root)
    return Backend("memory", raw, fs, root, DEFAULT_LIST_REPEAT["memory"], True)


def make_local(stack: contextlib.ExitStack) -> Backend:
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="agentvfs-bench-"))
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    raw = LocalFileSystem(skip_instance_cache=True)
    fs = FsspecFilesystem(LocalFileSystem(skip_instance_cache=True), root=tmp)
    return Backend("local", raw, fs, tmp, DEFAULT_LIST_REPEAT["local"], True)


def make_s3(stack: contextlib.ExitStack) -> Backend:
    from agentvfs.testing._servers import MotoServer

    moto = stack.enter_context(MotoServer())
    moto.create_bucket(S3_BUCKET)
    raw = moto.s3fs(use_listings_cache=False)
    # A separate instance (own session and connection pool) for the wrapper.
    fs = FsspecFilesystem(moto.s3fs(use_listings_cache=False), root=f"{S3_BUCKET}/ws")
    return Backend("s3", raw, fs, f"{S3_BUCKET}/ws", DEFAULT_LIST_REPEAT["s3"], False)


# -- measurement -----------------------------------------------------------------------------


@dataclass
class Samples:
    raw: list[float] = field(default_factory=list)  # µs/op, one per repetition
    wrapper: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # wrapper/raw within each repetition


def _timed_sync(fn: Callable[[], None]) -> float:
    gc.collect()
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3  # µs


async def _timed_async(fn: Callable[[], Awaitable[None]]) -> float:
    gc.collect()
    t0 = time.perf_counter_ns()
    await fn()
    return (time.perf_counter_ns() - t0) / 1e3


class Runner:
    def __init__(self, b: Backend, n_files: int) -> None:
        self.b = b
        self.n = n_files
        self.names = [f"f{i:05d}.txt" for i in range(n_files)]
        self.rels = [f"{DATA_DIR}/{name}" for name in self.names]
        self.fulls = [b.full(rel) for rel in self.rels]
        self.payload = [(f"{i:05d}".encode() * 20)[:FILE_SIZE] for i in range(n_files)]

    def populate(self) -> None:
        b = self.b
        if b.needs_dirs:
            b.raw.makedirs(b.full(DATA_DIR), exist_ok=True)
        if b.name == "s3":
            b.raw.pipe(dict(zip(self.fulls, self.payload, strict=True)))  # concurrent PUTs
        else:
            for full, data in zip(self.fulls, self.payload, strict=True):
                b.raw.pipe_file(full, data)

    async def check(self) -> None:
        """Both sides see the same data (sanity, untimed)."""
        b = self.b
        got = await b.fs.read_file(self.rels[7])
        assert got == self.payload[7] == b.raw.cat_file(self.fulls[7]), "read mismatch"
        st = await b.fs.stat(self.rels[7])
        assert st.size == FILE_SIZE == b.raw.info(self.fulls[7])["size"], "stat mismatch"
        entries = await b.fs.readdir(DATA_DIR)
        raw_entries = b.raw.ls(b.full(DATA_DIR), detail=True)
        assert len(entries) == len(raw_entries) == self.n, (len(entries), len(raw_entries))

    def raw_stat(self) -> None:
        info = self.b.raw.info
        for full in self.fulls:
            info(full)

    async def vfs_stat(self) -> None:
        stat = self.b.fs.stat
        for rel in self.rels:
            await stat(rel)

    def raw_read(self) -> None:
        cat = self.b.raw.cat_file
        for full in self.fulls:
            cat(full)

    async def vfs_read(self) -> None:
        read = self.b.fs.read_file
        for rel in self.rels:
            await read(rel)

    def raw_list(self) -> None:
        ls, d = self.b.raw.ls, self.b.full(DATA_DIR)
        for _ in range(self.b.list_repeat):
            ls(d, detail=True)

    async def vfs_list(self) -> None:
        readdir = self.b.fs.readdir
        for _ in range(self.b.list_repeat):
            await readdir(DATA_DIR)

    def _write_dirs(self, tag: str) -> tuple[str, str]:
        raw_dir, vfs_dir = f"w-raw/{tag}", f"w-vfs/{tag}"
        if self.b.needs_dirs:
            self.b.raw.makedirs(self.b.full(raw_dir), exist_ok=True)
            self.b.raw.makedirs(self.b.full(vfs_dir), exist_ok=True)
        return raw_dir, vfs_dir

    def _cleanup_writes(self, *dirs: str) -> None:
        for d in dirs:
            with contextlib.suppress(FileNotFoundError):
                self.b.raw.rm(self.b.full(d), recursive=True)
        if self.b.name == "s3":
            self.b.raw.invalidate_cache()

    async def repetition(self, tag: str) -> dict[str, tuple[float, float]]:
        """One repetition: every op as a raw pass then a wrapper pass; µs/op per side."""
        n, lr = self.n, self.b.list_repeat
        out: dict[str, tuple[float, float]] = {}

        r = _timed_sync(self.raw_stat)
        w = await _timed_async(self.vfs_stat)
        out["stat"] = (r / n, w / n)

        r = _timed_sync(self.raw_read)
        w = await _timed_async(self.vfs_read)
        out["read"] = (r / n, w / n)

        raw_dir, vfs_dir = self._write_dirs(tag)
        raw_fulls = [self.b.full(f"{raw_dir}/{name}") for name in self.names]
        vfs_rels = [f"{vfs_dir}/{name}" for name in self.names]
        pipe, write, payload = self.b.raw.pipe_file, self.b.fs.write_file, self.payload

        def raw_write() -> None:
            for full, data in zip(raw_fulls, payload, strict=True):
                pipe(full, data)

        async def vfs_write() -> None:
            for rel, data in zip(vfs_rels, payload, strict=True):
                await write(rel, data)

        r = _timed_sync(raw_write)
        w = await _timed_async(vfs_write)
        out["write"] = (r / n, w / n)
        # Both sides really wrote every file (untimed).
        assert len(self.b.raw.ls(self.b.full(raw_dir), detail=False)) == n
        assert len(self.b.raw.ls(self.b.full(vfs_dir), detail=False)) == n
        self._cleanup_writes(raw_dir, vfs_dir)

        r = _timed_sync(self.raw_list)
        w = await _timed_async(self.vfs_list)
        out["list"] = (r / lr, w / lr)
        return out


async def bench_backend(b: Backend, n_files: int, repeat: int, log: Callable[[str], None]) -> dict[str, Samples]:
    runner = Runner(b, n_files)
    runner.populate()
    await b.fs.init()
    await runner.check()
    t0 = time.monotonic()
    await runner.repetition("warmup")
    log(f"  {b.name}: warm-up done in {time.monotonic() - t0:.1f} s")
    samples = {op: Samples() for op in OPS}
    for i in range(repeat):
        t0 = time.monotonic()
        rep = await runner.repetition(f"r{i}")
        for op, (r, w) in rep.items():
            samples[op].raw.append(r)
            samples[op].wrapper.append(w)
            samples[op].ratio.append(w / r)
        summary = ", ".join(f"{op} {w / r:.2f}x" for op, (r, w) in rep.items())
        log(f"  {b.name}: repetition {i + 1}/{repeat} in {time.monotonic() - t0:.1f} s ({summary})")
    return samples


# -- reporting -------------------------------------------------------------------------------


def summarize(backend: str, op: str, s: Samples, files: int) -> dict[str, Any]:
    target = TARGETS[backend]
    ratio = statistics.median(s.ratio)
    verdict = "report" if target is None else ("PASS" if ratio <= target else "FAIL")
    return {
        "backend": backend,
        "op": op,
        "raw_us_median": statistics.median(s.raw),
        "raw_us_min": min(s.raw),
        "raw_us_max": max(s.raw),
        "wrapper_us_median": statistics.median(s.wrapper),
        "wrapper_us_min": min(s.wrapper),
        "wrapper_us_max": max(s.wrapper),
        "ratio_median": ratio,
        "ratio_min": min(s.ratio),
        "ratio_max": max(s.ratio),
        "files": files,
        "target": target,
        "verdict": verdict,
        "raw_us": s.raw,
        "wrapper_us": s.wrapper,
        "ratios": s.ratio,
    }


def _us(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


OP_LABEL = {
    "stat": "stat",
    "read": f"small read ({FILE_SIZE} B)",
    "write": f"small write ({FILE_SIZE} B, new file)",
    "list": "listing ({n:,}-entry dir)",
}


def _label(r: dict[str, Any]) -> str:
    return OP_LABEL[r["op"]].format(n=r["files"])


def text_table(rows: list[dict[str, Any]]) -> str:
    head = ("backend", "operation", "raw µs/op [min–max]", "wrapper µs/op [min–max]",
            "ratio [min–max]", "target", "verdict")
    lines = [head]
    for r in rows:
        lines.append((
            r["backend"],
            _label(r),
            f"{_us(r['raw_us_median'])} [{_us(r['raw_us_min'])}–{_us(r['raw_us_max'])}]",
            f"{_us(r['wrapper_us_median'])} [{_us(r['wrapper_us_min'])}–{_us(r['wrapper_us_max'])}]",
            f"{r['ratio_median']:.2f}x [{r['ratio_min']:.2f}–{r['ratio_max']:.2f}]",
            "—" if r["target"] is None else f"≤ {r['target']:g}x",
            r["verdict"],
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| backend | operation | raw µs/op median (min–max) | wrapper µs/op median (min–max) "
        "| ratio wrapper/raw median (min–max) | target | verdict |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        target = "—" if r["target"] is None else f"≤ {r['target']:g}x"
        out.append(
            f"| {r['backend']} | {_label(r)} "
            f"| {_us(r['raw_us_median'])} ({_us(r['raw_us_min'])}–{_us(r['raw_us_max'])}) "
            f"| {_us(r['wrapper_us_median'])} ({_us(r['wrapper_us_min'])}–{_us(r['wrapper_us_max'])}) "
            f"| {r['ratio_median']:.2f}x ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) "
            f"| {target} "
            f"| {r['verdict']} |"
        )
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated subset of: memory,local,s3 (default: all)")
    p.add_argument("--files", type=int, default=1000, help="number of 100-byte files (default 1000)")
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions after one warm-up (default 5)")
    p.add_argument("--list-repeat", type=int, default=None,
                   help="listings per repetition (default: 20 on memory/local, 3 on s3)")
    p.add_argument("--json", metavar="PATH", help="write all samples and summaries as JSON")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        p.error(f"unknown backend(s): {', '.join(sorted(unknown))}; choose from {', '.join(BACKENDS)}")
    if args.files < 1 or args.repeat < 1:
        p.error("--files and --repeat must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = machine_description()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {format_machine(machine)}")
    print(f"files: {args.files} x {FILE_SIZE} B, repetitions: {args.repeat} (+1 warm-up)")
    load_start = _loadavg()
    print(f"load average at start (1/5/15 min): {load_start}")

    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        backends: list[Backend] = []
        for name in args.backends:
            if name == "memory":
                b = make_memory()
            elif name == "local":
                b = make_local(stack)
            else:
                b = make_s3(stack)
            if args.list_repeat is not None:
                b.list_repeat = args.list_repeat
            backends.append(b)

        async def run_all() -> None:
            for b in backends:
                log(f"benchmarking {b.name} ({args.files} files, list x{b.list_repeat}) ...")
                samples = await bench_backend(b, args.files, args.repeat, log)
                rows.extend(summarize(b.name, op, samples[op], args.files) for op in OPS)

        anyio.run(run_all, backend="asyncio")

    load_end = _loadavg()
    print(f"load average at end (1/5/15 min): {load_end}"
          " (this benchmark alone adds ~1, ~2 while the moto server is busy)")
    print()
    print(text_table(rows))
    print()
    verdicts = [r for r in rows if r["target"] is not None]
    for backend in args.backends:
        target = TARGETS[backend]
        mine = [r for r in rows if r["backend"] == backend]
        if target is None:
            ratios = ", ".join(f"{r['op']} {r['ratio_median']:.2f}x" for r in mine)
            print(f"{backend}: no target (reported only); ratios {ratios}")
            continue
        failed = [r["op"] for r in mine if r["verdict"] == "FAIL"]
        state = "PASS" if not failed else f"FAIL ({', '.join(failed)})"
        print(f"{backend}: target wrapper/raw <= {target:g}x on every operation: {state}")
    if verdicts:
        overall = "PASS" if all(r["verdict"] == "PASS" for r in verdicts) else "FAIL"
        print(f"overall: {overall}")
    if args.markdown:
        print()
        print(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine,
                       "load_start": load_start, "load_end": load_end,
                       "file_size": FILE_SIZE, "results": rows}, f, indent=2)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
