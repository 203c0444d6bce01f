"""Bulk index builds (``build_index``): documents per second in this process and on a local
Dask cluster of 1, 2 and 4 workers, segment open time, and the planner on a million objects.

Builds: the English man pages on this machine (``bench_search.man_pages()``: every page under
``/usr/share/man``, gunzipped, roff stripped) are written as files to local disk (or, with
``--storage s3``, to a moto S3 server started here), then indexed into a fresh index per run.
Modes run in interleaved rounds (every mode once per round, in a rotated order), so a slow
moment of a shared machine hits all of them alike; the table gives the median round. A run's
time is ``build_index`` end to end (planning, listing, reading, building, uploading, the
manifest); the Dask clusters are started before the rounds and their start-up is shown apart.
The in-process builds run in a process of their own (the benchmark's process hosts the
clusters' schedulers).

Segment open: a segment of 20,000 documents built from the same pages, written to disk and
opened with ``Segment.open`` (median of 50 opens) beside the time to read it whole.

Planner: a synthetic fsspec filesystem lists 1,000,000 keys in a tree shaped like a data lake
(10 tenants, 1,000 projects of very unequal sizes, 1 to 24 directories each, one project with
60,000 files in one directory) without holding any data; each listing page of 1,000 entries
sleeps ``--list-latency`` (20 ms, an S3 ListObjectsV2 round trip); like S3 it also lists a
prefix flat (no delimiter, 1,000 keys a page), which the planner's bounded counts and the
tasks' own listings use, as on S3. It reports the planner's listing pages and time, the pages
all tasks list, the task count and the estimated and actual task sizes.

Usage: ``python benchmarks/bench_index_build.py [--max-docs N] [--rounds 3] [--workers 1,2,4]
[--storage local|s3] [--objects-per-task 5000] [--skip-build] [--skip-planner]``
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractFileSystem

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agentvfs.search import Segment, SourceFile, build_index, build_segment  # noqa: E402
from agentvfs.search._bulk import _list_task, local_cluster, plan_tasks  # noqa: E402
from agentvfs.search._segments import segment_name  # noqa: E402

# ------------------------------------------------------------------------------ the builds


def write_corpus(pages: list[tuple[str, str]], where: Path) -> int:
    """The pages as files below ``where``; their total bytes."""
    total = 0
    for name, text in pages:
        path = where / name.removesuffix(".gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8", "surrogatepass")
        path.write_bytes(data)
        total += len(data)
    return total


def run_builds(args: argparse.Namespace, pages: list[tuple[str, str]]) -> list[str]:
    lines: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="agentvfs-bench-index-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        options: dict[str, Any] = {}
        if args.storage == "s3":
            from agentvfs.testing import MotoServer

            moto = stack.enter_context(MotoServer())
            moto.create_bucket("bench-index")
            options = {"endpoint_url": moto.endpoint_url, "key": "testing", "secret": "testing"}
            staged = work / "pages"
            total = write_corpus(pages, staged)
            fs = moto.s3fs()
            fs.put(str(staged) + "/", "bench-index/src/", recursive=True)
            source, index_base = "s3://bench-index/src", "s3://bench-index/index"
        else:
            total = write_corpus(pages, work / "src")
            source, index_base = str(work / "src"), str(work / "index")
        # The in-process builds run in a process of their own: this one hosts the clusters'
        # schedulers, whose event loops would take the GIL from them.
        alone = stack.enter_context(ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")))
        modes: list[tuple[str, Any]] = [("in-process", alone)]
        startups: dict[str, float] = {}
        if args.workers:
            import distributed

            for n in args.workers:
                started = time.perf_counter()
                cluster = stack.enter_context(local_cluster(n))
                client = stack.enter_context(distributed.Client(cluster, set_as_default=False))  # type: ignore[no-untyped-call]
                startups[f"Dask, {n} worker{'s' if n > 1 else ''}"] = time.perf_counter() - started
                modes.append((f"Dask, {n} worker{'s' if n > 1 else ''}", client))
        times: dict[str, list[float]] = {name: [] for name, _ in modes}
        docs = files = tasks = 0
        for round in range(args.rounds):
            order = modes[round % len(modes) :] + modes[: round % len(modes)]
            for name, client in order:
                index = f"{index_base}/r{round}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
                kwargs = {
                    "storage_options": options, "index_storage_options": options,
                    "objects_per_task": args.objects_per_task,
                }  # fmt: skip
                if client is alone:
                    report = alone.submit(build_index, source, index, **kwargs).result()
                else:
                    report = build_index(source, index, client=client, **kwargs)
                times[name].append(report.seconds)
                docs, files, tasks = report.docs, report.objects, len(report.tasks)
                print(f"  round {round + 1} {name}: {report.seconds:.2f} s", file=sys.stderr)
        lines.append(
            f"Corpus: {files} man pages ({total / 1e6:.1f} MB of text, {total / max(files, 1) / 1e3:.1f} KB "
            f"a page) -> {docs} documents (long pages are chunked); {tasks} tasks of at most "
            f"{args.objects_per_task} objects; storage: {args.storage}; {os.cpu_count()} CPUs; "
            f"median of {args.rounds} interleaved rounds."
        )
        lines.append("")
        lines.append("| mode | build (s) | docs/s | files/s | cluster start (s) |")
        lines.append("|---|---:|---:|---:|---:|")
        for name, _ in modes:
            median = statistics.median(times[name])
            start = f"{startups[name]:.1f}" if name in startups else "-"
            lines.append(f"| {name} | {median:.2f} | {docs / median:,.0f} | {files / median:,.0f} | {start} |")
    return lines


def segment_open(pages: list[tuple[str, str]], target_docs: int = 20_000) -> list[str]:
    files = []
    docs = 0
    for name, text in pages:
        raw = text.encode("utf-8", "surrogatepass")
        files.append(SourceFile("/" + name, raw, len(raw)))
        docs += 1 + len(raw) // 4000  # about the chunks a page makes
        if docs >= target_docs:
            break
    started = time.perf_counter()
    data = build_segment(files)
    build = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{segment_name(data)}.seg"
        path.write_bytes(data)
        opens = []
        for _ in range(50):
            started = time.perf_counter()
            segment = Segment.open(path)
            opens.append(time.perf_counter() - started)
            segment.close()
        started = time.perf_counter()
        path.read_bytes()
        whole = time.perf_counter() - started
        with Segment.open(path) as segment:
            n_docs, n_terms = segment.n_docs, segment.n_terms
    return [
        f"Segment of {n_docs:,} documents ({len(files):,} pages, {n_terms:,} terms, {len(data) / 1e6:.1f} MB), "
        f"built in {build:.2f} s ({n_docs / build:,.0f} docs/s, {len(files) / build:,.0f} files/s, one thread "
        f"plus one compressing): Segment.open median {statistics.median(opens) * 1e3:.3f} ms, max "
        f"{max(opens) * 1e3:.3f} ms; reading the file whole takes {whole * 1e3:.1f} ms (page cache warm)."
    ]


# ------------------------------------------------------------------------------ the planner


class SyntheticFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """A tree of generated keys, listed page by page with a simulated round trip; no data."""

    protocol = "synthetic"
    cachable = False
    root_marker = ""

    def __init__(self, dirs: dict[str, tuple[list[str], int]], latency: float, page: int = 1000) -> None:
        super().__init__()
        self.dirs = dirs  # path -> (subdirectory names, number of files)
        self.latency = latency
        self.page = page
        self.calls = 0
        self._lock = threading.Lock()

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = path.strip("/")
        if path not in self.dirs:
            raise FileNotFoundError(path)
        subdirs, files = self.dirs[path]
        entries: list[dict[str, Any]] = [
            {"name": f"{path}/{d}" if path else d, "type": "directory", "size": 0} for d in subdirs
        ]
        entries += [
            {"name": f"{path}/f{i:06d}.txt", "type": "file", "size": 4500, "ETag": f"e{i}"} for i in range(files)
        ]
        pages = max(1, math.ceil(len(entries) / self.page))
        with self._lock:
            self.calls += pages
        if self.latency:
            time.sleep(self.latency * pages)
        return entries if detail else [e["name"] for e in entries]

    def invalidate_cache(self, path: str | None = None) -> None:
        return None

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:  # fmt: skip
        """Every file below ``path`` as s3fs finds them: one flat listing, 1,000 keys a page."""
        path = path.strip("/")
        if path not in self.dirs:
            raise FileNotFoundError(path)
        found = {k: {"name": k, "type": "file", "size": 4500, "ETag": "e"} for k in self._keys(path)}
        pages = max(1, math.ceil(len(found) / self.page))
        with self._lock:
            self.calls += pages
        if self.latency:
            time.sleep(self.latency * pages)
        return found if detail else sorted(found)

    def _keys(self, path: str) -> Iterator[str]:
        """Every key below the directory ``path``, in S3's (lexical) order."""
        subdirs, files = self.dirs[path]
        names = sorted([(d + "/", True) for d in subdirs] + [(f"f{i:06d}.txt", False) for i in range(files)])
        for name, is_dir in names:
            full = f"{path}/{name}" if path else name
            if is_dir:
                yield from self._keys(full.rstrip("/"))
            else:
                yield full

    def call_s3(self, method: str, **kwargs: Any) -> dict[str, Any]:
        """S3's ``list_objects_v2``, one page a call: flat, or with ``Delimiter="/"`` the files
        directly in the prefix; from ``StartAfter`` (exclusive) where given."""
        assert method == "list_objects_v2"
        path = f"{kwargs['Bucket']}/{kwargs['Prefix']}".strip("/")
        start = int(kwargs.get("ContinuationToken") or 0)
        size = int(kwargs.get("MaxKeys", 1000))
        if kwargs.get("Delimiter") == "/":
            _, files = self.dirs[path]
            keys: Iterator[str] = (f"{path}/f{i:06d}.txt" if path else f"f{i:06d}.txt" for i in range(files))
        else:
            keys = self._keys(path)
        after = kwargs.get("StartAfter")
        if after:
            after = f"{kwargs['Bucket']}/{after}".strip("/")
            keys = (k for k in keys if k > after)
        page = list(itertools.islice(keys, start, start + size + 1))
        with self._lock:
            self.calls += 1
        if self.latency:
            time.sleep(self.latency)
        more = len(page) > size
        bucket = f"{kwargs['Bucket']}/"
        return {
            "Contents": [{"Key": k.removeprefix(bucket), "Size": 4500, "ETag": '"e"'} for k in page[:size]],
            "IsTruncated": more,
            "NextContinuationToken": str(start + size) if more else None,
        }


