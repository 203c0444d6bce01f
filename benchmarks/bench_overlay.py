#!/usr/bin/env python
"""What an ``OverlayFilesystem`` costs against its base filesystem used directly.

For each backend (memory: ``FsspecFilesystem`` over fsspec's memory store; local:
``LocalFilesystem``) the base holds ``--files`` small files (100 bytes) and the overlay's upper
layer is a second store of the same kind. Timed, per file:

==============  =======================================  ==========================================
op              direct (the base)                        overlay
==============  =======================================  ==========================================
stat            ``stat`` of a base file                  the same path: upper miss, then base
read            ``read_file`` of a base file             the same path: upper miss, then base
read-upper      ``read_file`` of a file written before    the same, the file in the upper layer
list            ``readdir`` of the directory             both layers listed and merged
write-new       ``write_file`` of a new file             into the upper layer
copy-up         ``write_file`` over an existing file      over a base file: its version recorded
commit          ``write_file`` of each changed file       ``commit()`` of as many copied-up files
==============  =======================================  ==========================================

Method: one ``anyio.run`` event loop (asyncio). One untimed warm-up round, then ``--rounds``
rounds; in each round every operation runs a direct pass and an overlay pass over all files,
alternating which goes first. Writes go to fresh paths per round; copy-up and commit use a
fresh overlay (and freshly seeded files) per round, made untimed. Reported: the median µs per
file of each side and the median of the per-round ratios overlay/direct.

Usage::

    python benchmarks/bench_overlay.py --markdown
    python benchmarks/bench_overlay.py --backends memory --files 500 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import anyio
from fsspec.implementations.memory import MemoryFileSystem

from agentvfs.bench._system import machine_description
from agentvfs.vfs import FsspecFilesystem, LocalFilesystem, OverlayFilesystem, WorkspaceFilesystem

BACKENDS = ("memory", "local")
OPS = ("stat", "read", "read-upper", "list", "write-new", "copy-up", "commit")
DATA = b"x" * 100


@dataclass
class Result:
    backend: str
    op: str
    direct_us: float
    overlay_us: float
    ratio: float


class Stores:
    """Fresh filesystems of one kind: each call a new, empty store."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.scratch = tempfile.mkdtemp(prefix="agentvfs-bench-overlay-")

    def new(self) -> WorkspaceFilesystem:
        if self.kind == "memory":
            raw = MemoryFileSystem(global_store=False, skip_instance_cache=True)
            return FsspecFilesystem(raw, root=f"/{uuid.uuid4().hex}")
        directory = f"{self.scratch}/{uuid.uuid4().hex}"
        return LocalFilesystem(directory)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


async def _timed(calls: Awaitable[None]) -> float:
    start = time.perf_counter()
    await calls
    return time.perf_counter() - start


async def _seed(fs: WorkspaceFilesystem, directory: str, files: int) -> None:
    for i in range(files):
        await fs.write_file(f"{directory}/f{i}.txt", DATA)


