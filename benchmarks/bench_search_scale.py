"""A workspace's search index at 20k+ files: build, reopen, update, query, quality.

The corpus is the machine's man pages (as in ``bench_search.py``), written once as text files
into a local directory. Each round, in a fresh process per tree (this checkout's ``src``, and a
baseline ``--baseline-src`` when given, alternating round by round):

* **build**: a new ``Workspace(bm25=True, auto_index_paths=["."], index_dir=...)`` and its
  ``init()`` over the whole directory (pages per second), then ``destroy()`` (which writes the
  checkpoint, timed apart);
* **reopen**: another new Workspace on the same index directory, ``init()`` (the change check:
  every file unchanged) and the first search, timed together: what an agent session pays
  before its first answer;
* **query**: ``ws.search`` p50/p95 over the NAME-line descriptions of 200 pages, after 10
  warm-up queries, and the same through ``BM25Index.search`` directly;
* **update**: ``ws.index(path, text)`` of a page with a new marker word, then the search that
  finds it (p50 of 50);
* **quality**: nDCG@10 and recall@10 of the known-item queries (a page is found when one of
  its chunks is in the top 10).

    python benchmarks/bench_search_scale.py --rounds 3 --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _corpus(where: Path, limit: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Write the man pages under ``where`` (once) and return their paths and 200 known-item
    queries (query, path)."""
    sys.path.insert(0, str(HERE))
    import bench_search

    marker = where.parent / (where.name + ".complete")  # beside it: not a page
    docs = bench_search.man_pages()
    if limit:
        docs = docs[:limit]
    paths = [name.removesuffix(".gz") + ".txt" for name, _ in docs]
    if not marker.exists() or marker.read_text() != str(len(docs)):
        shutil.rmtree(where, ignore_errors=True)
        for path, (_, text) in zip(paths, docs, strict=True):
            target = where / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        marker.write_text(str(len(docs)))
    found: list[tuple[str, str]] = []
    for path, (_, text) in zip(paths, docs, strict=True):
        at = text.find("NAME\n")
        if at < 0:
            continue
        line = text[at + 5 : at + 600].strip().split("\n")[0]
        if " - " in line and len(line.split(" - ", 1)[1].split()) >= 2:
            found.append((line.split(" - ", 1)[1].strip(), path))
    random.Random(42).shuffle(found)
    return paths, found[:200]


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One round in this process: build, reopen, queries, updates (see the module notes)."""
    import anyio

    from agentvfs import LocalFilesystem, Workspace

    corpus, index_dir = Path(spec["corpus"]), Path(spec["index_dir"])
    queries: list[tuple[str, str]] = [(q[0], q[1]) for q in spec["queries"]]
    shutil.rmtree(index_dir, ignore_errors=True)
    out: dict[str, Any] = {}

    def make() -> Workspace:
        return Workspace(
            filesystem=LocalFilesystem(corpus), bm25=True, auto_index_paths=["."], index_dir=str(index_dir)
        )

    async def run() -> None:
        ws = make()
        started = time.perf_counter()
        counts = await ws.init()
        out["build_s"] = time.perf_counter() - started
        out["files"] = counts["search"]["indexed"]
        started = time.perf_counter()
        await ws.destroy()
        out["close_s"] = time.perf_counter() - started
        ws = make()
        started = time.perf_counter()
        counts = await ws.init()
        await ws.search(queries[0][0])
        out["reopen_s"] = time.perf_counter() - started
        out["reopen_unchanged"] = counts["search"]["unchanged"]
        for query, _ in queries[:10]:
            await ws.search(query)
        latencies, gains, recalls = [], [], []
        for query, wanted in queries:
            started = time.perf_counter()
            hits = await ws.search(query, top_k=10)
            latencies.append((time.perf_counter() - started) * 1000)
            ranks = [i for i, h in enumerate(hits) if h.id.split("#chunk-")[0] == wanted]
            gains.append(1 / math.log2(ranks[0] + 2) if ranks else 0.0)
            recalls.append(1.0 if ranks else 0.0)
        out["query_p50_ms"] = statistics.median(latencies)
        out["query_p95_ms"] = sorted(latencies)[int(0.95 * len(latencies))]
        out["ndcg10"] = statistics.fmean(gains)
        out["recall10"] = statistics.fmean(recalls)
        engine = await ws._search.engine()  # type: ignore[union-attr]
        bm25 = engine.bm25
        assert bm25 is not None
        direct = []
        for query, _ in queries:
            started = time.perf_counter()
            bm25.search(query, top_k=10)
            direct.append((time.perf_counter() - started) * 1000)
        out["index_query_p50_ms"] = statistics.median(direct)
        rng = random.Random(7)
        updates, missed = [], 0
        for i in range(50):
            _, path = queries[rng.randrange(len(queries))]
            marker = f"zqxupdate{i}marker"
            text = (corpus / path).read_text()[:3000] + f"\n{marker}\n"
            started = time.perf_counter()
            await ws.index(path, text)
            hits = await ws.search(marker, top_k=3)
            updates.append((time.perf_counter() - started) * 1000)
            missed += not any(h.id == path for h in hits)
        out["update_p50_ms"] = statistics.median(updates)
        out["updates_missed"] = missed
        await ws.destroy()

    anyio.run(run)
    out["disk_mb"] = sum(f.stat().st_size for f in index_dir.iterdir()) / 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-docs", type=int, default=0, help="use at most this many pages (0: all)")
    parser.add_argument("--corpus-dir", type=Path, default=Path(tempfile.gettempdir()) / "agentvfs-man-corpus")
    parser.add_argument("--baseline-src", type=Path, help="the src directory of another checkout")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return
    paths, queries = _corpus(args.corpus_dir, args.max_docs)
    trees = {"this tree": ROOT / "src"}
    if args.baseline_src is not None:
        trees = {"baseline": args.baseline_src.resolve(), **trees}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    scratch = Path(tempfile.mkdtemp(prefix="bench-search-scale-"))
    try:
        for round_no in range(args.rounds):
            for name, src in trees.items():
                spec = {"corpus": str(args.corpus_dir), "index_dir": str(scratch / "index"), "queries": queries}
                env = {**os.environ, "PYTHONPATH": str(src)}
                done = subprocess.run(
                    [sys.executable, __file__, "--worker", json.dumps(spec)],
                    env=env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"{name} round {round_no} failed:\n{done.stderr[-3000:]}")
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {round_no + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps({"pages": len(paths), "results": results}, indent=2))
        return
    keys = [
        ("build_s", "build s", 1), ("files", "pages", 0), ("close_s", "close s (checkpoint)", 2),
        ("reopen_s", "reopen + first search s", 2), ("query_p50_ms", "ws.search p50 ms", 2),
        ("query_p95_ms", "ws.search p95 ms", 2), ("index_query_p50_ms", "BM25Index.search p50 ms", 2),
        ("update_p50_ms", "update + search p50 ms", 1), ("ndcg10", "nDCG@10", 3),
        ("recall10", "recall@10", 3), ("disk_mb", "disk MB", 0),
    ]  # fmt: skip
    print(f"{len(paths)} man pages, {args.rounds} rounds, median [min-max]\n")
    print("| figure | " + " | ".join(trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for key, label, digits in keys:
        cells = []
        for name in trees:
            values = [r[key] for r in results[name]]
            med = statistics.median(values)
            cells.append(f"{med:,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for name in trees:
        rate = statistics.median(r["files"] / r["build_s"] for r in results[name])
        print(f"\n{name}: build {rate:,.0f} pages/s")


if __name__ == "__main__":
    main()