def synthetic_tree(total: int = 1_000_000, seed: int = 7) -> dict[str, tuple[list[str], int]]:
    """10 tenants x 100 projects of unequal sizes (a heavy tail), 1 to 24 directories each,
    one project holding 60,000 files in a single directory; ``total`` files in all."""
    import random

    rng = random.Random(seed)
    dirs: dict[str, tuple[list[str], int]] = {}
    projects = [f"t{t}/p{p:03d}" for t in range(10) for p in range(100)]
    weights = [rng.paretovariate(1.2) for _ in projects]
    big = projects[137]
    remaining = total - 60_000
    scale = remaining / sum(weights)
    sizes = [max(1, int(w * scale)) for w in weights]
    sizes[-1] += remaining - sum(sizes)
    dirs[""] = ([f"t{t}" for t in range(10)], 3)
    for t in range(10):
        dirs[f"t{t}"] = ([f"p{p:03d}" for p in range(100)], 2)
    used = 3 + 20
    sizes[-1] -= used
    for project, size in zip(projects, sizes, strict=True):
        if project == big:
            dirs[project] = (["logs", "docs"], 5)
            dirs[f"{project}/logs"] = ([], 60_000)
            dirs[f"{project}/docs"] = ([], size - 5)
            continue
        n_dirs = rng.randint(1, 24)
        names = [f"d{i:02d}" for i in range(n_dirs)]
        direct = min(size, rng.randint(0, 5))
        dirs[project] = (names, direct)
        left = size - direct
        for i, name in enumerate(names):
            share = left // (n_dirs - i)
            dirs[f"{project}/{name}"] = ([], share)
            left -= share
    return dirs