async def _bench(kind: str, files: int, rounds: int) -> list[Result]:
    stores = Stores(kind)
    try:
        base = stores.new()
        await _seed(base, "data", files)
        overlay = OverlayFilesystem(base, stores.new())
        await _seed(overlay, "mine", files)  # for read-upper
        names = [f"data/f{i}.txt" for i in range(files)]
        upper_names = [f"mine/f{i}.txt" for i in range(files)]
        times: dict[str, list[tuple[float, float]]] = {op: [] for op in OPS}

        async def stat_all(fs: WorkspaceFilesystem, paths: list[str]) -> None:
            for p in paths:
                await fs.stat(p)

        async def read_all(fs: WorkspaceFilesystem, paths: list[str]) -> None:
            for p in paths:
                await fs.read_file(p)

        async def list_dir(fs: WorkspaceFilesystem, directory: str) -> None:
            # One listing covers every file; repeated so that it is timed per file as well.
            for _ in range(max(1, files // 100)):
                await fs.readdir(directory)

        async def write_all(fs: WorkspaceFilesystem, paths: list[str]) -> None:
            for p in paths:
                await fs.write_file(p, DATA)

        for round_no in range(rounds + 1):
            sides: dict[str, dict[str, float]] = {"direct": {}, "overlay": {}}
            order = ("direct", "overlay") if round_no % 2 == 0 else ("overlay", "direct")
            # Fresh stores for copy-up and commit: the base files are copied up once only.
            cu_base = stores.new()
            await _seed(cu_base, "cu", files)
            cu_direct = stores.new()
            await _seed(cu_direct, "cu", files)
            cu_overlay = OverlayFilesystem(cu_base, stores.new())
            cm_base = stores.new()
            await _seed(cm_base, "cm", files)
            cm_overlay = OverlayFilesystem(cm_base, stores.new())
            cm_names = [f"cm/f{i}.txt" for i in range(files)]
            for name in cm_names:
                await cm_overlay.write_file(name, b"y" * 100)
            cm_direct = stores.new()
            await _seed(cm_direct, "cm", files)
            cu_names = [f"cu/f{i}.txt" for i in range(files)]
            new_names = {side: [f"new{round_no}{side}/f{i}.txt" for i in range(files)] for side in sides}
            for side in order:
                fs: WorkspaceFilesystem = base if side == "direct" else overlay
                tally = sides[side]
                tally["stat"] = await _timed(stat_all(fs, names))
                tally["read"] = await _timed(read_all(fs, names))
                # Direct: files the base has; overlay: files written into the upper layer.
                tally["read-upper"] = await _timed(read_all(fs, names if side == "direct" else upper_names))
                tally["list"] = await _timed(list_dir(fs, "data"))
                tally["write-new"] = await _timed(write_all(fs, new_names[side]))
                tally["copy-up"] = await _timed(write_all(cu_direct if side == "direct" else cu_overlay, cu_names))
                if side == "direct":
                    tally["commit"] = await _timed(write_all(cm_direct, cm_names))
                else:
                    tally["commit"] = await _timed(_commit(cm_overlay))
            if round_no == 0:
                continue  # warm-up
            for op in OPS:
                times[op].append((sides["direct"][op], sides["overlay"][op]))
        results = []
        for op in OPS:
            per = files if op != "list" else max(1, files // 100)
            direct = statistics.median(d for d, _ in times[op]) / per * 1e6
            over = statistics.median(o for _, o in times[op]) / per * 1e6
            ratio = statistics.median(o / d for d, o in times[op])
            results.append(Result(kind, op, direct, over, ratio))
        return results
    finally:
        stores.close()


async def _commit(overlay: OverlayFilesystem) -> None:
    report = await overlay.commit()
    if not report.ok:
        raise RuntimeError(f"unexpected conflicts: {report.reasons}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1] if __doc__ else None)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    kinds = [k for k in args.backends.split(",") if k]
    for kind in kinds:
        if kind not in BACKENDS:
            parser.error(f"unknown backend {kind!r}: choose from {', '.join(BACKENDS)}")
    results: list[Result] = []
    for kind in kinds:
        results.extend(anyio.run(_bench, kind, args.files, args.rounds))
    if args.markdown:
        print(f"{args.files} files of 100 bytes, {args.rounds} rounds; {machine_description()}\n")
        print("| backend | op | direct µs/file | overlay µs/file | overlay/direct |")
        print("|---|---|---:|---:|---:|")
        for r in results:
            print(f"| {r.backend} | {r.op} | {r.direct_us:.1f} | {r.overlay_us:.1f} | {r.ratio:.2f}x |")
    else:
        for r in results:
            print(f"{r.backend:7} {r.op:10} direct {r.direct_us:9.1f} µs  overlay {r.overlay_us:9.1f} µs  {r.ratio:6.2f}x")
    if args.json_path:
        document: dict[str, Any] = {
            "files": args.files,
            "rounds": args.rounds,
            "results": [r.__dict__ for r in results],
        }
        with open(args.json_path, "w") as handle:
            json.dump(document, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
