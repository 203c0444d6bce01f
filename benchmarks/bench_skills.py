"""Skills discovery over 1,000 skills on local disk and on moto S3, and the cost of
``maybe_refresh`` when nothing changed.

Each skill has a ~1 KB SKILL.md, one file in ``references/`` and one in ``scripts/``.
Measured per backend:

* discovery: the first ``skills.list()`` of a new Workspace (list the tree, read every
  SKILL.md, parse and validate); with ``bm25`` also indexing instructions and references;
* a baseline doing what the reference does per skill (``exists`` of SKILL.md, read it,
  ``exists`` and ``readdir`` of each of the three subdirectories, all skills concurrently);
* ``maybe_refresh`` with nothing changed: inside the 30 s cooldown (no I/O), and after it
  (``staleness_cooldown = 0``: the listings are compared, no SKILL.md is read);
* ``maybe_refresh`` after one new skill appeared (a full rediscovery).

On S3 the table also gives the requests each operation sent (botocore events).

Usage: ``python benchmarks/bench_skills.py [--skills 1000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import anyio

from agentvfs import FsspecFilesystem, LocalFilesystem, Workspace, WorkspaceFilesystem
from agentvfs.skills import WorkspaceSkills
from agentvfs.testing import MotoServer

BUCKET = "bench-skills"


def skill_files(count: int) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for i in range(count):
        name = f"skill-{i:04d}"
        body = "".join(
            f"{j}. Step {j} of {name}: check the input, then run the tool.\n" for j in range(1, 16)
        )
        out[f"skills/{name}/SKILL.md"] = (
            f"---\nname: {name}\ndescription: Skill number {i} for the benchmark.\nlicense: MIT\n"
            f"metadata:\n  owner: bench\n  index: {i}\n---\n# {name}\n\n{body}"
        ).encode()
        out[f"skills/{name}/references/guide.md"] = (
            f"# Guide for {name}\n\nDetails about step {i}.\n".encode()
        )
        out[f"skills/{name}/scripts/run.sh"] = b"#!/bin/sh\necho run\n"
    return out


class Counts:
    """File reads that reach a filesystem (read_file and batched read_many)."""

    def __init__(self, fs: WorkspaceFilesystem) -> None:
        self.reads = 0
        read_file, read_many = fs.read_file, getattr(fs, "read_many", None)

        async def counted_read_file(path: str, **options: Any) -> Any:
            self.reads += 1
            return await read_file(path, **options)

        fs.read_file = counted_read_file  # type: ignore[method-assign]
        if read_many is not None:

            async def counted_read_many(paths: Sequence[str]) -> Any:
                self.reads += len(paths)
                return await read_many(paths)

            fs.read_many = counted_read_many  # type: ignore[attr-defined]


async def naive_discovery(fs: WorkspaceFilesystem, root: str) -> int:
    """The reference's per-skill requests: exists, read, and each subdirectory's exists and
    listing, every skill concurrently."""
    loaded = 0

    async def one(name: str) -> None:
        nonlocal loaded
        skill_md = f"{root}/{name}/SKILL.md"
        if not await fs.exists(skill_md):
            return
        await fs.read_file(skill_md)
        for sub in ("references", "scripts", "assets"):
            path = f"{root}/{name}/{sub}"
            if await fs.exists(path):
                await fs.readdir(path, recursive=True)
        loaded += 1

    entries = await fs.readdir(root)
    async with anyio.create_task_group() as tg:
        for entry in entries:
            if entry.type == "directory":
                tg.start_soon(one, entry.name)
    return loaded


async def timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return samples


def row(label: str, samples: list[float], extra: str = "") -> str:
    median = statistics.median(samples) * 1000
    spread = f"{min(samples) * 1000:,.1f}–{max(samples) * 1000:,.1f}" if len(samples) > 1 else "—"
    return f"| {label} | {median:,.1f} | {spread} | {extra} |"


async def bench_backend(
    label: str,
    make_fs: Callable[[], WorkspaceFilesystem],
    count: int,
    repeat: int,
    rows: list[str],
    requests: Counter[str] | None,
    add_skill: Callable[[str, bytes], Awaitable[None]],
) -> None:
    def sent(runs: int = 1) -> str:
        """The S3 requests sent since the last call, per run."""
        if requests is None:
            return ""
        text = ", ".join(f"{k} {v // runs}" for k, v in sorted(requests.items()))
        requests.clear()
        return f"; requests: {text}" if text else "; requests: none"

    async def discover(bm25: bool) -> tuple[WorkspaceSkills, Counts]:
        fs = make_fs()
        counts = Counts(fs)
        ws = Workspace(filesystem=fs, skills=["skills"], bm25=bm25 or None)
        skills = ws.skills
        assert skills is not None
        listed = await skills.list()
        assert len(listed) >= count, len(listed)
        return skills, counts

    samples: list[float] = []
    reads = 0
    for _ in range(repeat):
        if requests is not None:
            requests.clear()
        started = time.perf_counter()
        skills, counts = await discover(False)
        samples.append(time.perf_counter() - started)
        reads = counts.reads
    rows.append(
        row(
            f"{label}: discovery of {count} skills (first list())",
            samples,
            f"{reads} files read{sent()}",
        )
    )

    indexed = await timed(lambda: discover(True), max(1, repeat // 2))
    sent()
    rows.append(
        row(
            f"{label}: discovery + BM25 indexing (SKILL.md and references)",
            indexed,
            f"{2 * count} documents",
        )
    )

    fs = make_fs()
    baseline = await timed(lambda: naive_discovery(fs, "skills"), max(1, repeat // 2))
    rows.append(
        row(
            f"{label}: baseline, per-skill exists/read/readdir (the reference's way)",
            baseline,
            sent(len(baseline)).removeprefix("; "),
        )
    )

    skills, counts = await discover(False)
    sent()
    before = counts.reads
    inside = await timed(skills.maybe_refresh, repeat)
    rows.append(
        row(
            f"{label}: maybe_refresh, nothing changed, within the cooldown",
            inside,
            f"{counts.reads - before} files read{sent()}",
        )
    )
    skills.staleness_cooldown = 0
    after = await timed(skills.maybe_refresh, repeat)
    per_call = ""
    if requests is not None:
        per_call = "; requests per call: " + ", ".join(
            f"{k} {v // repeat}" for k, v in sorted(requests.items())
        )
        requests.clear()
    rows.append(
        row(
            f"{label}: maybe_refresh, nothing changed, after the cooldown",
            after,
            f"{counts.reads - before} files read{per_call}",
        )
    )
    changed: list[float] = []
    for i in range(max(1, repeat // 2)):
        name = f"zz-new-{i}"
        await add_skill(
            f"skills/{name}/SKILL.md", f"---\nname: {name}\ndescription: new\n---\nnew\n".encode()
        )
        before = counts.reads
        started = time.perf_counter()
        await skills.maybe_refresh()
        changed.append(time.perf_counter() - started)
        assert await skills.has(name)
    rows.append(
        row(
            f"{label}: maybe_refresh after a new skill appeared",
            changed,
            f"{counts.reads - before} files read{sent()}",
        )
    )


async def main(count: int, repeat: int) -> list[str]:
    rows = [
        "| operation | median ms | min–max ms | notes |",
        "|---|---:|---|---|",
    ]
    data = skill_files(count)
    with tempfile.TemporaryDirectory(prefix="bench-skills-") as tmp:
        for rel, content in data.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)

        async def add_local(rel: str, content: bytes) -> None:
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)

        await bench_backend(
            "local", lambda: LocalFilesystem(tmp), count, repeat, rows, None, add_local
        )

    with MotoServer() as moto:
        moto.create_bucket(BUCKET)
        moto.s3fs().pipe({f"{BUCKET}/ws/{p}": b for p, b in data.items()})
        raw = moto.s3fs(use_listings_cache=False)
        raw.connect()
        requests: Counter[str] = Counter()
        raw.s3.meta.events.register(
            "before-call.s3", lambda model, **kw: requests.update([model.name])
        )

        async def add_s3(rel: str, content: bytes) -> None:
            await anyio.to_thread.run_sync(raw.pipe, f"{BUCKET}/ws/{rel}", content)
            requests.clear()

        await bench_backend(
            "s3 (moto)",
            lambda: FsspecFilesystem(raw, root=f"{BUCKET}/ws"),
            count,
            repeat,
            rows,
            requests,
            add_s3,
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skills", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    command = "python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/bench_skills.py", *sys.argv[1:]]
    )
    rows = anyio.run(main, args.skills, args.repeat)
    print(f"Skills, {args.skills} skills, {args.repeat} runs each (`{command}`)\n")
    print(
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.platform()}, Python {platform.python_version()}\n"
    )
    print("\n".join(rows))