def run_planner(args: argparse.Namespace) -> list[str]:
    dirs = synthetic_tree()
    files = sum(n for _, n in dirs.values())
    fs = SyntheticFileSystem(dirs, args.list_latency)
    started = time.perf_counter()
    tasks = plan_tasks(fs, "", args.objects_per_task)
    seconds = time.perf_counter() - started
    calls = fs.calls
    fs.latency = 0
    fs.calls = 0
    actual = [len(_list_task(fs, "", task)) for task in tasks]
    worker_calls = fs.calls
    estimates = [task.estimate for task in tasks]
    assert sum(actual) == files, (sum(actual), files)
    over = sorted(a for a in actual if a > args.objects_per_task)
    whole_listing = sum(max(1, math.ceil((len(s) + n) / 1000)) for s, n in dirs.values())
    flat = math.ceil(files / 1000)

    def dist(values: list[int]) -> str:
        values = sorted(values)
        return f"{values[0]:,} / {statistics.median(values):,.0f} / {values[-1]:,}"

    return [
        f"Synthetic listing: {files:,} keys in {len(dirs):,} directories; {args.list_latency * 1e3:.0f} ms per "
        "listing page of 1,000 entries; the planner keeps 16 listings in flight.",
        "",
        "| objects per task | tasks | planner time (s) | planner listing pages | the tasks' listing pages "
        "| pages to list everything: by directory / flat (one after another) | estimate min / median / max "
        "| actual min / median / max | tasks over the limit (actual) |",
        "|---:|---:|---:|---:|---:|---:|---|---|---|",
        f"| {args.objects_per_task:,} | {len(tasks):,} | {seconds:.2f} | {calls:,} | {worker_calls:,} "
        f"| {whole_listing:,} / {flat:,} ({flat * args.list_latency:.0f} s) | "
        f"{dist(estimates)} | {dist(actual)} | {len(over)}"
        + (f" (largest {over[-1]:,})" if over else "")
        + " |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--max-docs", type=int, default=0, help="man pages to index (0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4", help="Dask cluster sizes, comma-separated ('' for none)")
    parser.add_argument("--storage", choices=["local", "s3"], default="local")
    parser.add_argument("--objects-per-task", type=int, default=5000)
    parser.add_argument("--list-latency", type=float, default=0.02)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-planner", action="store_true")
    args = parser.parse_args()
    args.workers = [int(n) for n in args.workers.split(",") if n.strip()]
    out: list[str] = []
    if not args.skip_build:
        from bench_search import man_pages

        started = time.perf_counter()
        pages = man_pages()
        if args.max_docs:
            pages = pages[: args.max_docs]
        print(f"loaded {len(pages)} man pages in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        out += ["## Build", "", *run_builds(args, pages), ""]
        out += ["## Segment open", "", *segment_open(pages), ""]
    if not args.skip_planner:
        out += ["## Planner", "", *run_planner(args)]
    print("\n".join(out))


if __name__ == "__main__":
    main()
